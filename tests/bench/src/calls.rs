//! The cost of one plugin call, in process: the Memcached reconcile through the sandbox (a
//! fresh instance per call, JSON in and out) against the same code natively (the SDK's JSON
//! path), with 3 and with 100 observed pods. The same measurement as
//! `host/benches/plugin_call.rs`, without criterion, so the runner can report it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use wasmop::sandbox::{Limits, Sandbox, SandboxConfig};

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
}

/// Times `calls` calls of each kind per pod count (after a tenth as many to warm up).
/// Blocking: run it off the async runtime.
pub fn measure(wasm: &Path, calls: u32) -> Result<Vec<CallCost>> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        cache_dir: None,
        ..SandboxConfig::default()
    })?;
    let plugin = sandbox.load_blocking(&bytes, Limits::default())?;
    POD_COUNTS
        .iter()
        .map(|&pods| {
            let req = memcached_request::request(&plugin, pods)?;
            let sandboxed = mean(calls, || {
                plugin
                    .reconcile_blocking(&req)
                    .map(drop)
                    .map_err(anyhow::Error::from)
            })?;
            let native = mean(calls, || {
                wasmop_guest::testing::reconcile::<memcached::MemcachedPlugin>(&req)
                    .map(drop)
                    .map_err(anyhow::Error::msg)
            })?;
            Ok(CallCost {
                pods,
                sandbox: sandboxed,
                native,
            })
        })
        .collect()
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
