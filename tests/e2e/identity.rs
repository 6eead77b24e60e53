//! Each plugin writes as its own ServiceAccount, so the cluster's RBAC bounds it: a plugin
//! whose identity may not write Secrets gets `Forbidden` on its Secret and keeps its
//! ConfigMap, recovers by itself once the right is granted, and can never mint a token
//! Secret; Memcached beside it keeps reconciling throughout.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use support::{Env, TIMEOUT, events_for, put_probe, wait_event, wait_not_ready};

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_can_write_only_what_its_service_account_may() {
    let env = Env::new("e2e-identity").await;
    env.put_memcached_plugin().await;
    // The adversarial plugin writes a ConfigMap and a Secret; its account may not touch Secrets.
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    env.grant("probe", &adversarial, &["secrets"]).await;
    env.put_plugin_only("probe", &adversarial, Some("mode: secret"))
        .await;
    let host = env.start_host();
    env.put_memcached("cache", 2).await;
    let probes = put_probe(&env, "p").await;

    let user = format!("system:serviceaccount:{}:wasmop-plugin-probe", env.name());
    let ready = wait_not_ready(&probes, "p", &host).await;
    assert_eq!(ready["reason"], "Forbidden", "{ready}");
    let message = ready["message"].as_str().unwrap().to_string();
    let who = format!("User \"{user}\"");
    for said in [who.as_str(), "resource \"secrets\"", "Secret"] {
        assert!(message.contains(said), "{said:?} in {message}");
    }
    // The Warning Event says the same: who, which verb, which resource.
    let event = wait_event(&env, "Probe", "p", "Forbidden").await;
    let note = event.message.unwrap_or_default();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        note.contains(&user) && note.contains("cannot") && note.contains("\"secrets\""),
        "{note}"
    );
    // Its ConfigMap said so at load: it runs without Secret rights.
    let warned = events_for(&env, "ConfigMap", "probe").await;
    let warned = warned
        .iter()
        .find(|e| e.reason.as_deref() == Some("Forbidden"))
        .and_then(|e| e.message.clone())
        .expect("a Forbidden Event on ConfigMap probe");
    assert!(
        warned.contains("runs, but")
            && warned.contains("wasmop-plugin-probe")
            && warned.contains("create, patch, delete secrets"),
        "{warned}"
    );
    // What it may write is written; the Secret is not there.
    let configmaps = env.ns.api::<ConfigMap>();
    let secrets = env.ns.api::<Secret>();
    assert!(
        configmaps.get_opt("p").await.unwrap().is_some(),
        "its ConfigMap is applied"
    );
    assert!(secrets.get_opt("p").await.unwrap().is_none());
    // The neighbour is unaffected.
    env.wait_replicas("cache", 2).await;
    env.wait_nodes("cache", 2).await;

    // Granted, it recovers on its own retry: nothing to restart or touch.
    env.grant("probe", &adversarial, &[]).await;
    testenv::wait_until(
        "Secret p, once the plugin's account may write it",
        TIMEOUT,
        || async { secrets.get_opt("p").await },
        Option::is_some,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));

    // Even with Secret rights, a ServiceAccount token is never a child.
    env.put_plugin_only("probe", &adversarial, Some("mode: token"))
        .await;
    testenv::wait_until(
        "Probe p to be refused for its token Secret",
        TIMEOUT,
        || async { probes.get("p").await },
        |p| {
            p.data["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter().any(|c| {
                    c["type"] == "Ready"
                        && c["reason"] == "InvalidPluginOutput"
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("kubernetes.io/service-account-token"))
                })
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    assert!(
        secrets.get_opt("p-token").await.unwrap().is_none(),
        "no token minted"
    );
    // Refused whole: what stood stays.
    assert!(secrets.get_opt("p").await.unwrap().is_some());
    env.memcached_ready("cache", 3).await;
}
