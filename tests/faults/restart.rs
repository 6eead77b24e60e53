//! Restarts of the host itself: with nothing changed it writes nothing; killed while applying
//! it leaves no duplicate and no orphan.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::api::ListParams;

use crate::fleet::{
    self, PARENTS, converged, counter, measured, memcached_fleet, memcached_wasm, scale, writes,
};
use crate::serial;
use support::Env;

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_with_nothing_changed_writes_nothing() {
    let _turn = serial().await;
    let (env, host) = memcached_fleet("f-restart", PARENTS).await;
    assert!(host.terminate().success());

    let host = env.start_host();
    let started = Instant::now();
    // Every parent is reconciled for the initial list (and again for its Deployment's); wait
    // for that, then until no reconcile came for 3 s.
    let reconciles = [("plugin", "memcached"), ("result", "success")];
    testenv::wait_until(
        "every parent to be reconciled after the restart",
        Duration::from_secs(120),
        || async { Ok::<_, String>(counter(&host, "wasmop_reconcile_total", &reconciles).await) },
        |n| *n >= PARENTS as u64,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", host.logs()));
    let mut last = u64::MAX;
    loop {
        let now = counter(&host, "wasmop_reconcile_total", &reconciles).await;
        if now == last {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let deployments = writes(&host, "deployments").await;
    let statuses = writes(&host, "memcacheds/status").await;
    let all = writes(&host, "").await;
    measured(
        "host restart, nothing changed",
        started.elapsed(),
        all,
        &format!("deployments={deployments} statuses={statuses}"),
    );
    assert_eq!(deployments, 0, "no Deployment re-applied after a restart");
    assert_eq!(statuses, 0, "no status re-written after a restart");
    fleet::problems(&env, PARENTS, 1)
        .await
        .map(|p| assert!(p.is_empty(), "{p:?}"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_killed_while_applying_leaves_no_duplicate_and_no_orphan() {
    let _turn = serial().await;
    let env = Env::new("f-kill").await;
    env.put_plugin("memcached", &memcached_wasm(), None).await;
    let host = env.start_host();
    scale(&env, PARENTS, 1).await;
    // Kill it once a quarter of the Deployments exist: the rest are being applied.
    let deployments = env.ns.api::<Deployment>();
    testenv::wait_until(
        "a quarter of the Deployments",
        Duration::from_secs(120),
        || async {
            deployments
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len())
        },
        |n| *n >= PARENTS / 4,
    )
    .await
    .unwrap();
    let at_kill = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    host.kill();

    let host = env.start_host();
    let took = converged(&env, PARENTS, 1, &host).await;
    let all = writes(&host, "").await;
    measured(
        "host SIGKILLed mid-apply",
        took,
        all,
        &format!("deployments_at_kill={at_kill}"),
    );
    // Names alone rule out two Deployments per parent; these rule out a Deployment written
    // twice with different specs, or rolled out twice.
    let listed = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let rewritten: Vec<_> = listed
        .iter()
        .filter(|d| d.metadata.generation != Some(1))
        .map(|d| d.metadata.name.clone())
        .collect();
    assert!(
        rewritten.is_empty(),
        "Deployments whose spec was written again: {rewritten:?}"
    );
    let sets = env
        .ns
        .api::<ReplicaSet>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(sets.len(), PARENTS, "one ReplicaSet per Deployment");
}
