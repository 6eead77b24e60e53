//! Bad input loses nothing: a garbage module or an out-of-range annotation keeps the last good
//! version running, a plugin that traps on every call does not slow the others (nor retries
//! in a loop), one that sleeps blocks nothing, and no plugin takes over an object it did not
//! make.

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use support::{
    Env, TIMEOUT, events_for, http_get, probe_resource, put_probe, wait_configmap, wait_event,
    wait_not_ready,
};

/// The README's two install paths mixed: a second module key makes the ConfigMap unreadable
/// (the running version stays, and the Event says so); taking it out again is a recovery, and
/// an Event says that too.
#[tokio::test(flavor = "multi_thread")]
async fn a_repaired_configmap_is_announced_as_a_recovery() {
    let env = Env::new("e2e-recovered").await;
    let wasm = env.put_memcached_plugin().await;
    let host = env.start_host();
    wait_event(&env, "ConfigMap", "memcached", "Loaded").await;
    let configmaps: Api<ConfigMap> = env.ns.api();
    let raw = k8s_openapi::ByteString(wasm.clone());
    let both = json!({"binaryData": {"memcached.wasm": raw}});
    configmaps
        .patch("memcached", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    let failed = wait_event(&env, "ConfigMap", "memcached", "LoadFailed").await;
    let message = failed.message.unwrap_or_default();
    assert!(message.contains("more than one module key"), "{message}");
    assert!(message.contains("still running memcached"), "{message}");
    // `kubectl get wasmopplugins` says so too, and what still runs.
    let shown = wait_shown(&env, "Failed").await;
    assert_eq!(shown["version"], "memcached 0.1.0", "{shown}");
    assert_eq!(shown["reason"], "LoadFailed", "{shown}");
    assert_eq!(shown["rollout"], "Live", "{shown}");
    let one = json!({"binaryData": {"memcached.wasm": null}});
    configmaps
        .patch("memcached", &PatchParams::default(), &Patch::Merge(&one))
        .await
        .unwrap();
    let recovered = wait_event(&env, "ConfigMap", "memcached", "Recovered").await;
    assert_eq!(recovered.type_.as_deref(), Some("Normal"));
    let message = recovered.message.unwrap_or_default();
    assert!(
        message.contains("readable again"),
        "{message}\n{}",
        host.logs()
    );
    let shown = wait_shown(&env, "Running").await;
    assert_eq!(shown["reason"], "Recovered", "{shown}");
    assert!(shown["revision"].as_i64().is_some(), "{shown}");
    // And it reconciles as before.
    env.memcached_ready("cache", 1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_module_keeps_the_last_good_version() {
    let env = Env::new("e2e-garbage").await;
    let wasm = env.put_memcached_plugin().await;
    let mut host = env.start_host();
    env.memcached_ready("cache", 1).await;

    env.put_plugin("memcached", b"this is not webassembly", None)
        .await;
    let warning = testenv::wait_until(
        "a Warning Event on the plugin ConfigMap",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(events_for(&env, "ConfigMap", "memcached").await) },
        |events| events.iter().any(|e| e.type_.as_deref() == Some("Warning")),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    let warning = warning
        .iter()
        .find(|e| e.type_.as_deref() == Some("Warning"))
        .unwrap();
    assert_eq!(warning.reason.as_deref(), Some("LoadFailed"));
    let message = warning.message.clone().unwrap_or_default();
    assert!(
        message.contains("still running memcached"),
        "the Event says the old version runs: {message}"
    );

    // The old version still reconciles.
    env.memcached_ready("cache", 2).await;
    assert!(host.alive());

    // An annotation out of its range (this one used to overflow the controller's clock) is
    // refused at load, naming the annotation; the running version stays.
    env.put_plugin("memcached", &wasm, None).await;
    let configmaps: Api<ConfigMap> = env.ns.api();
    let huge =
        json!({"metadata": {"annotations": {"wasmop.io/resync-seconds": "9223372036854775808"}}});
    configmaps
        .patch("memcached", &PatchParams::default(), &Patch::Merge(&huge))
        .await
        .unwrap();
    testenv::wait_until(
        "a LoadFailed Event naming wasmop.io/resync-seconds",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(events_for(&env, "ConfigMap", "memcached").await) },
        |events| {
            events.iter().any(|e| {
                e.reason.as_deref() == Some("LoadFailed")
                    && e.message.as_deref().is_some_and(|m| {
                        m.contains("annotation wasmop.io/resync-seconds=\"9223372036854775808\": expected an integer from 1 to 2592000")
                    })
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    env.memcached_ready("cache", 1).await;
    assert!(host.alive());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trapping_plugin_does_not_disturb_the_others() {
    let env = Env::new("e2e-two").await;
    let memcached = test_artifacts::read(test_artifacts::MEMCACHED);
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    env.put_plugin("memcached", &memcached, None).await;
    env.put_plugin("adversarial", &adversarial, Some("mode: panic\n"))
        .await;
    let mut host = env.start_host();

    let probes = put_probe(&env, "p").await;
    env.memcached_ready("cache", 3).await;

    // The trapping plugin's parent says why it is not ready, and so does an Event.
    let ready = wait_not_ready(&probes, "p", &host).await;
    assert_eq!(ready["reason"], "PluginTrapped", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("adversarial 0.1.0"),
        "{ready}"
    );
    // Events are written off the reconcile path, so this one may follow the status.
    testenv::wait_until(
        "a Warning Event on Probe p",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(events_for(&env, "Probe", "p").await) },
        |events| events.iter().any(|e| e.type_.as_deref() == Some("Warning")),
    )
    .await
    .unwrap();

    // A trap is a guest fault: the same plugin traps again on the same input, so it is not
    // retried on the short backoff (250 ms doubling would have run it 4 times in 3 s).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let (_, metrics) = http_get(&host.http_addr().await, "/metrics").await;
    let traps: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("wasmop_reconcile_errors_total{") && l.contains("plugin=\"adversarial\"")
        })
        .collect();
    assert_eq!(
        traps,
        ["wasmop_reconcile_errors_total{plugin=\"adversarial\",reason=\"PluginTrapped\"} 1"],
        "one failed reconcile, not retried\nhost log:\n{}",
        host.logs()
    );

    // Meanwhile memcached keeps serving.
    env.memcached_ready("cache", 1).await;
    assert!(host.alive());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_of_the_same_name_is_never_taken_over() {
    use k8s_openapi::api::apps::v1::Deployment;
    let env = Env::new("e2e-conflict").await;
    let deployments = env.ns.api::<Deployment>();
    // A user's Deployment that happens to have the name the plugin will want.
    let theirs = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "cache", "labels": {"owner": "someone-else"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {"metadata": {"labels": {"app": "theirs"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}},
        },
    });
    deployments
        .patch(
            "cache",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(&theirs),
        )
        .await
        .unwrap();
    let before = deployments.get("cache").await.unwrap();
    env.put_memcached_plugin().await;
    let host = env.start_host();
    env.put_memcached("cache", 3).await;

    // The parent says why, and an Event names the object.
    let memcacheds = env.memcacheds();
    let ready = wait_not_ready(&memcacheds, "cache", &host).await;
    assert_eq!(ready["reason"], "ChildConflict", "{ready}");
    let message = ready["message"].as_str().unwrap().to_string();
    assert!(
        message.contains(&format!(
            "Deployment {}/cache exists and is not controlled by this parent",
            env.name()
        )),
        "{message}"
    );
    let conflict = wait_event(&env, "Memcached", "cache", "ChildConflict").await;
    assert_eq!(conflict.type_.as_deref(), Some("Warning"));
    // The conflict is retried on backoff; its repeats fold into that one Event's series, even
    // though the first failure's status write changed the parent's resourceVersion.
    let is_conflict = |e: &Event| e.reason.as_deref() == Some("ChildConflict");
    let events = testenv::wait_until(
        "the ChildConflict Event to count a repeat",
        TIMEOUT,
        || async { Ok::<_, kube::Error>(events_for(&env, "Memcached", "cache").await) },
        |events| {
            events.iter().any(|e| {
                is_conflict(e) && e.series.as_ref().and_then(|s| s.count).unwrap_or(0) >= 2
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    let conflicts: Vec<_> = events.iter().filter(|e| is_conflict(e)).collect();
    assert_eq!(conflicts.len(), 1, "one Event with a series: {conflicts:?}");

    // Their Deployment is exactly as it was: no write, no owner, same spec.
    let after = deployments.get("cache").await.unwrap();
    assert_eq!(after.metadata.owner_references, None, "not adopted");
    assert_eq!(after.spec, before.spec, "not overwritten");
    assert_eq!(after.metadata.generation, before.metadata.generation);
    // Deleting the parent leaves it in place.
    memcacheds
        .delete("cache", &Default::default())
        .await
        .unwrap();
    testenv::wait_until(
        "Memcached cache to be gone",
        TIMEOUT,
        || async { memcacheds.get_opt("cache").await },
        Option::is_none,
    )
    .await
    .unwrap();
    assert!(
        deployments.get_opt("cache").await.unwrap().is_some(),
        "their Deployment stays"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleeping_plugin_neither_blocks_its_call_nor_the_hosts_shutdown() {
    let env = Env::new("e2e-sleep").await;
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    // Every reconcile sleeps for a minute, as far as the guest knows.
    env.put_plugin("adversarial", &adversarial, Some("mode: sleep\n"))
        .await;
    let host = env.start_host();
    put_probe(&env, "p").await;
    // The call returns at once (the guest's clock did not move) and its child is applied.
    let child = wait_configmap(&env, "p", &host).await;
    assert_eq!(child.data.unwrap()["sleptNanos"], "0");

    let stopping = std::time::Instant::now();
    let status = host.terminate();
    let took = stopping.elapsed();
    println!("measured: host with a sleeping plugin exited {took:?} after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}

/// A Probe nested `depth` levels deep under `spec.deep`: valid to the API server, deeper than
/// serde_json decodes.
fn deep_probe(name: &str, depth: usize) -> Value {
    let mut deep = json!("bottom");
    for _ in 0..depth {
        deep = json!([deep]);
    }
    json!({
        "apiVersion": "test.wasmop.io/v1",
        "kind": "Probe",
        "metadata": {"name": name},
        "spec": {"deep": deep},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undecodable_parent_affects_only_itself_across_a_restart() {
    let env = Env::new("e2e-deep").await;
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    env.put_plugin("adversarial", &adversarial, None).await;
    put_probe(&env, "before").await;
    // Created through the host's own decoding: the API server's answer is as deep.
    let lenient: Api<wasmop::watch::Full> =
        Api::namespaced_with(env.client.clone(), env.name(), &probe_resource());
    lenient
        .patch(
            "deep",
            &PatchParams::apply("e2e"),
            &Patch::Apply(&deep_probe("deep", 200)),
        )
        .await
        .expect("the API server stores a 200-deep Probe");
    let host = env.start_host();
    let configmaps = env.ns.api::<ConfigMap>();
    wait_configmap(&env, "before", &host).await;

    // The deep one says why it is not reconciled, and has no child. Its status is read alone:
    // the whole object would not decode here either.
    #[derive(serde::Deserialize)]
    struct StatusOnly {
        #[serde(default)]
        status: Value,
    }
    let path = format!(
        "/apis/test.wasmop.io/v1/namespaces/{}/probes/deep",
        env.name()
    );
    let status = testenv::wait_until(
        "Probe deep to be marked Ready=False",
        TIMEOUT,
        || async {
            let request = http::Request::get(&path).body(Vec::new()).unwrap();
            env.client
                .request::<StatusOnly>(request)
                .await
                .map(|s| s.status)
        },
        |status| status["conditions"][0]["status"] == "False",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    let ready = &status["conditions"][0];
    assert_eq!(ready["reason"], "Undecodable", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("levels deep")),
        "{ready}"
    );
    assert!(configmaps.get_opt("deep").await.unwrap().is_none());
    assert!(host.logs().contains("object cannot be decoded"));

    // After a restart the kind lists again, the deep Probe in it, and new Probes reconcile.
    host.kill();
    let host = env.start_host();
    put_probe(&env, "after").await;
    wait_configmap(&env, "after", &host).await;
    assert!(configmaps.get_opt("deep").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_impure_plugin_writes_its_child_once_however_often_it_runs() {
    let env = Env::new("e2e-impure").await;
    let adversarial = test_artifacts::read(test_artifacts::ADVERSARIAL);
    // The guest puts the wall clock, a random hash and a HashSet's order into its child.
    env.put_plugin("adversarial", &adversarial, Some("mode: impure\n"))
        .await;
    // Reconciled every second, so a real clock would change the child at every call.
    let configmaps: Api<ConfigMap> = env.ns.api();
    let resync = json!({"metadata": {"annotations": {"wasmop.io/resync-seconds": "1"}}});
    configmaps
        .patch(
            "adversarial",
            &PatchParams::default(),
            &Patch::Merge(&resync),
        )
        .await
        .unwrap();
    let host = env.start_host();
    put_probe(&env, "p").await;
    let child = wait_configmap(&env, "p", &host).await;
    let data = child.data.clone().unwrap();
    assert_eq!(data["wallSeconds"], "946684800", "the fixed wall clock");
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let later = configmaps.get("p").await.unwrap();
    assert_eq!(
        later.metadata.resource_version, child.metadata.resource_version,
        "written once in six resyncs"
    );
    assert_eq!(later.data.unwrap(), data);
    // It did run again and again meanwhile.
    let (_, metrics) = http_get(&host.http_addr().await, "/metrics").await;
    let calls = testenv::metrics::samples(&metrics, "wasmop_reconcile_total")
        .into_iter()
        .find(|s| {
            s.labels.get("plugin").map(String::as_str) == Some("adversarial")
                && s.labels.get("result").map(String::as_str) == Some("success")
        })
        .unwrap_or_else(|| panic!("a reconcile count in:\n{metrics}"))
        .value;
    assert!(calls >= 3.0, "reconciled {calls} times");
    println!("measured: {calls} reconciles of Probe p, 1 write of its child");
}

/// Waits until `wasmopplugins/memcached` in the test's namespace says `state`; its status.
async fn wait_shown(env: &Env, state: &str) -> Value {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("wasmop.io", "v1alpha1", "WasmopPlugin"),
        "wasmopplugins",
    );
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(env.client.clone(), env.name(), &resource);
    testenv::wait_until(
        &format!("WasmopPlugin memcached to say {state}"),
        TIMEOUT,
        || api.get_opt("memcached"),
        |p| {
            p.as_ref()
                .is_some_and(|p| p.data["status"]["state"] == state)
        },
    )
    .await
    .unwrap()
    .expect("just seen")
    .data["status"]
        .clone()
}
