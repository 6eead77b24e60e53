//! Plugins in a real OCI registry (`support::registry`, Debian's `docker-registry` on
//! loopback): `wasmop push` publishes a module and prints it pinned by digest; a pull by that
//! digest gives the same bytes, a pull by tag resolves to the same digest; a moved tag does not
//! change what a pinned reference pulls; and every answer is bounded: a module over the cap is
//! refused before it is fetched, a manifest whose descriptor understates its layer is cut off,
//! a stopped registry is an error naming it. On the plane: a plugin 5 MiB past any
//! ConfigMap runs from a `plugin.oci` reference; with the registry stopped, a new version
//! waits (`LoadFailed` naming it) while the running one reconciles, and goes live by itself
//! once the registry is back.

use std::time::Duration;

use support::registry::TestRegistry;
use wasmop::plugin::oci::{Digest, Limits, OciClient, OciError, Reference};

fn push(file: &std::path::Path, reference: &str) -> Reference {
    let out = std::process::Command::new(support::wasmop_bin())
        .arg("push")
        .arg(file)
        .arg(reference)
        .output()
        .expect("running wasmop push");
    assert!(
        out.status.success(),
        "wasmop push {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).expect("UTF-8");
    printed.trim().parse().expect("push prints a reference")
}

#[tokio::test]
async fn a_pushed_plugin_is_pulled_by_digest_and_a_moved_tag_changes_no_pin() {
    let registry = TestRegistry::start();
    let v1 = std::path::Path::new(test_artifacts::MEMCACHED);
    let v2 = std::path::Path::new(test_artifacts::MEMCACHED_V2);
    let tag = format!("{}:stable", registry.reference("plugins/memcached"));

    let pinned = push(v1, &tag);
    let digest = pinned.digest.clone().expect("push prints the digest");
    assert_eq!(pinned.tag.as_deref(), Some("stable"));

    let client = OciClient::new(&pinned, None, Limits::default()).unwrap();
    let pulled = client.pull(&pinned).await.expect("pull by digest");
    assert_eq!(pulled.module, std::fs::read(v1).unwrap());
    assert_eq!(pulled.manifest, digest);
    assert_eq!(pulled.layer.media_type, "application/wasm");

    // The same module pushed again is the same manifest: nothing in it is a time.
    assert_eq!(push(v1, &tag).digest, Some(digest.clone()));

    // The tag moves to v2; the pin still pulls v1, the tag now v2.
    let moved = push(v2, &tag).digest.expect("digest");
    assert_ne!(moved, digest);
    let by_pin = client.pull(&pinned).await.expect("pull by the old pin");
    assert_eq!(by_pin.module, std::fs::read(v1).unwrap());
    let by_tag: Reference = tag.parse().unwrap();
    let now = client.pull(&by_tag).await.expect("pull by tag");
    assert_eq!(now.manifest, moved);
    assert_eq!(now.module, std::fs::read(v2).unwrap());
    assert_eq!(now.reference.digest, Some(moved));
}

#[tokio::test]
async fn every_answer_is_bounded_and_checked() {
    let mut registry = TestRegistry::start();
    let module = std::fs::read(test_artifacts::MEMCACHED).unwrap();
    let pinned = push(
        std::path::Path::new(test_artifacts::MEMCACHED),
        &format!("{}:v1", registry.reference("bounded")),
    );

    // A cap below the module: refused from the descriptor, before the blob is asked for.
    let small = Limits {
        blob_bytes: module.len() as u64 - 1,
        ..Limits::default()
    };
    let err = OciClient::new(&pinned, None, small)
        .unwrap()
        .pull(&pinned)
        .await
        .unwrap_err();
    // (From the manifest's descriptor, not the blob's Content-Length: its message names the layer.)
    assert!(
        matches!(&err, OciError::TooLarge { size: Some(s), what, .. }
            if *s == module.len() as u64 && what.starts_with("the module layer")),
        "{err}"
    );

    // A digest that names nothing in the repository.
    let absent = pinned.pinned(Digest::of(b"nothing"));
    let err = OciClient::new(&absent, None, Limits::default())
        .unwrap()
        .pull(&absent)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Status { status: 404, .. }), "{err}");

    // A manifest whose descriptor says the layer is shorter than it is: cut off at what it said.
    let client = OciClient::new(&pinned, None, Limits::default()).unwrap();
    let layer = Digest::of(&module);
    let err = client
        .blob(&pinned, &layer, module.len() as u64 - 100)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::TooLarge { .. }), "{err}");
    // And one that says it is longer: short by what it said.
    let err = client
        .blob(&pinned, &layer, module.len() as u64 + 1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("its descriptor says"), "{err}");

    // A stopped registry: an error naming where, within the timeout.
    registry.stop();
    let quick = Limits {
        timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    let err = OciClient::new(&pinned, None, quick)
        .unwrap()
        .pull(&pinned)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&registry.addr), "{err}");
}

