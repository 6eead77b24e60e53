//! Per-call cost of the Memcached plugin: through the sandbox (a fresh instance per call,
//! request JSON in, response JSON out and parsed), natively (the same reconcile code, through
//! the SDK's JSON → typed → JSON path), and as the Starlark script
//! (`plugins/memcached-star/plugin.star`, in its interpreter's instance kept between calls, in
//! the same sandbox), with 3 and with 100 observed pods.
//!
//! Run with `cargo bench -p wasmop --bench plugin_call`; the wasm/native and Starlark/wasm
//! ratios are printed at the end.

#[path = "common/memcached_request.rs"]
mod memcached_request;

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use wasmop::sandbox::{Language, Limits, Sandbox, SandboxConfig};

const POD_COUNTS: [usize; 2] = [3, 100];
const SCRIPT: &str = "plugins/memcached-star/plugin.star";

fn main() {
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        cache_dir: None,
        ..SandboxConfig::default()
    })
    .expect("sandbox");
    let plugin = sandbox
        .load_blocking(&wasm, Limits::default())
        .expect("memcached loads");
    let script = std::fs::read(test_artifacts::workspace_root().join(SCRIPT)).expect("the script");
    let star = sandbox
        .load_script_blocking(
            Language::Starlark,
            "plugin.star",
            &script,
            Limits::default(),
        )
        .expect("memcached-star loads");

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = criterion.benchmark_group("memcached_reconcile");
    for pods in POD_COUNTS {
        let req = memcached_request::request(&plugin, pods).expect("related");
        assert_eq!(req.related["Pod.v1"].len(), pods);
        group.bench_with_input(BenchmarkId::new("wasm", pods), &req, |b, req| {
            b.iter(|| plugin.reconcile_blocking(req).expect("reconcile"));
        });
        group.bench_with_input(BenchmarkId::new("starlark", pods), &req, |b, req| {
            b.iter(|| star.reconcile_blocking(req).expect("reconcile"));
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
    println!("\nmean of {RATIO_CALLS} calls after warm-up:");
    for pods in POD_COUNTS {
        let req = memcached_request::request(&plugin, pods).expect("related");
        let wasm = mean(|| {
            plugin.reconcile_blocking(&req).expect("reconcile");
        });
        let native = mean(|| {
            wasmop_guest::testing::reconcile::<memcached::MemcachedPlugin>(&req)
                .expect("reconcile");
        });
        let starlark = mean(|| {
            star.reconcile_blocking(&req).expect("reconcile");
        });
        println!(
            "  {pods:>3} pods: wasm {:>8.1} µs, native {:>8.1} µs, wasm/native {:.1}×; \
             starlark {:>8.1} µs, starlark/wasm {:.1}×",
            micros(wasm),
            micros(native),
            wasm.as_secs_f64() / native.as_secs_f64(),
            micros(starlark),
            starlark.as_secs_f64() / wasm.as_secs_f64()
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
