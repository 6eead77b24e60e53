//! What loading a plugin from a registry costs against loading it from a ConfigMap: the
//! Memcached module stored as `wasmop package` stores it (gzipped) and inflated, against the
//! same module pulled by digest from a real registry on loopback (Debian's `docker-registry`,
//! as the tests start it), its cosign signature checked. Each load then compiles in a fresh
//! sandbox with no cache, as a host's first load does; the two alternate, so drift in the
//! machine falls on both.
//!
//! Then what the pull holds in memory: the peak resident set (`VmHWM`, reset before each) while
//! a large module is pulled, against its size, and while a blob far past the cap is asked for
//! under a manifest that understates it; and what a restart's load from the disk cache of
//! pulled modules costs against the pull it saves.
//!
//! Run with `cargo bench -p wasmop --bench registry_load`; it prints the median of each and
//! their ratio.

use std::io::Read;
use std::time::{Duration, Instant};

use support::registry::TestRegistry;
use wasmop::plugin::oci::{
    Digest, Entry, Limits as OciLimits, ModuleCache, OciClient, Reference, Requirement, SigningKey,
    access,
};
use wasmop::plugin::package::package;
use wasmop::sandbox::{Limits, Sandbox, SandboxConfig};

/// Loads of each kind.
const ROUNDS: usize = 15;

fn main() {
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
    let packaged = package(&wasm, "memcached", "bench", None).expect("packaged");
    let stored = packaged
        .configmap
        .binary_data
        .as_ref()
        .and_then(|d| d.get(&packaged.key))
        .expect("the stored module")
        .0
        .clone();

    let registry = TestRegistry::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let reference: Reference = format!("{}:bench", registry.reference("plugins/memcached"))
        .parse()
        .expect("a reference");
    let (key, _) = SigningKey::generate();
    let keys = [key.public_key()];
    let pinned = runtime.block_on(async {
        let client = OciClient::new(&reference, None, OciLimits::default()).expect("a client");
        let digest = client.push(&reference, &wasm).await.expect("pushed");
        client
            .sign(&reference, &digest, &key)
            .await
            .expect("signed");
        reference.pinned(digest)
    });

    let mut from_configmap = Vec::new();
    let mut from_registry = Vec::new();
    let mut fetch_only = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut module = Vec::new();
        flate2::read::GzDecoder::new(&stored[..])
            .read_to_end(&mut module)
            .expect("gunzip");
        compile(&module);
        from_configmap.push(started.elapsed());

        let started = Instant::now();
        let module = runtime.block_on(async {
            let client = OciClient::new(&pinned, None, OciLimits::default()).expect("a client");
            let manifest = pinned.digest.clone().expect("pinned");
            client
                .verify(&pinned, &manifest, &keys)
                .await
                .expect("verified");
            client.pull(&pinned).await.expect("pulled").module
        });
        fetch_only.push(started.elapsed());
        compile(&module);
        from_registry.push(started.elapsed());
    }
    let (cm, oci, fetch) = (
        median(&mut from_configmap),
        median(&mut from_registry),
        median(&mut fetch_only),
    );
    println!(
        "Memcached ({} bytes, {} stored), median of {ROUNDS} loads each:",
        wasm.len(),
        stored.len()
    );
    println!("  from a ConfigMap (inflate, compile):         {cm:>10.1?}");
    println!("  from a registry (verify, pull, compile):     {oci:>10.1?}");
    println!("    of which verify and pull:                  {fetch:>10.1?}");
    println!(
        "  registry / ConfigMap:                        {:>9.2}x",
        oci.as_secs_f64() / cm.as_secs_f64()
    );

    // A restart: the pinned module read from the disk cache (checked against its digest)
    // instead of verified and pulled.
    let dir = std::env::temp_dir().join(format!("wasmop-bench-modules-{}", std::process::id()));
    let cache = ModuleCache::new(Some(&dir), 64 << 20);
    let manifest = pinned.digest.clone().expect("pinned");
    let pulled_as = access(&pinned.registry, &pinned.repository, None);
    cache.store(
        &manifest,
        &wasm,
        Entry::new(
            &Digest::of(&wasm),
            "application/wasm",
            wasm.len() as u64,
            pulled_as.clone(),
            Some(keys[0].fingerprint()),
        ),
    );
    let mut from_cache = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let entry = cache
            .entry(&manifest, &Requirement::Signed(&keys), Some(&pulled_as))
            .expect("kept");
        assert_eq!(cache.read(&manifest, &entry).expect("read"), wasm);
        from_cache.push(started.elapsed());
    }
    let cached = median(&mut from_cache);
    println!("  a restart's read from the disk cache:        {cached:>10.1?}");
    println!(
        "    against verify and pull:                   {:>9.2}x",
        cached.as_secs_f64() / fetch.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);

    memory_during_pull(&runtime, &registry);
}

