//! Safe rollout: revisions kept as ControllerRevisions, a canary with an automatic health
//! gate and rollback, a failover in the middle of a canary, and `wasmop rollout undo` after a
//! restart and an overwritten ConfigMap.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use wasmop::plugin::revision::{Phase, Revisions};
use wasmop::plugin::rollout::{
    self, STEP_SECONDS_ANNOTATION, STEPS_ANNOTATION, STRATEGY_ANNOTATION,
};

use support::{Env, TIMEOUT, wait_event};

/// Parents of the canary test; `WASMOP_CANARY_PARENTS` changes it for the numbers in
/// `docs/benchmarks.md`.
fn parents() -> usize {
    std::env::var("WASMOP_CANARY_PARENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// Puts the plugin ConfigMap as `wasmop package` builds it, with `annotations`.
async fn put(env: &Env, wasm: &[u8], settings: Option<&str>, annotations: &[(&str, &str)]) {
    let mut cm: ConfigMap = wasmop::plugin::package::package(
        wasm,
        "memcached",
        env.name(),
        settings.map(str::to_owned),
    )
    .expect("a plugin ConfigMap")
    .configmap;
    let ann = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in annotations {
        ann.insert(k.to_string(), v.to_string());
    }
    let api: Api<ConfigMap> = env.ns.api();
    api.patch(
        "memcached",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("apply plugin ConfigMap");
}

fn canary(step_seconds: &'static str) -> [(&'static str, &'static str); 3] {
    [
        (STRATEGY_ANNOTATION, "canary"),
        (STEPS_ANNOTATION, "10,50,100"),
        (STEP_SECONDS_ANNOTATION, step_seconds),
    ]
}

fn parent(i: usize) -> String {
    format!("mc-{i:03}")
}

/// Each parent's `Ready` condition: (status, message).
async fn ready(env: &Env) -> BTreeMap<String, (String, String)> {
    let list = env.memcacheds().list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .map(|o| {
            let c = o.data["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
                .unwrap_or_default();
            (
                o.metadata.name.unwrap_or_default(),
                (
                    c["status"].as_str().unwrap_or_default().to_owned(),
                    c["message"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect()
}

/// Waits until all `n` parents were last reconciled, successfully, by revision `number`.
async fn wait_all_on(env: &Env, n: usize, number: i64, host: &str) {
    let suffix = format!(", revision {number}");
    testenv::wait_until(
        &format!("all {n} parents Ready, reconciled by revision {number}"),
        TIMEOUT,
        || async { Ok::<_, kube::Error>(ready(env).await) },
        |all| {
            all.len() == n
                && all
                    .values()
                    .all(|(s, m)| s == "True" && m.ends_with(&suffix))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{host}"));
}

async fn phases(env: &Env) -> Vec<(i64, Phase)> {
    Revisions::new(env.client.clone(), env.name())
        .list("memcached")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.number, r.phase))
        .collect()
}

/// The parents a failure of revision `number` was recorded on (Warning Events).
async fn failed_on(env: &Env, number: i64) -> BTreeSet<String> {
    let needle = format!(", revision {number} failed");
    support::events(env)
        .await
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Memcached")
                && e.message.as_deref().is_some_and(|m| m.contains(&needle))
        })
        .filter_map(|e| e.involved_object.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_canary_rolls_back_at_its_first_step_and_a_good_one_survives_a_failover() {
    let env = Env::new("e2e-canary").await;
    let n = parents();
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    env.grant("memcached", &v2, &[]).await;
    // The first revision goes live at once whatever the strategy: there is nothing to compare.
    put(&env, &v1, None, &canary("2")).await;
    let args = ["--leader-elect"];
    let a = env.host().pod("wasmop-a").args(&args).start();
    let b = env.host().pod("wasmop-b").args(&args).start();
    for i in 0..n {
        env.put_memcached(&parent(i), 0).await;
    }
    let logs = || a.logs() + &b.logs();
    wait_all_on(&env, n, 1, &logs()).await;
    assert_eq!(phases(&env).await, [(1, Phase::Live)]);

    // A bad revision: settings the plugin cannot read, so each of its reconciles fails.
    let started = Instant::now();
    put(&env, &v1, Some("image: [1, 2]\n"), &canary("2")).await;
    let event = wait_event(&env, "ConfigMap", "memcached", "RolloutAborted").await;
    let aborted = started.elapsed();
    let note = event.message.unwrap_or_default();
    assert!(
        note.contains("revision 2") && note.contains("at step 1 (10%)"),
        "{note}"
    );
    assert_eq!(phases(&env).await, [(1, Phase::Live), (2, Phase::Aborted)]);
    let share: BTreeSet<String> = (0..n)
        .map(parent)
        .filter(|p| rollout::serves(10, Some(env.name()), p))
        .collect();
    let touched = failed_on(&env, 2).await;
    assert!(!touched.is_empty(), "the candidate ran");
    assert!(
        touched.is_subset(&share),
        "only the first step's parents ({share:?}) may see the candidate; it touched {touched:?}"
    );
    wait_all_on(&env, n, 1, &logs()).await;
    let rolled_back = started.elapsed();
    println!(
        "measured: bad canary over {n} parents aborted {aborted:?} after the ConfigMap update, all back on revision 1 at {rolled_back:?}; {} of {} first-step parents touched",
        touched.len(),
        share.len()
    );
    // Nothing of the bad revision reached a child.
    let deployments = env
        .ns
        .api::<Deployment>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(deployments.items.len(), n);

    // A good revision, with a failover at its second step.
    let started = Instant::now();
    put(&env, &v2, None, &canary("3")).await;
    let client = Revisions::new(env.client.clone(), env.name());
    testenv::wait_until(
        "revision 3 to reach its second step",
        TIMEOUT,
        || async { client.list("memcached").await.map_err(|e| e.to_string()) },
        |all| all.iter().any(|r| r.number == 3 && r.step == Some(1)),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost logs:\n{}", logs()));
    let leader_was_a = a.logs().contains("became the leader");
    let (leader, standby) = if leader_was_a { (a, b) } else { (b, a) };
    let status = leader.terminate();
    assert!(status.success(), "the leader stops cleanly: {status:?}");
    testenv::wait_until(
        "revision 3 to be promoted by the new leader",
        TIMEOUT,
        || async { Ok::<_, String>(phases(&env).await) },
        |p| p == &[(1, Phase::Retired), (2, Phase::Aborted), (3, Phase::Live)],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nnew leader log:\n{}", standby.logs()));
    assert!(
        standby
            .logs()
            .contains("still serves 50% of parents (step 2 of 3)"),
        "the new leader continued from the step recorded in the cluster:\n{}",
        standby.logs()
    );
    wait_all_on(&env, n, 3, &standby.logs()).await;
    println!(
        "measured: good canary over {n} parents (3 steps of 3 s, failover at step 2) promoted and converged in {:?}",
        started.elapsed()
    );
    let services = env
        .ns
        .api::<Service>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        services.items.len(),
        n,
        "every parent has the second build's Service"
    );
    assert_eq!(
        phases(&env).await,
        [(1, Phase::Retired), (2, Phase::Aborted), (3, Phase::Live)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn undo_restores_the_previous_revision_after_a_restart_and_an_overwritten_configmap() {
    let env = Env::new("e2e-undo").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    env.grant("memcached", &v2, &[]).await;
    put(&env, &v1, None, &[]).await;
    let host = env.start_host();
    for name in ["one", "two", "three"] {
        env.put_memcached(name, 0).await;
    }
    wait_all_on(&env, 3, 1, &host.logs()).await;
    // The ConfigMap is overwritten with the second build: only its revision keeps the first.
    put(&env, &v2, None, &[]).await;
    wait_all_on(&env, 3, 2, &host.logs()).await;
    let services = env.ns.api::<Service>();
    assert_eq!(
        services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    host.kill();

    let host = env.start_host();
    let (ok, out) = env.wasmop(&["rollout", "undo", "memcached"]);
    assert!(ok, "{out}");
    assert!(out.contains("holds revision 1 again"), "{out}");
    // Made live again, revision 1 comes back as revision 3, as a Deployment's undo does.
    wait_all_on(&env, 3, 3, &host.logs()).await;
    testenv::wait_until(
        "the first build to prune the second build's Services",
        TIMEOUT,
        || async {
            services
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len())
        },
        |n| *n == 0,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    // The phases are recorded right after the swap, which the parents may show first.
    testenv::wait_until(
        "revision 1 to be live again as revision 3",
        TIMEOUT,
        || async { Ok::<_, String>(phases(&env).await) },
        |p| p == &[(2, Phase::Retired), (3, Phase::Live)],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    let (ok, history) = env.wasmop(&["rollout", "history", "memcached"]);
    assert!(ok, "{history}");
    let rows: Vec<Vec<&str>> = history
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().take(3).collect())
        .collect();
    assert_eq!(
        rows,
        [vec!["2", "retired", "0.2.0"], vec!["3", "live", "0.1.0"]],
        "{history}"
    );
    let (ok, status) = env.wasmop(&["rollout", "status", "memcached"]);
    assert!(
        ok && status.contains("live:      revision 3 (0.1.0"),
        "{status}"
    );
    let (ok, none) = env.wasmop(&["rollout", "abort", "memcached"]);
    assert!(
        !ok && none.contains("no canary of plugin memcached is running"),
        "{none}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_from_the_plane_then_replay_the_same_build_and_the_second() {
    let env = Env::new("e2e-capture").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    env.grant("memcached", &v1, &[]).await;
    put(&env, &v1, None, &[]).await;
    let host = env.start_host();
    for name in ["one", "two"] {
        env.put_memcached(name, 1).await;
    }
    for name in ["one", "two"] {
        env.wait_nodes(name, 1).await;
    }
    let dir = test_artifacts::workspace_root()
        .join("target/e2e-logs")
        .join(format!("capture-{}", env.name()));
    let dir_s = dir.to_str().unwrap();
    let ns = env.name().to_owned();
    let (ok, out) = env.wasmop(&[
        "capture",
        "memcached",
        "--out",
        dir_s,
        "--watch-namespace",
        &ns,
    ]);
    assert!(ok, "{out}\nhost log:\n{}", host.logs());
    assert!(
        out.contains("captured 2 parents of plugin memcached (revision 1"),
        "{out}"
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{ns}_one.json"))).unwrap())
            .unwrap();
    // The request holds what the host's caches would: the Deployment and the pod.
    assert_eq!(record["request"]["parent"]["metadata"]["name"], "one");
    assert_eq!(
        record["request"]["children"]["Deployment.apps/v1"]
            .as_object()
            .map(|m| m.len()),
        Some(1),
        "{record}"
    );
    assert_eq!(
        record["request"]["related"]["Pod.v1"]
            .as_object()
            .map(|m| m.len()),
        Some(1),
        "{record}"
    );

    let replay = |build: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_wasmop"))
            .args(["replay", "--plugin", build, dir_s])
            .output()
            .expect("run wasmop replay");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, same) = replay(test_artifacts::MEMCACHED);
    assert!(ok, "{same}");
    assert!(
        same.contains("all 2 parents answered as revision 1"),
        "{same}"
    );
    let (ok, second) = replay(test_artifacts::MEMCACHED_V2);
    assert!(!ok, "the second build answers differently:\n{second}");
    assert!(
        second.contains(&format!("{ns}/one:\n"))
            && second.contains(&format!("children.Service {ns}/one: (none) → {{"))
            && second.contains("2 of 2 parents answered differently from revision 1"),
        "{second}"
    );
}
