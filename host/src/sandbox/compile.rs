//! Where modules are compiled: in this process, or in a child process that runs the same
//! binary (`wasmop compile-plugin`), which is what `wasmop run` does.
//!
//! Compiling the Memcached plugin takes most of a CPU second and tens of MiB that the
//! allocator keeps afterwards, fragmented over the compiler's threads. In a child, that memory
//! goes back to the system when it exits, and a compile past its deadline is killed instead of
//! running on in a background thread. The child builds its engine with the host's settings and
//! hands back what `Engine::precompile_component` produced, on stdout; errors come on stderr.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The hidden subcommand a child runs.
pub const COMPILE_COMMAND: &str = "compile-plugin";
/// A module larger than this is refused by the child, as by the plugin source.
const MAX_INPUT: u64 = 64 << 20;
/// An error message kept from the child's stderr.
const MAX_ERROR: u64 = 16 << 10;

/// How a sandbox compiles modules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Compiler {
    /// On a thread of this process.
    #[default]
    InProcess,
    /// In a child process: this program, run with [`COMPILE_COMMAND`].
    Subprocess(PathBuf),
}

/// Compiles `wasm` in a child `program`, killed after `timeout`; the child's engine is built
/// with `max_instances` like the caller's, so what it returns fits the caller's engine.
pub(crate) fn in_child(
    program: &Path,
    max_instances: u32,
    wasm: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let mut child = Command::new(program)
        .args([
            COMPILE_COMMAND,
            "--max-instances",
            &max_instances.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the compiler {}: {e}", program.display()))?;
    let deadline = Instant::now() + timeout;
    // Each pipe on its own thread, so a full one never stalls the others.
    let mut stdin = child.stdin.take().expect("piped");
    let input = wasm.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).map(|_| out)
    });
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = (&mut stderr).take(MAX_ERROR).read_to_string(&mut out);
        // Drain the rest, so the child never blocks on a full pipe.
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        out
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "compiling took longer than {timeout:?}; the compiler was stopped"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for the compiler: {e}")),
        }
    };
    let _ = writer.join();
    let artifact = reader
        .join()
        .map_err(|_| "the compiler's output reader panicked".to_string())?
        .map_err(|e| format!("reading the compiler's output: {e}"))?;
    let message = errors.join().unwrap_or_default();
    if !status.success() {
        let message = message.trim();
        return Err(if message.is_empty() {
            format!("the compiler failed ({status})")
        } else {
            message.to_owned()
        });
    }
    Ok(artifact)
}

/// The child's side: reads a module on stdin, compiles it for an engine set up like the
/// host's, and writes the artifact to stdout. An error goes to stderr, as the error's chain.
pub fn serve(max_instances: u32) -> Result<(), String> {
    let mut wasm = Vec::new();
    std::io::stdin()
        .take(MAX_INPUT + 1)
        .read_to_end(&mut wasm)
        .map_err(|e| format!("reading the module: {e}"))?;
    if wasm.len() as u64 > MAX_INPUT {
        return Err(format!("a module larger than {} MiB", MAX_INPUT >> 20));
    }
    let engine = super::engine::new_engine(max_instances).map_err(|e| e.to_string())?;
    let artifact = engine
        .precompile_component(&wasm)
        .map_err(|e| super::invoke::error_chain(&e))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&artifact)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the artifact: {e}"))
}
