//! Where modules are compiled: in this process, or in a child process that runs the same
//! binary (`wasmop compile-plugin`), which is what `wasmop run` does.
//!
//! Compiling the Memcached plugin takes most of a CPU second and tens of MiB that the
//! allocator keeps afterwards, fragmented over the compiler's threads. In a child, that memory
//! goes back to the system when it exits, and a compile past its deadline is killed instead of
//! running on in a background thread. The child builds its engine with the host's settings and
//! hands back what `Engine::precompile_component` produced, on stdout or in a file; errors come
//! on stderr. A script plugin's interpreter compiles there like any module (`script.rs`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::functions::FunctionCache;

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

/// How a sandbox compiles what its cache lacks.
pub(crate) struct Compiling {
    pub(crate) compiler: Compiler,
    /// The engine's pool size, which a child's engine must share.
    pub(crate) max_instances: u32,
    /// A child compiling longer is killed.
    pub(crate) timeout: Duration,
    /// Compiled functions, which the engine (or the child's) compiles through.
    pub(crate) functions: Option<Arc<FunctionCache>>,
}

/// Compiles `wasm` in a child `program`, killed after `c.timeout`; the child's engine is built
/// like the caller's (`c.max_instances`, `c.functions`), so what it returns fits the caller's
/// engine. The artifact comes back as bytes, or is written to `out` when given: the Starlark
/// interpreter compiles to about 16 MB that need never be in this process's heap.
pub(crate) fn in_child(
    c: &Compiling,
    program: &Path,
    wasm: &[u8],
    out: Option<&Path>,
) -> wasmtime::Result<Vec<u8>> {
    let mut cmd = Command::new(program);
    cmd.args([
        COMPILE_COMMAND,
        "--max-instances",
        &c.max_instances.to_string(),
    ]);
    if let Some(functions) = &c.functions {
        cmd.arg("--functions")
            .arg(functions.root())
            .args(["--functions-max-bytes", &functions.max_bytes().to_string()]);
    }
    if let Some(out) = out {
        cmd.arg("--out").arg(out);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| wasmtime::format_err!("starting the compiler {}: {e}", program.display()))?;
    let deadline = Instant::now() + c.timeout;
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Each pipe on its own thread, so a full one never stalls the others; scoped, so the
    // module is written from where it lies.
    let (status, artifact, message) = std::thread::scope(|scope| {
        let writer = scope.spawn(move || stdin.write_all(wasm));
        let reader = scope.spawn(move || {
            let mut out = Vec::new();
            stdout.read_to_end(&mut out).map(|_| out)
        });
        let errors = scope.spawn(move || {
            let mut out = String::new();
            let _ = (&mut stderr).take(MAX_ERROR).read_to_string(&mut out);
            // Drain the rest, so the child never blocks on a full pipe.
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            out
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(format!(
                        "compiling took longer than {:?}; the compiler was stopped",
                        c.timeout
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => break Err(format!("waiting for the compiler: {e}")),
            }
        };
        let _ = writer.join();
        let artifact = reader.join();
        let message = errors.join().unwrap_or_default();
        (status, artifact, message)
    });
    let status = status.map_err(wasmtime::Error::msg)?;
    let artifact = artifact
        .map_err(|_| wasmtime::Error::msg("the compiler's output reader panicked"))?
        .map_err(|e| wasmtime::format_err!("reading the compiler's output: {e}"))?;
    if status.success() {
        // The child's one line on the function cache.
        if let Some(line) = message.lines().next() {
            tracing::debug!(compiler = line, "compiled in a child");
        }
    } else {
        let message = message.trim();
        return Err(if message.is_empty() {
            wasmtime::format_err!("the compiler failed ({status})")
        } else {
            wasmtime::Error::msg(message.to_owned())
        });
    }
    Ok(artifact)
}

/// What a child is asked to make: its engine's settings and where it writes.
pub struct Order<'a> {
    /// The host's pool size.
    pub max_instances: u32,
    /// The host's cache directory and what its `functions.pack` may hold.
    pub functions: Option<(&'a Path, u64)>,
    /// Where the artifact goes; stdout when `None`.
    pub out: Option<&'a Path>,
}

/// The child's side: reads a module on stdin, compiles it for an engine set up like the
/// host's (through the function cache in `functions`, bounded to the bytes given, when set),
/// and writes the artifact to `out`, else to stdout. On success stderr has one line saying
/// what the function cache gave.
pub fn serve(order: &Order<'_>) -> Result<(), String> {
    let mut input = Vec::new();
    std::io::stdin()
        .take(MAX_INPUT + 1)
        .read_to_end(&mut input)
        .map_err(|e| format!("reading the input: {e}"))?;
    if input.len() as u64 > MAX_INPUT {
        return Err(format!("an input larger than {} MiB", MAX_INPUT >> 20));
    }
    let functions = order
        .functions
        .map(|(dir, max)| Arc::new(FunctionCache::new(dir, max)));
    let engine = super::engine::new_engine(order.max_instances, functions.clone())
        .map_err(|e| e.to_string())?;
    let artifact = engine
        .precompile_component(&input)
        .map_err(|e| super::invoke::error_chain(&e))?;
    let counts = functions.map(|f| f.finish());
    if let Some((found, compiled)) = counts {
        eprintln!("{found} functions from the function cache, {compiled} compiled into it");
    }
    match order.out {
        Some(path) => std::fs::write(path, &artifact)
            .map_err(|e| format!("writing the artifact to {}: {e}", path.display())),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&artifact)
                .and_then(|()| out.flush())
                .map_err(|e| format!("writing the artifact: {e}"))
        }
    }
}
