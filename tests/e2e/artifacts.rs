//! Compiled plugins shared between replicas through the cluster: a second host with an empty
//! disk cache takes the first one's artifact instead of compiling, and an artifact planted by
//! someone who can write ConfigMaps but not read the key is never loaded. The compiled Starlark
//! interpreter, too large for one ConfigMap, is shared in parts.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};

use support::*;

/// A host with a disk cache of its own, empty: a new pod's.
fn fresh_pod(env: &Env, pod: &str) -> Host {
    let cache = test_artifacts::workspace_root()
        .join("target/e2e-cache")
        .join(format!("{}-{pod}-{}", env.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).unwrap();
    env.host()
        .pod(pod)
        .env("XDG_CACHE_HOME", cache.to_str().unwrap())
        .start()
}

async fn wait_log(host: &Host, line: &str) {
    testenv::wait_until(
        &format!("the host to log {line:?}"),
        TIMEOUT,
        || async { Ok::<_, std::convert::Infallible>(host.logs()) },
        |logs| logs.contains(line),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
}

async fn artifacts(env: &Env) -> Vec<ConfigMap> {
    let api: kube::Api<ConfigMap> = env.ns.api();
    api.list(&ListParams::default().labels("wasmop.io/artifact"))
        .await
        .expect("list artifacts")
        .items
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_replica_loads_what_another_compiled_and_never_a_planted_artifact() {
    let env = Env::new("e2e-artifacts").await;
    env.put_memcached_plugin().await;

    // The first pod compiles, makes the key, and publishes the artifact, owned by the revision.
    let first = fresh_pod(&env, "first");
    wait_log(&first, "shared the compiled plugin with other replicas").await;
    assert!(first.logs().contains("\"compiled\""), "{}", first.logs());
    let secrets: kube::Api<Secret> = env.ns.api();
    let key = secrets
        .get("wasmop-artifact-key")
        .await
        .expect("the key Secret");
    assert_eq!(key.immutable, Some(true));
    assert_eq!(key.data.unwrap()["key"].0.len(), 32);
    let stored = artifacts(&env).await;
    assert_eq!(stored.len(), 1, "one artifact");
    let artifact = stored.into_iter().next().unwrap();
    let owners = artifact.metadata.owner_references.clone().unwrap();
    assert_eq!(owners[0].kind, "ControllerRevision");
    assert!(owners[0].name.starts_with("memcached-"), "{owners:?}");
    first.kill();

    // A new pod with an empty disk cache loads it instead of compiling, and reconciles.
    let second = fresh_pod(&env, "second");
    wait_log(&second, "\"shared by another replica\"").await;
    env.memcached_ready("cache", 1).await;
    second.kill();

    // Someone who may write ConfigMaps in the host's namespace, not read the key, replaces the
    // artifact with their own code under a MAC they made up. A new pod refuses it, compiles,
    // and keeps reconciling.
    let api: kube::Api<ConfigMap> = env.ns.api();
    let name = artifact.metadata.name.clone().unwrap();
    api.delete(&name, &DeleteParams::default())
        .await
        .expect("delete the artifact");
    let mut planted = artifact.clone();
    planted.metadata = kube::api::ObjectMeta {
        name: Some(name.clone()),
        labels: artifact.metadata.labels.clone(),
        annotations: artifact.metadata.annotations.clone(),
        ..Default::default()
    };
    planted
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("wasmop.io/artifact-mac".into(), "00".repeat(32));
    testenv::wait_until(
        "the old artifact to be gone",
        TIMEOUT,
        || async { api.get_opt(&name).await },
        Option::is_none,
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &planted)
        .await
        .expect("plant an artifact");
    let third = fresh_pod(&env, "third");
    wait_log(&third, "fails its MAC; compiling instead").await;
    wait_log(&third, "\"compiled\"").await;
    env.memcached_ready("cache", 2).await;
    assert!(
        !third.logs().contains("shared by another replica"),
        "{}",
        third.logs()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripts_interpreter_is_shared_in_parts_and_a_new_replica_compiles_nothing() {
    let env = Env::new("e2e-artifacts-star").await;
    let script = test_artifacts::workspace_root().join(crate::scripts::SCRIPT);
    let script = script.to_str().unwrap();
    let host_ns = env.name().to_owned();
    crate::scripts::apply_output(&env, &["rbac", script, "--watch-namespace", &host_ns]).await;
    crate::scripts::apply_output(&env, &["package", script]).await;

    let first = fresh_pod(&env, "first");
    wait_log(&first, "shared the compiled plugin with other replicas").await;
    let stored = artifacts(&env).await;
    let head = stored
        .iter()
        .find(|cm| {
            cm.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("wasmop.io/artifact-parts"))
        })
        .unwrap_or_else(|| panic!("no artifact in parts: {stored:?}"));
    let parts: usize = head.metadata.annotations.as_ref().unwrap()["wasmop.io/artifact-parts"]
        .parse()
        .unwrap();
    assert!(parts > 1, "{parts}");
    assert_eq!(stored.len(), parts, "the parts, and nothing else");
    for cm in &stored {
        let owners = cm.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners[0].kind, "ControllerRevision", "{owners:?}");
        assert_eq!(cm.immutable, Some(true));
    }
    first.kill();

    // A new pod loads the interpreter as it was shared: nothing compiled; only the script's
    // top level runs, in milliseconds.
    let second = fresh_pod(&env, "second");
    wait_log(&second, "\"shared by another replica\"").await;
    env.memcached_ready("cache", 2).await;
    let logs = second.logs();
    let ready = logs
        .lines()
        .find(|l| l.contains("plugin module ready"))
        .unwrap_or_else(|| panic!("{logs}"));
    println!("a replica took the shared interpreter: {ready}");
    assert!(!logs.contains("\"compiled\""), "{logs}");

    // A part gone: the next new pod compiles for itself, and serves.
    let api: kube::Api<ConfigMap> = env.ns.api();
    let last = format!("{}-{}", head.metadata.name.as_deref().unwrap(), parts - 1);
    api.delete(&last, &DeleteParams::default())
        .await
        .expect("delete a part");
    testenv::wait_until(
        "the part to be gone",
        TIMEOUT,
        || async { api.get_opt(&last).await },
        Option::is_none,
    )
    .await
    .unwrap();
    second.kill();
    let third = fresh_pod(&env, "third");
    wait_log(&third, "a part of a shared compiled plugin is missing").await;
    wait_log(&third, "\"compiled\"").await;
    env.memcached_ready("cache", 1).await;
}
