//! A Starlark plugin installed as the README says (`wasmop rbac plugin.star` and `wasmop
//! package plugin.star`, applied), serving Memcached; the same ConfigMap swapped to the Rust
//! build and back; a syntax error that keeps the last good version.

use kube::api::{Patch, PatchParams};
use serde_json::Value;

use k8s_openapi::api::core::v1::ConfigMap;
use support::{Env, Host, TIMEOUT};

const SCRIPT: &str = "plugins/memcached-star/plugin.star";

/// The documents `wasmop <args>` prints, applied server-side as `kubectl apply
/// --server-side -f -` would.
async fn apply_output(env: &Env, args: &[&str]) {
    let (ok, out) = env.wasmop(args);
    assert!(ok, "wasmop {args:?}: {out}");
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&out)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .filter(|v: &Value| !v.is_null())
        .collect();
    assert!(!docs.is_empty(), "wasmop {args:?} printed nothing: {out}");
    testenv::apply_objects(&env.client, docs, "e2e")
        .await
        .expect("applied");
}

/// Waits until `Memcached/name` was last reconciled by the module or script whose digest is
/// `digest` (its `Ready` message names it), and is Ready.
async fn served_by(env: &Env, host: &Host, name: &str, digest: &str) {
    let short = &digest[..19];
    let api = env.memcacheds();
    testenv::wait_until(
        &format!("Memcached {name} to be reconciled by {short}"),
        TIMEOUT,
        || async {
            api.get(name)
                .await
                .map(|o| o.data["status"]["conditions"].clone())
        },
        |conditions| {
            conditions.as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["type"] == "Ready"
                        && c["status"] == "True"
                        && c["message"].as_str().is_some_and(|m| m.contains(short))
                })
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_starlark_plugin_serves_swaps_with_the_rust_build_and_keeps_its_last_good_version() {
    let env = Env::new("e2e-scripts").await;
    let root = test_artifacts::workspace_root();
    let script = root.join(SCRIPT);
    let script_arg = script.to_str().unwrap();
    let source = std::fs::read(&script).unwrap();
    let script_digest = wasmop::sandbox::digest_of(&source);
    let host_ns = env.name().to_owned();

    apply_output(&env, &["rbac", script_arg, "--watch-namespace", &host_ns]).await;
    apply_output(&env, &["package", script_arg]).await;
    let mut host = env.start_host();
    let nodes = env.memcached_ready("one", 2).await;
    assert_eq!(nodes.len(), 2);
    served_by(&env, &host, "one", &script_digest).await;
    let deployment = env.wait_replicas("one", 2).await;
    let image = deployment.spec.template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("memcached:1.4.36-alpine"));

    // The same ConfigMap, now the Rust build, applied by the same manager: the script's key
    // goes, the module's comes, and the parent is served by the module.
    let rust = test_artifacts::read(test_artifacts::MEMCACHED);
    env.put_plugin_only("memcached", &rust, None).await;
    served_by(&env, &host, "one", &wasmop::sandbox::digest_of(&rust)).await;
    env.memcached_ready("one", 3).await;

    // And back to the script.
    apply_output(&env, &["package", script_arg]).await;
    served_by(&env, &host, "one", &script_digest).await;

    // A syntax error: LoadFailed names the key, line and column; the script before it goes on.
    let broken =
        String::from_utf8(source)
            .unwrap()
            .replacen("def labels(name):", "def labels(name)", 1);
    let configmaps: kube::Api<ConfigMap> = env.ns.api();
    let mut cm = configmaps.get("memcached").await.unwrap();
    cm.metadata.managed_fields = None;
    cm.metadata.resource_version = None;
    cm.data
        .get_or_insert_with(Default::default)
        .insert("plugin.star".into(), broken.clone());
    configmaps
        .patch(
            "memcached",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cm),
        )
        .await
        .unwrap();
    let failed = support::wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let note = failed.message.unwrap_or_default();
    assert!(note.contains("plugin.star:12:"), "{note}");
    env.memcached_ready("one", 1).await;
    served_by(&env, &host, "one", &script_digest).await;
    assert!(host.alive(), "the host runs on");
}

/// A platform engineer's path with `wasmop` and `kubectl` only: `wasmop new --lang starlark`,
/// then the scaffold's README, applied as written, to a `Ready` object and its Deployment.
#[tokio::test(flavor = "multi_thread")]
async fn a_starlark_scaffold_installs_as_its_readme_says_and_reconciles() {
    let env = Env::new("e2e-star-new").await;
    let dir = tempfile_dir("star-new");
    // Its own kind: the plane is shared, and CRDs are cluster-wide.
    let new = std::process::Command::new(support::wasmop_bin())
        .args([
            "new",
            "star-app",
            "--lang",
            "starlark",
            "--kind",
            "StarApp",
            "--group",
            "e2e.wasmop.io",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        new.status.success(),
        "{}",
        String::from_utf8_lossy(&new.stderr)
    );
    let file = |name: &str| dir.join(name).to_str().unwrap().to_owned();

    let crd_text = std::fs::read_to_string(file("crd.yaml")).unwrap();
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_yaml::from_str(&crd_text).unwrap();
    testenv::apply_crd(&env.client, &crd, "e2e", TIMEOUT)
        .await
        .expect("the scaffold's CRD is accepted");
    let host_ns = env.name().to_owned();
    apply_output(
        &env,
        &["rbac", &file("plugin.star"), "--watch-namespace", &host_ns],
    )
    .await;
    apply_output(&env, &["package", &file("plugin.star")]).await;
    let host = env.start_host();

    let mut sample: Value =
        serde_yaml::from_str(&std::fs::read_to_string(file("sample.yaml")).unwrap()).unwrap();
    sample["metadata"]["namespace"] = host_ns.clone().into();
    testenv::apply_objects(&env.client, vec![sample], "e2e")
        .await
        .expect("the sample");
    let deployments = env.ns.api::<k8s_openapi::api::apps::v1::Deployment>();
    let deployment = testenv::wait_until(
        "Deployment starapp-sample",
        TIMEOUT,
        || async { deployments.get_opt("starapp-sample").await },
        |d| d.as_ref().is_some_and(|d| d.spec.replicas == Some(2)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()))
    .expect("present");
    let container = &deployment.spec.template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx:1.27"));
    assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        env.client.clone(),
        &host_ns,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("e2e.wasmop.io", "v1alpha1", "StarApp"),
            "starapps",
        ),
    );
    testenv::wait_until(
        "StarApp starapp-sample to be Ready",
        TIMEOUT,
        || async {
            api.get("starapp-sample")
                .await
                .map(|o| o.data["status"].clone())
        },
        |status| {
            status["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh directory path under the system's temporary directory (not created).
fn tempfile_dir(what: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("wasmop-{what}-{}-{nanos}", std::process::id()))
}
