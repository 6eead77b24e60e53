//! Plugins in a real OCI registry (`support::registry`, Debian's `docker-registry` on
//! loopback): `wasmop push` publishes a module and prints it pinned by digest; a pull by that
//! digest gives the same bytes, a pull by tag resolves to the same digest; a moved tag does not
//! change what a pinned reference pulls; and every answer is bounded: a module over the cap is
//! refused before it is fetched, a manifest whose descriptor understates its layer is cut off,
//! a stopped registry is an error naming it. On the plane: a plugin 5 MiB past any
//! ConfigMap runs from a `plugin.oci` reference; with the registry stopped, a new version
//! waits (`LoadFailed` naming it) while the running one reconciles, and goes live by itself
//! once the registry is back; a host restarted while it is down loads the pinned module from
//! its disk cache. A registry that asks for a login is answered from the Docker config
//! `wasmop push` is given and from the pull Secret a ConfigMap names. Signatures: `wasmop push --sign-key` signs as cosign does, a
//! signature checks only against its key and its manifest, and a host whose policy requires
//! one loads a signed plugin and refuses an unsigned one, keeping the signed one running.
//! `wasmop package` pins a tag to its digest once; `wasmop rollout undo` goes back to a
//! registry revision after the host restarted.

use std::time::Duration;

use support::registry::TestRegistry;
use wasmop::plugin::oci::{
    Digest, Limits, OciClient, OciError, PublicKey, Reference, SignatureError, SigningKey,
};

fn push(file: &std::path::Path, reference: &str) -> Reference {
    push_with(file, reference, &[])
}

