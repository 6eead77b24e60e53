//! Plugins in a real OCI registry (`support::registry`, Debian's `docker-registry` on
//! loopback): `wasmop push` publishes a module and prints it pinned by digest; a pull by that
//! digest gives the same bytes, a pull by tag resolves to the same digest; a moved tag does not
//! change what a pinned reference pulls; and every answer is bounded: a module over the cap is
//! refused before it is fetched, a manifest whose descriptor understates its layer is cut off,
//! a stopped registry is an error naming it.

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
    assert!(
        matches!(err, OciError::TooLarge { size: Some(s), .. } if s == module.len() as u64),
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