/// `wasm` with `pad` bytes of noise in a custom section at its end: the same component, which
/// no gzip can shrink into a ConfigMap.
fn padded(wasm: &[u8], pad: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"wasmop-test-padding";
    let mut payload = Vec::with_capacity(pad + 32);
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    payload.extend((0..pad).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    let mut out = wasm.to_vec();
    out.push(0);
    leb(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// A plugin ConfigMap that names `reference` instead of holding a module.
async fn put_reference(env: &support::Env, name: &str, reference: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"wasmop.io/plugin": "true"}},
        "data": {"plugin.oci": reference},
    });
    let api: Api<ConfigMap> = env.ns.api();
    api.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&cm))
        .await
        .expect("apply the plugin ConfigMap");
}

#[tokio::test]
async fn a_plugin_no_configmap_could_hold_runs_from_the_registry_and_outlives_it() {
    let mut registry = TestRegistry::start();
    let dir = std::env::temp_dir().join(format!("wasmop-e2e-oci-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let v1 = padded(&test_artifacts::read(test_artifacts::MEMCACHED), 5 << 20);
    let v2 = padded(&test_artifacts::read(test_artifacts::MEMCACHED_V2), 5 << 20);
    let (f1, f2) = (dir.join("v1.wasm"), dir.join("v2.wasm"));
    std::fs::write(&f1, &v1).unwrap();
    std::fs::write(&f2, &v2).unwrap();
    // No ConfigMap holds it, even gzipped.
    let refused = std::process::Command::new(support::wasmop_bin())
        .arg("package")
        .arg(&f1)
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "wasmop package took a 5 MiB module"
    );
    let repo = registry.reference("plugins/memcached");
    let pin1 = push(&f1, &format!("{repo}:v1")).to_string();
    let pin2 = push(&f2, &format!("{repo}:v2")).to_string();

    let env = support::Env::new("oci-plugin").await;
    env.grant("memcached", &v2, &[]).await;
    put_reference(&env, "memcached", &pin1).await;
    let _host = env.start_host();
    let loaded = support::wait_event(&env, "ConfigMap", "memcached", "Loaded").await;
    assert!(
        loaded
            .message
            .as_deref()
            .unwrap_or("")
            .contains("memcached 0.1.0"),
        "{loaded:?}"
    );
    env.memcached_ready("a", 2).await;

    // The registry goes down, and a new version is named: it cannot load, and says why; the
    // running one goes on.
    registry.stop();
    put_reference(&env, "memcached", &pin2).await;
    let failed = support::wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains(&pin2) && message.contains(&registry.addr),
        "{message}"
    );
    env.memcached_ready("a", 3).await;

    // Back up: the same version is fetched again by itself, and swapped in.
    registry.restart();
    let swapped = support::wait_event(&env, "ConfigMap", "memcached", "Swapped").await;
    assert!(
        swapped
            .message
            .as_deref()
            .unwrap_or("")
            .contains("memcached 0.2.0"),
        "{swapped:?}"
    );
    env.memcached_ready("a", 1).await;
    let _ = std::fs::remove_dir_all(&dir);
}
