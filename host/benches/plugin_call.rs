//! Per-call cost of the Memcached plugin: through the sandbox (a fresh instance per call,
//! request JSON in, response JSON out and parsed) and natively (the same reconcile code, through
//! the SDK's JSON → typed → JSON path), with 3 and with 100 observed pods.
//!
//! Run with `cargo bench -p wasmop --bench plugin_call`; the wasm/native ratios are printed at
//! the end.

#[path = "../tests/common/guests.rs"]
mod guests;

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use serde_json::{Value, json};
use wasmop::gather::{self, ObjectList};
use wasmop::sandbox::{Limits, Plugin, Sandbox, SandboxConfig};
use wasmop::validate::Scope;
use wasmop_guest::wire::WireRequest;

const POD_COUNTS: [usize; 2] = [3, 100];

/// The request the host would build for a 3-replica Memcached with `pods` matching pods.
fn request(plugin: &Plugin, pods: usize) -> WireRequest {
    let cr = json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "mc", "namespace": "bench", "uid": "u-mc", "generation": 1},
        "spec": {"size": 3}
    });
    let selectors = plugin.related_blocking(&cr).expect("related");
    let labels = selectors[0]
        .selector
        .match_labels
        .clone()
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
    gather::request(
        plugin.manifest(),
        &cr,
        Scope::Namespaced,
        &selectors,
        &ObjectList::new(observed),
        &Value::Null,
        false,
    )
}

fn main() {
    let wasm = guests::read(guests::memcached());
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        cache_dir: None,
    })
    .expect("sandbox");
    let plugin = sandbox
        .load_blocking(&wasm, Limits::default())
        .expect("memcached loads");

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = criterion.benchmark_group("memcached_reconcile");
    for pods in POD_COUNTS {
        let req = request(&plugin, pods);
        assert_eq!(req.related["Pod.v1"].len(), pods);
        group.bench_with_input(BenchmarkId::new("wasm", pods), &req, |b, req| {
            b.iter(|| plugin.reconcile_blocking(req).expect("reconcile"));
        });
        group.bench_with_input(BenchmarkId::new("native", pods), &req, |b, req| {
            b.iter(|| {
                wasmop_guest::testing::reconcile::<memcached::MemcachedPlugin>(req)
                    .expect("reconcile")
            });
        });
    }
    group.finish();
    criterion.final_summary();

    // Criterion reports each side alone; the ratio is the number that matters here.
    println!("\nwasm / native, mean of {RATIO_CALLS} calls after warm-up:");
    for pods in POD_COUNTS {
        let req = request(&plugin, pods);
        let wasm = mean(|| {
            plugin.reconcile_blocking(&req).expect("reconcile");
        });
        let native = mean(|| {
            wasmop_guest::testing::reconcile::<memcached::MemcachedPlugin>(&req)
                .expect("reconcile");
        });
        println!(
            "  {pods:>3} pods: wasm {:>8.1} µs, native {:>8.1} µs, ratio {:.1}×",
            micros(wasm),
            micros(native),
            wasm.as_secs_f64() / native.as_secs_f64()
        );
    }
}

const RATIO_CALLS: u32 = 500;

fn mean(mut f: impl FnMut()) -> Duration {
    for _ in 0..RATIO_CALLS / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..RATIO_CALLS {
        f();
    }
    start.elapsed() / RATIO_CALLS
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
