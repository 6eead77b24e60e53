//! The host started in-process through the library's entry point ([`wasmop::Host`]), as an
//! embedder or a test would: it binds free ports it reports, loads the plugin, reconciles,
//! and stops when its shutdown future resolves.

use wasmop::plugin::State;
use wasmop::{Host, HostConfig};

use crate::common::{Env, TIMEOUT, http_get};

#[tokio::test(flavor = "multi_thread")]
async fn in_process_host_reconciles_and_stops_on_shutdown() {
    let env = Env::new("e2e-in-process").await;
    let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
    env.put_plugin("memcached", &wasm, None).await;
    let config = HostConfig {
        namespace: env.name().to_string(),
        watch_namespace: Some(env.name().to_string()),
        probe_addr: "127.0.0.1:0".parse().unwrap(),
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        ..HostConfig::default()
    };
    let host = Host::new(env.client.clone(), config).await.expect("host");
    let probes = host.probe_addr().to_string();
    assert_ne!(host.probe_addr().port(), 0, "a real port was bound");
    // Equal addresses (port 0 included) share one listener.
    assert_eq!(host.metrics_addr(), host.probe_addr());
    let mut plugins = host.plugins();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(host.run(async {
        let _ = stopped.await;
    }));

    env.put_memcached("cache", 2).await;
    env.wait_nodes("cache", 2).await;
    let running = plugins
        .wait_for(|all| {
            all.iter()
                .any(|p| p.configmap == "memcached" && p.state == State::Running)
        })
        .await
        .expect("plugin status")
        .clone();
    assert!(
        running[0]
            .running
            .as_deref()
            .unwrap_or_default()
            .starts_with("memcached 0.1.0 (sha256:"),
        "{running:?}"
    );
    testenv::wait_for("/readyz to answer 200", TIMEOUT, || async {
        Ok::<_, String>((http_get(&probes, "/readyz").await.0 == 200).then_some(()))
    })
    .await
    .expect("ready");
    let (code, metrics) = http_get(&probes, "/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("wasmop_reconcile_total"), "{metrics}");

    stop.send(()).unwrap();
    tokio::time::timeout(TIMEOUT, run)
        .await
        .expect("the host stops after its shutdown future resolves")
        .expect("host task")
        .expect("a clean stop");
}
