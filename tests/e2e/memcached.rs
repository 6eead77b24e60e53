//! The Memcached operator, end to end: create, scale, drift, delete, and a host restart.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use support::{Env, TIMEOUT, http_get};

#[tokio::test(flavor = "multi_thread")]
async fn memcached_create_scale_drift_delete() {
    let env = Env::new("e2e-memcached").await;
    env.put_memcached_plugin().await;
    let host = env.host().args(&["--log-format", "json"]).start();

    // 1. size 3 → a Deployment of 3 owned by the CR, 3 pods Running, 3 names in status.nodes.
    let started = Instant::now();
    env.put_memcached("cache", 3).await;
    let nodes = env.wait_nodes("cache", 3).await;
    println!(
        "measured: Memcached created → status.nodes filled with 3 pods in {:?}",
        started.elapsed()
    );
    let cr = env.memcacheds().get("cache").await.unwrap();
    let deployment = env.wait_replicas("cache", 3).await;
    let owner = &deployment
        .metadata
        .owner_references
        .as_ref()
        .expect("owner references")[0];
    assert_eq!(owner.uid, cr.metadata.uid.clone().unwrap());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(owner.kind, "Memcached");
    let pods = env
        .ns
        .api::<Pod>()
        .list(&ListParams::default().labels("app=memcached,memcached_cr=cache"))
        .await
        .unwrap();
    let mut running: Vec<String> = pods
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    running.sort();
    assert_eq!(nodes, running, "status.nodes names the running pods");
    let container = &deployment.spec.template.spec.unwrap().containers[0];
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 11211);
    assert!(container.image.as_deref().unwrap().starts_with("memcached"));

    // What operators see: probes, metrics, and JSON logs whose reconcile spans name the plugin,
    // its digest and the parent.
    let addr = host.http_addr().await;
    testenv::wait_for("/readyz to answer 200", TIMEOUT, || async {
        Ok::<_, String>((http_get(&addr, "/readyz").await.0 == 200).then_some(()))
    })
    .await
    .unwrap();
    let (code, metrics) = http_get(&addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains(r#"wasmop_reconcile_total{plugin="memcached",result="success"}"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"wasmop_plugin_info{configmap="memcached",plugin="memcached",version="0.1.0",digest="sha256:"#), "{metrics}");
    assert!(
        metrics.contains("wasmop_plugin_call_duration_seconds_bucket"),
        "{metrics}"
    );
    let span = host
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|l| l["span"]["name"].eq("reconcile").then(|| l["span"].clone()))
        .expect("a JSON log line inside a reconcile span");
    assert_eq!(span["plugin"], "memcached");
    assert_eq!(span["namespace"], env.name());
    assert!(
        span["digest"].as_str().unwrap().starts_with("sha256:"),
        "{span}"
    );
    assert!(span["reason"].is_string(), "{span}");

    // 2. Scale up and down.
    env.put_memcached("cache", 5).await;
    env.wait_replicas("cache", 5).await;
    env.wait_nodes("cache", 5).await;
    env.put_memcached("cache", 2).await;
    env.wait_replicas("cache", 2).await;
    env.wait_nodes("cache", 2).await;

    // 3. Drift: replicas changed by hand are restored.
    let deployments = env.ns.api::<Deployment>();
    deployments
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    env.wait_replicas("cache", 2).await;

    // 4. Deleting the CR garbage-collects the Deployment and its pods.
    env.memcacheds()
        .delete("cache", &DeleteParams::background())
        .await
        .unwrap();
    testenv::wait_until(
        "the Deployment and pods of Memcached cache to be garbage-collected",
        TIMEOUT,
        || async {
            let d = deployments.get_opt("cache").await?;
            let p = env
                .ns
                .api::<Pod>()
                .list(&ListParams::default().labels("memcached_cr=cache"))
                .await?;
            Ok::<_, kube::Error>((d.is_some(), p.items.len()))
        },
        |(deployment, pods)| !deployment && *pods == 0,
    )
    .await
    .expect("garbage collection");
    drop(host);
}

#[tokio::test(flavor = "multi_thread")]
async fn host_killed_mid_run_converges_after_restart() {
    let (env, host) = Env::with_memcached("e2e-restart").await;
    env.memcached_ready("a", 2).await;

    // Kill it while it has work: a new CR and a scale land just before the SIGKILL.
    env.put_memcached("b", 1).await;
    env.put_memcached("a", 3).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    host.kill();

    let host = env.start_host();
    env.wait_nodes("a", 3).await;
    env.wait_nodes("b", 1).await;
    let deployments = env
        .ns
        .api::<Deployment>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut names: Vec<String> = deployments
        .items
        .iter()
        .map(|d| d.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b"], "one Deployment per CR, no duplicates");
    for d in &deployments.items {
        let owners = d.metadata.owner_references.as_ref().expect("owned");
        assert_eq!(
            owners.len(),
            1,
            "exactly one owner on {:?}",
            d.metadata.name
        );
        assert_eq!(
            owners[0].name,
            d.metadata.name.clone().unwrap(),
            "owned by its own CR"
        );
    }
    drop(host);
}