fn push_with(file: &std::path::Path, reference: &str, args: &[&std::ffi::OsStr]) -> Reference {
    let out = std::process::Command::new(support::wasmop_bin())
        .arg("push")
        .arg(file)
        .arg(reference)
        .args(args)
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

    // `wasmop package` resolves the tag once, now, and its ConfigMap names the digest.
    let out = std::process::Command::new(support::wasmop_bin())
        .args(["package", &tag, "--pull-secret", "team-registry"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_yaml::from_slice(&out.stdout).expect("a ConfigMap");
    assert_eq!(cm.metadata.name.as_deref(), Some("memcached"));
    assert_eq!(
        cm.data.unwrap()["plugin.oci"],
        by_tag.pinned(moved.clone()).to_string()
    );
    assert_eq!(
        cm.metadata.annotations.unwrap()["wasmop.io/pull-secret"],
        "team-registry"
    );
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
            if *s == module.len() as u64 && what.starts_with("the plugin layer")),
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
    payload.extend(test_artifacts::noise(pad));
    let mut out = wasm.to_vec();
    out.push(0);
    leb(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// A test's namespace where the plugin ConfigMap `memcached` may serve Memcached.
async fn memcached_env(test: &str) -> support::Env {
    let env = support::Env::new(test).await;
    env.grant(
        "memcached",
        &test_artifacts::read(test_artifacts::MEMCACHED_V2),
        &[],
    )
    .await;
    env
}

/// Waits for an Event `reason` on the plugin ConfigMap `memcached` whose message has `needle`.
async fn plugin_event(env: &support::Env, reason: &str, needle: &str) {
    let event = support::wait_event(env, "ConfigMap", "memcached", reason).await;
    let message = event.message.unwrap_or_default();
    assert!(message.contains(needle), "{reason}: {message}");
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

    let env = memcached_env("oci-plugin").await;
    put_reference(&env, "memcached", &pin1).await;
    // A cache directory of its own, which the restart below reads.
    let cache = dir.join("cache");
    let cache = cache.to_str().unwrap();
    let host = env.host().env("XDG_CACHE_HOME", cache).start();
    plugin_event(&env, "Loaded", "memcached 0.1.0").await;
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
    plugin_event(&env, "Swapped", "memcached 0.2.0").await;
    env.memcached_ready("a", 1).await;

    // Down again, and the host restarts: the pinned module comes from its disk cache, never
    // dialled, and the new host reconciles with it.
    registry.stop();
    drop(host);
    let host = env.host().env("XDG_CACHE_HOME", cache).start();
    env.memcached_ready("a", 4).await;
    let log = host.logs();
    assert!(log.contains("module taken from the disk cache"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A new signing key written to `dir/name.pem`: its path and its public half.
fn signing_key(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, PublicKey) {
    let (key, pem) = SigningKey::generate();
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, pem).unwrap();
    (path, key.public_key())
}

/// Memcached 0.1.0 pushed to `repo:v1` signed by a new key, 0.2.0 to `repo:v2` unsigned:
/// the repository, the key's public half, and both pinned.
fn signed_and_unsigned(
    registry: &TestRegistry,
    dir: &std::path::Path,
    repo: &str,
) -> (String, PublicKey, Reference, Reference) {
    let (key, public) = signing_key(dir, "team");
    let repo = registry.reference(repo);
    let signed = push_with(
        std::path::Path::new(test_artifacts::MEMCACHED),
        &format!("{repo}:v1"),
        &["--sign-key".as_ref(), key.as_os_str()],
    );
    let unsigned = push(
        std::path::Path::new(test_artifacts::MEMCACHED_V2),
        &format!("{repo}:v2"),
    );
    (repo, public, signed, unsigned)
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wasmop-e2e-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_signature_vouches_only_for_its_manifest_and_only_under_its_key() {
    let registry = TestRegistry::start();
    let dir = temp_dir("sign");
    let (repo, public, signed, unsigned) = signed_and_unsigned(&registry, &dir, "plugins/signed");
    let (stranger, stranger_public) = signing_key(&dir, "stranger");
    let v1 = std::path::Path::new(test_artifacts::MEMCACHED);
    let client = OciClient::new(&signed, None, Limits::default()).unwrap();
    let d1 = signed.digest.clone().unwrap();
    let d2 = unsigned.digest.clone().unwrap();

    let by = client
        .verify(&signed, &d1, std::slice::from_ref(&public))
        .await;
    assert_eq!(by.expect("signed by the team's key"), public.fingerprint());
    match client
        .verify(&signed, &d1, std::slice::from_ref(&stranger_public))
        .await
    {
        Err(SignatureError::Invalid {
            count: 1, reasons, ..
        }) => {
            assert!(reasons.contains("signed by no listed key"), "{reasons}")
        }
        other => panic!("another key's policy: {other:?}"),
    }
    match client
        .verify(&unsigned, &d2, std::slice::from_ref(&public))
        .await
    {
        Err(SignatureError::Unsigned { tag, .. }) => {
            assert_eq!(tag, format!("sha256-{}.sig", d2.hex()))
        }
        other => panic!("unsigned: {other:?}"),
    }

    // v1's signatures copied under v2's tag: a trusted key's signature, of another manifest.
    let raw = manifest_bytes(
        &registry,
        &format!("plugins/signed/manifests/sha256-{}.sig", d1.hex()),
    );
    put_manifest(
        &registry,
        &format!("plugins/signed/manifests/sha256-{}.sig", d2.hex()),
        &raw,
    );
    match client
        .verify(&unsigned, &d2, std::slice::from_ref(&public))
        .await
    {
        Err(SignatureError::Invalid { reasons, .. }) => {
            assert!(
                reasons.contains(&format!("a signature of {d1}, not {d2}")),
                "{reasons}"
            )
        }
        other => panic!("a replayed signature: {other:?}"),
    }

    // A second signature joins the first (cosign's layout): either key now passes.
    push_with(
        v1,
        &format!("{repo}:v1"),
        &["--sign-key".as_ref(), stranger.as_os_str()],
    );
    client
        .verify(&signed, &d1, &[stranger_public])
        .await
        .expect("the second signature");
    client
        .verify(&signed, &d1, std::slice::from_ref(&public))
        .await
        .expect("the first signature stays");
    // Signing again with a key replaces its signature: two keys, two payload layers.
    push_with(
        v1,
        &format!("{repo}:v1"),
        &["--sign-key".as_ref(), dir.join("team.pem").as_os_str()],
    );
    let signatures: serde_json::Value = serde_json::from_slice(&manifest_bytes(
        &registry,
        &format!("plugins/signed/manifests/sha256-{}.sig", d1.hex()),
    ))
    .unwrap();
    assert_eq!(signatures["layers"].as_array().unwrap().len(), 2);
    client
        .verify(&signed, &d1, &[public])
        .await
        .expect("the first key's new signature");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A manifest's bytes, as the registry serves them.
fn manifest_bytes(registry: &TestRegistry, path: &str) -> Vec<u8> {
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
        ])
        .arg(format!("http://{}/v2/{path}", registry.addr))
        .output()
        .expect("curl");
    assert!(out.status.success(), "GET {path}");
    out.stdout
}

/// Stores a manifest's bytes at `path`.
fn put_manifest(registry: &TestRegistry, path: &str, body: &[u8]) {
    let file = std::env::temp_dir().join(format!("wasmop-e2e-manifest-{}", std::process::id()));
    std::fs::write(&file, body).unwrap();
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
        ])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://{}/v2/{path}", registry.addr))
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "PUT {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&file);
}

#[tokio::test]
async fn a_host_that_requires_signatures_loads_a_signed_plugin_and_refuses_an_unsigned_one() {
    let registry = TestRegistry::start();
    let dir = temp_dir("policy");
    let (_, public, signed, unsigned) = signed_and_unsigned(&registry, &dir, "plugins/guarded");
    // Only the admin's file says who signs; the ConfigMap names a reference and nothing else.
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "rules:\n- match: {}/plugins/*\n  keys:\n  - |\n{}unmatched: refuse\n",
            registry.addr,
            public
                .to_pem()
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        ),
    )
    .unwrap();

    let env = memcached_env("oci-signed").await;
    put_reference(&env, "memcached", &signed.to_string()).await;
    let _host = env
        .host()
        .args(&["--signature-policy", policy.to_str().unwrap()])
        .start();
    support::wait_event(&env, "ConfigMap", "memcached", "Loaded").await;
    env.memcached_ready("a", 2).await;

    put_reference(&env, "memcached", &unsigned.to_string()).await;
    let failed = support::wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains(&unsigned.to_string()) && message.contains("not signed"),
        "{message}"
    );
    // The signed version runs on.
    env.memcached_ready("a", 3).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn undo_to_a_registry_revision_works_after_a_restart() {
    let registry = TestRegistry::start();
    let repo = registry.reference("plugins/undone");
    let pin1 = push(
        std::path::Path::new(test_artifacts::MEMCACHED),
        &format!("{repo}:v1"),
    )
    .to_string();
    let pin2 = push(
        std::path::Path::new(test_artifacts::MEMCACHED_V2),
        &format!("{repo}:v2"),
    )
    .to_string();
    let env = memcached_env("oci-undo").await;
    put_reference(&env, "memcached", &pin1).await;
    let host = env.start_host();
    env.memcached_ready("a", 2).await;
    put_reference(&env, "memcached", &pin2).await;
    support::wait_event(&env, "ConfigMap", "memcached", "Swapped").await;
    host.kill();

    // A new host, whose memory holds nothing of the first: the revision alone names pin1.
    let host = env.start_host();
    let (ok, out) = env.wasmop(&["rollout", "undo", "memcached"]);
    assert!(ok, "{out}");
    assert!(out.contains("holds revision 1 again"), "{out}");
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = env.ns.api();
    let cm = cms.get("memcached").await.unwrap();
    assert_eq!(cm.data.unwrap()["plugin.oci"], pin1);
    testenv::wait_until(
        "the first version, from the registry, to be live again",
        support::TIMEOUT,
        || async {
            let (ok, history) = env.wasmop(&["rollout", "history", "memcached"]);
            if ok { Ok(history) } else { Err(history) }
        },
        |history: &String| {
            history.lines().any(|l| {
                let row: Vec<&str> = l.split_whitespace().take(3).collect();
                row.get(1) == Some(&"live") && row.get(2) == Some(&"0.1.0")
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    env.memcached_ready("a", 3).await;
}

/// A Docker config with `user:password` for `registry`.
fn docker_config(registry: &TestRegistry, user: &str, password: &str) -> Vec<u8> {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    serde_json::to_vec(&serde_json::json!({"auths": {registry.addr.clone(): {"auth": auth}}}))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_that_asks_for_a_login_gets_the_pull_secrets() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use wasmop::plugin::oci::Credentials;

    let registry = TestRegistry::start_with_login("team", "s3cret");
    let dir = temp_dir("oci-login");
    let (good, bad) = (dir.join("good.json"), dir.join("bad.json"));
    std::fs::write(&good, docker_config(&registry, "team", "s3cret")).unwrap();
    std::fs::write(&bad, docker_config(&registry, "team", "guess")).unwrap();
    let module = std::path::Path::new(test_artifacts::MEMCACHED);
    let tag = format!("{}:v1", registry.reference("team/memcached"));

    // Without a login, or with a wrong one, nothing is pushed, and the error says why.
    let attempt = |config: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(support::wasmop_bin());
        cmd.arg("push").arg(module).arg(&tag);
        if let Some(config) = config {
            cmd.arg("--docker-config").arg(config);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "pushed without the right login");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let none = attempt(None);
    assert!(
        none.contains("asks for credentials and none were given"),
        "{none}"
    );
    let wrong = attempt(Some(&bad));
    assert!(wrong.contains("401"), "{wrong}");
    let pinned = push_with(
        module,
        &tag,
        &["--docker-config".as_ref(), good.as_os_str()],
    );

    // Pulled with the right login only.
    let login = |file: &std::path::Path| {
        Credentials::from_docker_config(&std::fs::read(file).unwrap(), &pinned.registry)
            .unwrap()
            .expect("an entry for the registry")
    };
    let err = OciClient::new(&pinned, Some(login(&bad)), Limits::default())
        .unwrap()
        .pull(&pinned)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Status { status: 401, .. }), "{err}");
    let pulled = OciClient::new(&pinned, Some(login(&good)), Limits::default())
        .unwrap()
        .pull(&pinned)
        .await
        .expect("pull with the login");
    assert_eq!(pulled.module, std::fs::read(module).unwrap());

    // On the plane: the ConfigMap names a pull Secret that is not there yet. The load waits,
    // saying so, and goes on by itself once the Secret is created.
    let env = memcached_env("oci-login").await;
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "memcached",
            "labels": {"wasmop.io/plugin": "true"},
            "annotations": {"wasmop.io/pull-secret": "team-registry"},
        },
        "data": {"plugin.oci": pinned.to_string()},
    });
    let cms: Api<ConfigMap> = env.ns.api();
    cms.patch(
        "memcached",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&cm),
    )
    .await
    .unwrap();
    let host = env.start_host();
    let failed = support::wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("team-registry") && message.contains("not found"),
        "{message}"
    );
    let config = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&good).unwrap())
    };
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "team-registry"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": config},
    }))
    .unwrap();
    let secrets: Api<Secret> = env.ns.api();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    support::wait_event(&env, "ConfigMap", "memcached", "Loaded").await;
    env.memcached_ready("a", 2).await;
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_script_plugin_runs_from_the_registry_under_a_key_that_names_its_language() {
    let registry = TestRegistry::start();
    let script = test_artifacts::workspace_root().join(crate::scripts::SCRIPT);
    let pinned = push(
        &script,
        &format!("{}:v1", registry.reference("plugins/memcached-star")),
    );
    let client = OciClient::new(&pinned, None, Limits::default()).unwrap();
    let pulled = client.pull(&pinned).await.expect("pull the script");
    assert_eq!(pulled.module, std::fs::read(&script).unwrap());
    assert_eq!(
        pulled.layer.media_type,
        wasmop::plugin::oci::STARLARK_LAYER_MEDIA_TYPE
    );

    // `wasmop package` names it under `plugin.star.oci`; the host loads it as a script.
    let env = memcached_env("oci-script").await;
    crate::scripts::apply_output(&env, &["package", &pinned.to_string()]).await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = env.ns.api();
    let cm = cms.get("memcached").await.unwrap();
    assert_eq!(cm.data.unwrap()["plugin.star.oci"], pinned.to_string());
    let _host = env.start_host();
    // Loaded as the script: the version names the script's own digest.
    let script_digest = Digest::of(&std::fs::read(&script).unwrap());
    plugin_event(&env, "Loaded", &script_digest.as_str()[..19]).await;
    env.memcached_ready("a", 2).await;

    // The same script named as a module: refused before it reaches the compiler, saying
    // which is which; the script runs on.
    put_reference(&env, "memcached", &pinned.to_string()).await;
    let failed = support::wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("holds a Starlark script")
            && message.contains("names a WebAssembly module"),
        "{message}"
    );
    env.memcached_ready("a", 1).await;
}
