//! A plugin's finalizer never outlives the plugin: when a new version stops asking for it, or
//! the plugin's ConfigMap is deleted — even while no host runs — the host takes it off every
//! parent, and deletions it held go ahead.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject};

use support::{Env, TIMEOUT, put_probe};

const FINALIZER: &str = "wasmop.io/finalizing";
/// The host's record of each plugin's finalizer, in its namespace.
const RECORD: &str = "wasmop-finalizers";

/// Waits until the record says `expected` for ConfigMap `plugin` (`None`: nothing).
async fn wait_record(env: &Env, expected: Option<&str>) {
    let configmaps = env.ns.api::<ConfigMap>();
    testenv::wait_until(
        &format!("{RECORD} to hold {expected:?} for ConfigMap plugin"),
        TIMEOUT,
        || async { configmaps.get_opt(RECORD).await },
        |cm| {
            let entry = cm.as_ref().and_then(|cm| cm.data.as_ref()?.get("plugin"));
            entry.map(String::as_str) == expected
        },
    )
    .await
    .unwrap();
}

fn finalizers(probe: &DynamicObject) -> Vec<String> {
    probe.metadata.finalizers.clone().unwrap_or_default()
}

/// Creates Probe `name`, waits until it carries the plugin's finalizer, deletes it, and checks
/// the deletion is held.
async fn held_deletion(env: &Env, name: &str) -> Api<DynamicObject> {
    let probes = put_probe(env, name).await;
    testenv::wait_until(
        &format!("Probe {name} to get {FINALIZER}"),
        TIMEOUT,
        || async { probes.get(name).await },
        |p| finalizers(p).iter().any(|f| f == FINALIZER),
    )
    .await
    .unwrap();
    probes.delete(name, &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let held = probes.get(name).await.expect("held by the finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    probes
}

async fn wait_gone(probes: &Api<DynamicObject>, name: &str, host_logs: impl Fn() -> String) {
    testenv::wait_until(
        &format!("Probe {name} to be deleted"),
        TIMEOUT,
        || async { probes.get_opt(name).await },
        Option::is_none,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host_logs()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finalizer_is_released_when_no_version_will_remove_it() {
    let env = Env::new("e2e-finalizers").await;
    let finalizing = test_artifacts::read(test_artifacts::FINALIZING);
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    env.put_plugin("plugin", &finalizing, None).await;
    let host = env.start_host();

    // 1. A new version without the finalizer (another plugin in the same ConfigMap).
    let probes = held_deletion(&env, "a").await;
    env.put_plugin("plugin", &adversarial, None).await;
    wait_gone(&probes, "a", || host.logs()).await;

    // 2. The plugin's ConfigMap deleted.
    env.put_plugin("plugin", &finalizing, None).await;
    let probes = held_deletion(&env, "b").await;
    let configmaps = env.ns.api::<k8s_openapi::api::core::v1::ConfigMap>();
    configmaps
        .delete("plugin", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&probes, "b", || host.logs()).await;
    assert!(host.logs().contains("released the finalizer"));
    wait_record(&env, None).await;

    // 3. The ConfigMap deleted while no host runs: the next host finds the finalizer on
    //    record and releases it.
    env.put_plugin("plugin", &finalizing, None).await;
    let probes = held_deletion(&env, "c").await;
    wait_record(&env, Some("test.wasmop.io/v1 Probe wasmop.io/finalizing\n")).await;
    host.kill();
    configmaps
        .delete("plugin", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        probes.get_opt("c").await.unwrap().is_some(),
        "nothing released the finalizer while no host ran"
    );
    let host = env.start_host();
    wait_gone(&probes, "c", || host.logs()).await;
    wait_record(&env, None).await;
    assert!(
        host.logs()
            .contains("released the finalizer of a plugin whose ConfigMap is gone"),
        "{}",
        host.logs()
    );
}
