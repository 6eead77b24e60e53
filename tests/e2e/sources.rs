//! Plugin ConfigMaps whose `.wasm.gz` inflates to 64 MiB, next to Memcached on one host: the
//! host checks a module's first bytes before inflating the rest, inflates modules under one
//! budget, and keeps nothing of a module that failed to load, so a handful of small
//! ConfigMaps cannot hold the host's memory, and Memcached goes on reconciling.

use std::collections::BTreeMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use support::{Env, rss_mib, wait_event};

/// What each module inflates to: the most a module may be.
const INFLATED: usize = 64 << 20;

/// How much the host's resident memory may grow over five failed 64 MiB modules and one
/// refused at its first bytes. What may legitimately stay is allocator slack, thread stacks
/// and the Events and watch buffers of six ConfigMaps: a few MiB. The defect kept each failed
/// module inflated, 64 MiB per ConfigMap (over 300 MiB here); one module's worth held by
/// mistake passes half of it.
const RSS_GROWTH_MIB: u64 = 32;

/// The peak may hold, besides the baseline, one module under the load budget
/// (`config::MODULE_BUDGET_MIB`, 64 MiB) and the copy the sandbox pipes to its compiler child
/// (64 MiB), with room for the compile's and the runtime's own buffers. Six modules inflated
/// at once, as nothing bounded before, reach 384 MiB.
const PEAK_GROWTH_MIB: u64 = 192;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Puts plugin ConfigMap `name` with `gz` under its key `<name>.wasm.gz`, granting nothing:
/// these fail before any RBAC check.
async fn put_gz(env: &Env, name: &str, gz: &[u8]) {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "wasmop.io/plugin".to_string(),
                String::new(),
            )])),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(
            format!("{name}.wasm.gz"),
            ByteString(gz.to_vec()),
        )])),
        ..Default::default()
    };
    let api: Api<ConfigMap> = env.ns.api();
    api.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&cm))
        .await
        .expect("apply the ConfigMap");
}

#[tokio::test(flavor = "multi_thread")]
async fn gzip_bombs_leave_the_hosts_memory_as_it_was_while_memcached_reconciles() {
    let (env, host) = Env::with_memcached("e2e-sources").await;
    env.memcached_ready("cache", 1).await;
    // The first reconcile's and load's buffers settle.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let (_, before) = rss_mib(host.pid());

    // A component's header, then garbage: it passes the first-bytes check and fails to
    // compile. Zeros fail the first-bytes check.
    let mut garbage = vec![0xa5u8; INFLATED];
    garbage[..8].copy_from_slice(b"\0asm\x0d\0\x01\0");
    let garbage = gzip(&garbage);
    let zeros = gzip(&vec![0u8; INFLATED]);
    println!(
        "each module is stored in {} KiB (garbage) and {} KiB (zeros), inflating to {} MiB",
        garbage.len() >> 10,
        zeros.len() >> 10,
        INFLATED >> 20
    );
    let bombs: Vec<String> = (0..5).map(|i| format!("bomb-{i}")).collect();
    for name in &bombs {
        put_gz(&env, name, &garbage).await;
    }
    put_gz(&env, "zeros", &zeros).await;

    let mut messages = Vec::new();
    for name in bombs.iter().map(String::as_str).chain(["zeros"]) {
        let event = wait_event(&env, "ConfigMap", name, "LoadFailed").await;
        messages.push((name, event.message.unwrap_or_default()));
    }
    // The Event is written after the load ended; let its last buffers go.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (peak, after) = rss_mib(host.pid());
    println!(
        "measured: host RSS {before} MiB before, {after} MiB after six failed loads of 64 MiB modules (peak {peak} MiB)"
    );
    assert!(
        after <= before + RSS_GROWTH_MIB,
        "nothing of a failed module stays: RSS {before} -> {after} MiB (bound +{RSS_GROWTH_MIB})\nhost log:\n{}",
        host.logs()
    );
    assert!(
        peak <= before + PEAK_GROWTH_MIB,
        "the modules were inflated under the budget: peak {peak} MiB, {before} MiB before (bound +{PEAK_GROWTH_MIB})"
    );

    // The zeros were refused at their first bytes, naming the ConfigMap, its key and what
    // they inflate to; the garbage got as far as the compiler.
    for (name, message) in &messages {
        if *name == "zeros" {
            assert!(
                message.contains("ConfigMap zeros, binaryData key zeros.wasm.gz: inflates to 00 00 00 00 first, not WebAssembly"),
                "{message}"
            );
        } else {
            assert!(!message.contains("first, not WebAssembly"), "{message}");
        }
    }

    // Memcached was not disturbed.
    env.memcached_ready("cache", 2).await;
}
