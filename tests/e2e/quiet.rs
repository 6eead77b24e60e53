//! Quiet at rest: every resync reconciles the parent, but a request byte-identical to the
//! last one that changed nothing is not sent to the plugin.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use support::{Env, Host, http_get};

/// (reconcile calls into the sandbox, reconciles skipped) so far.
async fn counts(host: &Host) -> (f64, f64) {
    let (_, text) = http_get(&host.http_addr().await, "/metrics").await;
    let sum = |name: &str, call: Option<&str>| -> f64 {
        testenv::metrics::samples(&text, name)
            .iter()
            .filter(|s| {
                s.labels.get("plugin").map(String::as_str) == Some("memcached")
                    && call.is_none_or(|c| s.labels.get("call").map(String::as_str) == Some(c))
            })
            .map(|s| s.value)
            .sum()
    };
    (
        sum(
            "wasmop_plugin_call_duration_seconds_count",
            Some("reconcile"),
        ),
        sum("wasmop_reconcile_skipped_total", None),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resync_at_rest_calls_no_plugin_and_a_change_still_does() {
    let env = Env::new("e2e-quiet").await;
    env.put_memcached_plugin().await;
    let configmaps: Api<ConfigMap> = env.ns.api();
    let resync = json!({"metadata": {"annotations": {"wasmop.io/resync-seconds": "1"}}});
    configmaps
        .patch("memcached", &PatchParams::default(), &Patch::Merge(&resync))
        .await
        .unwrap();
    let host = env.start_host();
    env.memcached_ready("cache", 1).await;
    // Let the last status write come back through the watch.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (calls, skipped) = counts(&host).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (calls_after, skipped_after) = counts(&host).await;
    println!(
        "measured: at rest over 6 s with a 1 s resync, {} sandbox calls, {} reconciles skipped",
        calls_after - calls,
        skipped_after - skipped
    );
    assert!(
        skipped_after - skipped >= 3.0,
        "resyncs ran and were skipped: {skipped} → {skipped_after}\nhost log:\n{}",
        host.logs()
    );
    assert_eq!(calls_after, calls, "no sandbox call at rest");

    // A change is a new request: the plugin is called and acts on it.
    env.memcached_ready("cache", 2).await;
    let (calls_changed, _) = counts(&host).await;
    assert!(
        calls_changed > calls_after,
        "the change was sent to the plugin"
    );
}
