//! What one more script plugin costs a host in memory: the resident set after loading and
//! calling the Starlark Memcached, then after loading and calling more versions of it (each
//! a different script, each in an instance of its own), with a child compiler and a disk cache as
//! `wasmop run` has. The Rust module is measured the same way beside it, its versions made
//! distinct with a custom section.
//!
//! Run with `cargo bench -p wasmop --bench script_memory`; it prints the resident set at each
//! step and the marginal MiB per plugin.

#[path = "common/memcached_request.rs"]
mod memcached_request;

use wasmop::sandbox::{Compiler, Language, Limits, Plugin, Sandbox, SandboxConfig};

const SCRIPT: &str = "plugins/memcached-star/plugin.star";
/// Plugins of each kind loaded in all.
const PLUGINS: usize = 8;
/// Calls to each plugin at each pod count, so that its code and memory are touched as a
/// working host's are.
const CALLS: usize = 50;

fn main() {
    let cache = std::env::temp_dir().join(format!("wasmop-script-memory-{}", std::process::id()));
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 8,
        cache_dir: Some(cache.clone()),
        compiler: Compiler::Subprocess(env!("CARGO_BIN_EXE_wasmop").into()),
        ..SandboxConfig::default()
    })
    .expect("sandbox");
    let script =
        std::fs::read_to_string(test_artifacts::workspace_root().join(SCRIPT)).expect("the script");
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);

    println!("resident set, MiB (VmRSS of this process; compiles run in a child):");
    let start = rss_mib();
    println!("  sandbox only: {start:.1}");
    let scripts = measure("Starlark", &sandbox, |i| {
        let source = format!("{script}\n# version {i}\n");
        sandbox
            .load_script_blocking(
                Language::Starlark,
                "plugin.star",
                source.as_bytes(),
                Limits::default(),
            )
            .expect("the script loads")
    });
    let modules = measure("Rust module", &sandbox, |i| {
        // A custom section at the end: another digest, the same code.
        let mut version = wasm.clone();
        let name = b"version";
        let payload = [&[name.len() as u8][..], name, &[i as u8]].concat();
        version.push(0);
        version.push(payload.len() as u8);
        version.extend_from_slice(&payload);
        sandbox
            .load_blocking(&version, Limits::default())
            .expect("the module loads")
    });
    println!(
        "marginal per plugin: Starlark {scripts:.2} MiB, Rust module {modules:.2} MiB \
         ({PLUGINS} of each, {CALLS} calls each at 3 and at 100 pods)"
    );
    let _ = std::fs::remove_dir_all(&cache);
}

/// Loads `PLUGINS` plugins with `load` and calls each; the resident set after the first and
/// after the last, and the MiB each one after the first added.
fn measure(what: &str, sandbox: &Sandbox, load: impl Fn(usize) -> Plugin) -> f64 {
    let mut kept = Vec::new();
    let mut first = 0.0;
    for i in 0..PLUGINS {
        let plugin = load(i);
        for pods in [3, 100] {
            let req = memcached_request::request(&plugin, pods).expect("related");
            for _ in 0..CALLS {
                plugin.reconcile_blocking(&req).expect("reconcile");
            }
        }
        kept.push(plugin);
        let rss = rss_mib();
        println!(
            "  {what}, {} loaded and called: {rss:.1} (anonymous {:.1}, file {:.1}, shared \
             memory {:.1}; pool slots keep {:.1})",
            i + 1,
            status_mib("RssAnon:"),
            status_mib("RssFile:"),
            status_mib("RssShmem:"),
            sandbox.pool_resident_bytes() as f64 / f64::from(1 << 20)
        );
        if i == 0 {
            first = rss;
        }
    }
    (rss_mib() - first) / (PLUGINS - 1) as f64
}

fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// A `/proc/self/status` field given in kB, in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
        / 1024.0
}
