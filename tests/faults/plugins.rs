//! Faults of a plugin's world rather than the plane's: its rights revoked and restored, its
//! parent kind's CRD deleted and re-created, and a burst of settings updates.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams};

use crate::fleet::{converged, measured, memcached_fleet, memcached_wasm, scale, writes};
use crate::serial;
use support::{Env, TIMEOUT, install_crds, put_probe, wait_configmap, wait_event, wait_not_ready};

#[tokio::test(flavor = "multi_thread")]
async fn revoked_rights_and_a_deleted_crd_stop_one_plugin_and_heal_by_themselves() {
    let _turn = serial().await;
    let env = Env::new("f-rights").await;
    let memcached = memcached_wasm();
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    env.put_plugin("memcached", &memcached, None).await;
    env.put_plugin("adversarial", &adversarial, None).await;
    let host = env.start_host();
    scale(&env, 20, 1).await;
    converged(&env, 20, 1, &host).await;
    put_probe(&env, "p1").await;
    wait_configmap(&env, "p1", &host).await;

    // Its rights on Deployments revoked: Memcached says Forbidden, the other plugin goes on.
    env.grant("memcached", &memcached, &["deployments"]).await;
    scale(&env, 20, 2).await;
    let ready = wait_not_ready(&env.memcacheds(), "m000", &host).await;
    assert_eq!(ready["reason"], "Forbidden", "{ready}");
    put_probe(&env, "p2").await;
    wait_configmap(&env, "p2", &host).await;
    // Restored: it recovers by itself.
    let before = writes(&host, "").await;
    env.grant("memcached", &memcached, &[]).await;
    let restored = Instant::now();
    converged(&env, 20, 2, &host).await;
    measured(
        "plugin RBAC revoked, then restored",
        restored.elapsed(),
        writes(&host, "").await - before,
        "",
    );

    // The Probe CRD deleted while its plugin runs: it waits, Memcached goes on, and it
    // resumes once the CRD is back, without a restart.
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    crds.delete("probes.test.wasmop.io", &DeleteParams::default())
        .await
        .expect("CRD deleted");
    let waiting = wait_event(&env, "ConfigMap", "adversarial", "WaitingForKinds").await;
    assert!(
        waiting.message.as_deref().unwrap_or("").contains("Probe"),
        "{waiting:?}"
    );
    scale(&env, 20, 1).await;
    converged(&env, 20, 1, &host).await;
    testenv::wait_until(
        "the Probe CRD to be gone",
        TIMEOUT,
        || async { crds.get_opt("probes.test.wasmop.io").await },
        Option::is_none,
    )
    .await
    .unwrap();
    let before = writes(&host, "").await;
    install_crds(&env.client).await;
    let back = Instant::now();
    put_probe(&env, "p3").await;
    wait_configmap(&env, "p3", &host).await;
    measured(
        "parent CRD deleted, then re-created",
        back.elapsed(),
        writes(&host, "").await - before,
        "",
    );
    let resumed = support::events_for(&env, "ConfigMap", "adversarial").await;
    assert!(
        resumed
            .iter()
            .any(|e| e.message.as_deref().unwrap_or("").starts_with("resumed")),
        "{resumed:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_of_twenty_quick_settings_updates_wins() {
    let _turn = serial().await;
    let (env, host) = memcached_fleet("f-settings", 3).await;
    let wasm = memcached_wasm();
    for i in 0..20 {
        let settings = format!("image: memcached:1.6.{i}\n");
        env.put_plugin_only("memcached", &wasm, Some(&settings))
            .await;
    }
    let last = "memcached:1.6.19";
    let deployments = env.ns.api::<Deployment>();
    let images = || async {
        let list = deployments.list(&ListParams::default()).await?;
        Ok::<_, kube::Error>(
            list.items
                .iter()
                .map(|d| {
                    d.spec.template.spec.as_ref().map_or(String::new(), |p| {
                        p.containers[0].image.clone().unwrap_or_default()
                    })
                })
                .collect::<Vec<_>>(),
        )
    };
    testenv::wait_until("every Deployment on the last image", TIMEOUT, images, |i| {
        i.len() == 3 && i.iter().all(|i| i == last)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", host.logs()));
    // A load of an older update finishing late must not take over afterwards.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = images().await.unwrap();
    assert!(now.iter().all(|i| i == last), "{now:?}");
}
