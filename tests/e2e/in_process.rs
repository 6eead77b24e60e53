//! The host started in-process through the library's entry point ([`wasmop::Host`]), as an
//! embedder or a test would: it binds free ports it reports, loads the plugin, reconciles,
//! and stops when its shutdown future resolves; and the registry's states as the plugin's
//! ConfigMap changes under it.

use wasmop::plugin::{State, Status};
use wasmop::{Host, HostConfig};

use support::{Env, TIMEOUT, http_get};

fn config(env: &Env) -> HostConfig {
    HostConfig {
        namespace: env.name().to_string(),
        watch_namespace: Some(env.name().to_string()),
        probe_addr: "127.0.0.1:0".parse().unwrap(),
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        ..HostConfig::default()
    }
}

/// A host running in a task until [`Running::stop`].
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    fn start(host: Host) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(host.run(async {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    /// Resolves the host's shutdown future; it must then stop cleanly.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(TIMEOUT, self.task)
            .await
            .expect("the host stops after its shutdown future resolves")
            .expect("host task")
            .expect("a clean stop");
    }
}

/// Waits until the registry reports `configmap` as `pred` says; returns its status.
async fn plugin_state(
    plugins: &mut tokio::sync::watch::Receiver<Vec<Status>>,
    configmap: &str,
    what: &str,
    pred: impl Fn(&Status) -> bool,
) -> Status {
    let found = tokio::time::timeout(
        TIMEOUT,
        plugins.wait_for(|all| all.iter().any(|p| p.configmap == configmap && pred(p))),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {configmap} to be {what}"))
    .expect("plugin status");
    found
        .iter()
        .find(|p| p.configmap == configmap && pred(p))
        .cloned()
        .expect("just matched")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_registry_keeps_the_last_good_version_through_a_bad_one() {
    let env = Env::new("e2e-in-process-registry").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    env.put_plugin("memcached", &v1, None).await;
    let host = Host::new(env.client.clone(), config(&env))
        .await
        .expect("host");
    let mut plugins = host.plugins();
    let mut ready = host.ready();
    let running_host = Running::start(host);
    let running = |version: &'static str| {
        move |p: &Status| {
            p.state == State::Running
                && p.running
                    .as_deref()
                    .is_some_and(|r| r.starts_with(&format!("memcached {version} (sha256:")))
        }
    };
    plugin_state(&mut plugins, "memcached", "running 0.1.0", running("0.1.0")).await;
    tokio::time::timeout(TIMEOUT, ready.wait_for(|r| *r))
        .await
        .expect("ready in time")
        .expect("readiness");

    // A bad version fails to load; the good one keeps running.
    env.put_plugin("memcached", b"not webassembly", None).await;
    let failed = plugin_state(&mut plugins, "memcached", "failed", |p| {
        matches!(p.state, State::Failed(_))
    })
    .await;
    let State::Failed(why) = &failed.state else {
        unreachable!()
    };
    assert!(why.contains("still running memcached 0.1.0"), "{why}");
    assert!(
        failed
            .running
            .as_deref()
            .unwrap()
            .starts_with("memcached 0.1.0")
    );

    // The next good version replaces it.
    env.put_plugin("memcached", &v2, None).await;
    plugin_state(&mut plugins, "memcached", "running 0.2.0", running("0.2.0")).await;

    running_host.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_process_host_reconciles_and_stops_on_shutdown() {
    let env = Env::new("e2e-in-process").await;
    env.put_memcached_plugin().await;
    let host = Host::new(env.client.clone(), config(&env))
        .await
        .expect("host");
    let probes = host.probe_addr().to_string();
    assert_ne!(host.probe_addr().port(), 0, "a real port was bound");
    // Equal addresses (port 0 included) share one listener.
    assert_eq!(host.metrics_addr(), host.probe_addr());
    let mut plugins = host.plugins();
    let running_host = Running::start(host);

    env.memcached_ready("cache", 2).await;
    let running = plugin_state(&mut plugins, "memcached", "running", |p| {
        p.state == State::Running
    })
    .await;
    assert!(
        running
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

    running_host.stop().await;
}
