//! What loading a plugin from a registry costs against loading it from a ConfigMap: the
//! Memcached module stored as `wasmop package` stores it (gzipped) and inflated, against the
//! same module pulled by digest from a real registry on loopback (Debian's `docker-registry`,
//! as the tests start it), its cosign signature checked. Each load then compiles in a fresh
//! sandbox with no cache, as a host's first load does; the two alternate, so drift in the
//! machine falls on both.
//!
//! Run with `cargo bench -p wasmop --bench registry_load`; it prints the median of each and
//! their ratio.

use std::io::Read;
use std::time::{Duration, Instant};

use support::registry::TestRegistry;
use wasmop::plugin::oci::{Limits as OciLimits, OciClient, Reference, SigningKey};
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