/// Peak resident memory while a large module is pulled, and while a blob past the cap is
/// asked for: the pull holds the module once, and nothing past the cap.
fn memory_during_pull(runtime: &tokio::runtime::Runtime, registry: &TestRegistry) {
    const MIB: usize = 1 << 20;
    let large = 48 * MIB;
    let module = test_artifacts::noise(large);
    let reference: Reference = format!("{}:large", registry.reference("plugins/large"))
        .parse()
        .expect("a reference");
    let huge = test_artifacts::noise(256 * MIB);
    let (pinned, huge_digest) = runtime.block_on(async {
        let client = OciClient::new(&reference, None, OciLimits::default()).expect("a client");
        let digest = client.push(&reference, &module).await.expect("pushed");
        // The huge blob is stored as a module of another manifest; only its layer is asked for.
        let other: Reference = format!("{}:huge", registry.reference("plugins/huge"))
            .parse()
            .unwrap();
        client.push(&other, &huge).await.expect("pushed");
        (reference.pinned(digest), Digest::of(&huge))
    });
    drop(huge);
    let limits = OciLimits::default();
    let cap_mib = limits.blob_bytes as usize / MIB;

    reset_peak();
    let before = resident_mib();
    let pulled = runtime.block_on(async {
        let client = OciClient::new(&pinned, None, limits).expect("a client");
        client.pull(&pinned).await.expect("pulled")
    });
    let peak = peak_mib();
    assert_eq!(pulled.module.len(), large);
    drop(pulled);
    println!("Memory during a pull (peak resident growth; blob cap {cap_mib} MiB):");
    println!(
        "  a {} MiB module:                             {:>6} MiB ({:.2}x the module)",
        large / MIB,
        peak - before,
        (peak - before) as f64 / (large / MIB) as f64
    );

    // A manifest that says 16 MiB of a 256 MiB blob: refused at the answer's head.
    let other: Reference = format!("{}:huge", registry.reference("plugins/huge"))
        .parse()
        .unwrap();
    reset_peak();
    let before = resident_mib();
    let err = runtime.block_on(async {
        let client = OciClient::new(&other, None, limits).expect("a client");
        client
            .blob(&other, &huge_digest, 16 * MIB as u64)
            .await
            .expect_err("past what the descriptor says")
    });
    let peak = peak_mib();
    println!(
        "  a 256 MiB blob its manifest calls 16 MiB:    {:>6} MiB (refused: {err})",
        peak - before
    );
}

/// Resets `VmHWM` to the current resident set.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak resident set");
}

fn status_mib(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .expect("the field");
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        / 1024
}

fn resident_mib() -> usize {
    status_mib("VmRSS:")
}

fn peak_mib() -> usize {
    status_mib("VmHWM:")
}

/// A first load: a new sandbox with no cache, the module compiled and probed.
fn compile(module: &[u8]) {
    let sandbox = Sandbox::new(SandboxConfig {
        cache_dir: None,
        ..SandboxConfig::default()
    })
    .expect("a sandbox");
    sandbox
        .load_blocking(module, Limits::default())
        .expect("the module loads");
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
