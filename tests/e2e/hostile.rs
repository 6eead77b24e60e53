//! Plugins that try to reach past their own children, next to Memcached on one host: a rival
//! on Memcached's kind, a plugin on Events, a flood of 10,000 children, an alias bomb in the
//! settings, and a plugin on Deployments with ReplicaSet children. Each is bounded with a clear
//! error, and Memcached keeps reconciling and keeps its Deployment.

use std::time::Instant;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use support::{Env, TIMEOUT, http_get, put_probe, rss_mib, wait_event, wait_not_ready};

/// The message of the Event `reason` on plugin ConfigMap `configmap`.
async fn wait_notice(env: &Env, configmap: &str, reason: &str) -> String {
    let event = wait_event(env, "ConfigMap", configmap, reason).await;
    event.message.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_plugins_are_bounded_while_memcached_reconciles() {
    let (env, host) = Env::with_memcached("e2e-hostile").await;
    env.memcached_ready("cache", 2).await;
    let deployments = env.ns.api::<Deployment>();
    let before = deployments.get("cache").await.unwrap();

    // A rival on Memcached (the second build, under another ConfigMap) is refused at load.
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    env.put_plugin("rival", &v2, None).await;
    let refused = wait_notice(&env, "rival", "LoadFailed").await;
    assert!(refused.contains("ConfigMap memcached"), "{refused}");

    // A plugin on Events would be fed the host's own Events about it: refused at load.
    let on_events = test_artifacts::read(test_artifacts::EVENT_PARENT);
    env.put_plugin("events", &on_events, None).await;
    let refused = wait_notice(&env, "events", "LoadFailed").await;
    assert!(
        refused.contains("events.k8s.io/v1 Event") && refused.contains("is an Event"),
        "{refused}"
    );

    // A flood of children is refused whole: not one is created.
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    env.put_plugin("flood", &adversarial, Some("mode: flood\n"))
        .await;
    let probes = put_probe(&env, "f").await;
    let ready = wait_not_ready(&probes, "f", &host).await;
    assert_eq!(ready["reason"], "InvalidPluginOutput", "{ready}");
    assert!(
        ready["message"].as_str().unwrap().contains("500"),
        "names the cap: {ready}"
    );
    let theirs = ListParams::default().labels("wasmop.io/managed-by=adversarial");
    let made = env.ns.api::<ConfigMap>().list(&theirs).await.unwrap();
    assert_eq!(made.items.len(), 0, "no child of the flood was created");
    // The host stays responsive and its memory bounded.
    let addr = host.http_addr().await;
    let started = Instant::now();
    let (code, _) = http_get(&addr, "/healthz").await;
    let healthz = started.elapsed();
    assert_eq!(code, 200);
    let (peak, now) = rss_mib(host.pid());
    println!(
        "measured: /healthz in {healthz:?} during the flood; host RSS {now} MiB, peak {peak} MiB"
    );
    assert!(peak < 512, "the host's peak RSS stays bounded: {peak} MiB");

    // Settings that would expand without bound are refused at load.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let row = vec![format!("*a{}", i - 1); 10].join(", ");
        bomb.push_str(&format!("a{i}: &a{i} [{row}]\n"));
    }
    env.put_plugin_only("bomb", &adversarial, Some(&bomb)).await;
    let refused = wait_notice(&env, "bomb", "LoadFailed").await;
    assert!(refused.contains("settings.yaml"), "{refused}");

    // Memcached was neither disturbed nor taken over.
    env.memcached_ready("cache", 3).await;
    let after = deployments.get("cache").await.unwrap();
    assert_eq!(after.metadata.uid, before.metadata.uid, "never deleted");
    let labels = after.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("wasmop.io/managed-by").map(String::as_str),
        Some("memcached")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_on_deployments_leaves_the_deployment_controllers_replicasets_alone() {
    let env = Env::new("e2e-builtin").await;
    let deployments = env.ns.api::<Deployment>();
    let web = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}},
        },
    });
    deployments
        .patch("web", &PatchParams::apply("e2e"), &Patch::Apply(&web))
        .await
        .unwrap();
    let replicasets = env.ns.api::<ReplicaSet>();
    let theirs = testenv::wait_until(
        "the Deployment controller's ReplicaSet for web",
        TIMEOUT,
        || async { replicasets.list(&ListParams::default()).await },
        |l| !l.items.is_empty(),
    )
    .await
    .unwrap()
    .items;
    let plugin = test_artifacts::read(test_artifacts::DEPLOYMENT_PLUGIN);
    env.put_plugin("deployment-plugin", &plugin, None).await;
    let host = env.start_host();
    // Reconciled (the plugin's Event), then again after a change. A built-in kind's status
    // is its own controller's: the host writes none.
    wait_event(&env, "Deployment", "web", "Reconciled").await;
    let touch = json!({"metadata": {"annotations": {"touched": "yes"}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let web = deployments.get("web").await.unwrap();
    let conditions = web.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .all(|c| c.type_.as_deref() != Some("Ready")),
        "no Ready condition written into a Deployment: {conditions:?}"
    );
    for rs in theirs {
        let name = rs.metadata.name.clone().unwrap();
        let now = replicasets.get_opt(&name).await.unwrap();
        assert_eq!(
            now.and_then(|r| r.metadata.uid),
            rs.metadata.uid,
            "ReplicaSet {name} is left alone"
        );
    }
    assert!(!host.logs().contains("prune"), "nothing was pruned");
}
