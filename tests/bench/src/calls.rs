//! The cost of one plugin call, in process: the Memcached reconcile through the sandbox (a
//! fresh instance per call, JSON in and out) against the same code natively (the SDK's JSON
//! path), with 3 and with 100 observed pods. The same measurement as
//! `host/benches/plugin_call.rs`, without criterion, so the runner can report it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wasmop::sandbox::{Limits, Sandbox, SandboxConfig};
use wasmop_guest::wire::WireRequest;

// The same request the host's `plugin_call` benchmark times.
#[path = "../../../host/benches/common/memcached_request.rs"]
mod memcached_request;

/// The pod counts measured.
pub const POD_COUNTS: [usize; 2] = [3, 100];

/// Mean cost of one call at one pod count.
#[derive(Debug, Clone, Copy)]
pub struct CallCost {
    /// Observed pods in the request.
    pub pods: usize,
    /// Through the sandbox.
    pub sandbox: Duration,
    /// Natively.
    pub native: Duration,
    /// What the sandbox's freed slots kept resident after the calls (one slot: they ran one
    /// at a time).
    pub kept: usize,
}

/// Times `calls` calls of each kind per pod count (after a tenth as many to warm up).
/// Blocking: run it off the async runtime.
pub fn measure(wasm: &Path, calls: u32) -> Result<Vec<CallCost>> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let sandbox = sandbox()?;
    let plugin = sandbox.load_blocking(&bytes, Limits::default())?;
    POD_COUNTS
        .iter()
        .map(|&pods| {
            let req = memcached_request::request(&plugin, pods)?;
            let sandboxed = sandbox_mean(&plugin, &req, calls)?;
            let kept = sandbox.pool_resident_bytes();
            let native = mean(calls, || {
                wasmop_guest::testing::reconcile::<memcached::MemcachedPlugin>(&req)
                    .map(drop)
                    .map_err(anyhow::Error::msg)
            })?;
            Ok(CallCost {
                pods,
                sandbox: sandboxed,
                native,
                kept,
            })
        })
        .collect()
}

/// The `-C opt-level` the repository builds plugins at (`.cargo/config.toml`).
pub const SHIPPED: &str = "2";

/// One build of the Memcached plugin at an optimisation level: its size and its cost per
/// call through the sandbox.
#[derive(Debug, Clone)]
pub struct OptBuild {
    /// rustc's `-C opt-level`.
    pub level: String,
    /// The module's size.
    pub bytes: usize,
    /// What `wasmop package` stores in the ConfigMap (gzipped when smaller).
    pub stored: usize,
    /// Mean sandbox call per [`POD_COUNTS`] entry.
    pub calls: Vec<Duration>,
}

/// Builds the Memcached plugin once per level in `levels` (`shipped` is the one the
/// repository builds, reused as is) and times `calls` sandbox calls of each. Blocking.
pub fn opt_levels(shipped: &Path, levels: &[&str], calls: u32) -> Result<Vec<OptBuild>> {
    let sandbox = sandbox()?;
    let mut out = Vec::new();
    for &level in levels {
        let wasm = if level == SHIPPED {
            shipped.to_path_buf()
        } else {
            build_at(level)?
        };
        let bytes = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
        let stored = wasmop::plugin::package::package(&bytes, "memcached", "bench", None)?.stored;
        let plugin = sandbox.load_blocking(&bytes, Limits::default())?;
        let calls = POD_COUNTS
            .iter()
            .map(|&pods| {
                let req = memcached_request::request(&plugin, pods)?;
                sandbox_mean(&plugin, &req, calls)
            })
            .collect::<Result<_>>()?;
        out.push(OptBuild {
            level: level.to_owned(),
            bytes: bytes.len(),
            stored,
            calls,
        });
    }
    Ok(out)
}

/// `cargo build` of the plugin with `-C opt-level=<level>` into a target directory of its own;
/// the other flags are the repository's for wasm (`.cargo/config.toml`).
fn build_at(level: &str) -> Result<PathBuf> {
    let target = crate::artifacts::bench_dir().join(format!("opt-{level}"));
    let status = crate::artifacts::cargo()
        .current_dir(crate::artifacts::root())
        .args([
            "build",
            "-q",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            "memcached",
        ])
        .arg("--target-dir")
        .arg(&target)
        .env(
            "CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS",
            format!("-C opt-level={level} -C codegen-units=1 -C strip=symbols"),
        )
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("building the plugin at opt-level {level}: {status}");
    }
    Ok(target.join("wasm32-wasip2/release/memcached.wasm"))
}

/// A sandbox for timing: no compile cache, so every build is compiled as measured.
fn sandbox() -> Result<Sandbox> {
    Ok(Sandbox::new(SandboxConfig {
        max_instances: 4,
        cache_dir: None,
        ..SandboxConfig::default()
    })?)
}

/// Mean sandbox call of `plugin` on `req`.
fn sandbox_mean(
    plugin: &wasmop::sandbox::Plugin,
    req: &WireRequest,
    calls: u32,
) -> Result<Duration> {
    mean(calls, || {
        plugin
            .reconcile_blocking(req)
            .map(drop)
            .map_err(anyhow::Error::from)
    })
}

fn mean(calls: u32, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    for _ in 0..calls.div_ceil(10) {
        f()?;
    }
    let start = Instant::now();
    for _ in 0..calls {
        f()?;
    }
    Ok(start.elapsed() / calls.max(1))
}
