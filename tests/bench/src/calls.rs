//! The cost of one plugin call, in process: the Memcached reconcile through the sandbox (a
//! fresh instance per call, JSON in and out) against the same code natively (the SDK's JSON
//! path), with 3 and with 100 observed pods. The same measurement as
//! `host/benches/plugin_call.rs`, without criterion, so the runner can report it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use wasmop::gather::{self, ObjectList};
use wasmop::sandbox::{Limits, Plugin, Sandbox, SandboxConfig};
use wasmop::validate::Scope;
use wasmop_guest::wire::WireRequest;

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
    })?;
    let plugin = sandbox.load_blocking(&bytes, Limits::default())?;
    POD_COUNTS
        .iter()
        .map(|&pods| {
            let req = request(&plugin, pods)?;
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

/// The request the host would build for a 3-replica Memcached with `pods` matching pods.
fn request(plugin: &Plugin, pods: usize) -> Result<WireRequest> {
    let cr = json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "mc", "namespace": "bench", "uid": "u-mc", "generation": 1},
        "spec": {"size": 3}
    });
    let selectors = plugin.related_blocking(&cr)?;
    let labels = selectors
        .first()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let mut observed: Vec<Value> = (0..pods)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": format!("mc-{i:03}"), "namespace": "bench", "labels": labels,
                    "uid": format!("pod-uid-{i}"), "resourceVersion": "12345",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "mc-5d4f8", "uid": "rs-uid", "controller": true}]
                },
                "spec": {"containers": [{"name": "memcached", "image": "memcached:1.4.36-alpine"}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1"}
            })
        })
        .collect();
    observed.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "mc", "namespace": "bench",
            "ownerReferences": [{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "name": "mc", "uid": "u-mc", "controller": true}]},
        "spec": {"replicas": 3},
        "status": {"availableReplicas": 3}
    }));
    Ok(gather::request(
        plugin.manifest(),
        &cr,
        Scope::Namespaced,
        &selectors,
        &ObjectList::new(observed),
        &Value::Null,
        false,
    ))
}
