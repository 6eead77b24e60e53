//! A leader frozen past its Lease while a standby takes over, then resumed: it writes nothing
//! through its backlog and exits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;

use crate::fleet::{PARENTS, converged, memcached_wasm, scale, signal};
use crate::serial;
use support::{Env, TIMEOUT};

const LEADER: &str = "became the leader";

/// Each Deployment's `metadata.generation`: it moves with every write of its spec.
async fn generations(env: &Env) -> BTreeMap<String, i64> {
    let api = env.ns.api::<Deployment>();
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|d| {
            (
                d.metadata.name.unwrap_or_default(),
                d.metadata.generation.unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_leader_that_wakes_up_deposed_writes_nothing_and_exits() {
    let _turn = serial().await;
    let env = Env::new("f-leader").await;
    env.put_plugin("memcached", &memcached_wasm(), None).await;
    let args = ["--leader-elect"];
    let a = env.host().args(&args).start();
    let b = env.host().args(&args).start();
    let first = testenv::wait_for("a leader", TIMEOUT, || async {
        Ok::<_, String>([&a, &b].iter().position(|h| h.logs().contains(LEADER)))
    })
    .await
    .unwrap();
    let (mut old, new) = if first == 0 { (a, b) } else { (b, a) };
    scale(&env, PARENTS, 1).await;
    converged(&env, PARENTS, 1, &old).await;

    // Frozen with work queued: the fleet was just scaled.
    scale(&env, PARENTS, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(old.pid(), "STOP");
    let frozen = Instant::now();
    testenv::wait_for("the standby to take over", TIMEOUT, || async {
        Ok::<_, String>(new.logs().contains(LEADER).then_some(()))
    })
    .await
    .unwrap();
    let takeover = frozen.elapsed();
    converged(&env, PARENTS, 2, &new).await;
    // The old leader's backlog now wants size 2; the fleet moves on to 3 without it.
    scale(&env, PARENTS, 3).await;
    converged(&env, PARENTS, 3, &new).await;
    let settled = generations(&env).await;

    signal(old.pid(), "CONT");
    let resumed = Instant::now();
    let status = loop {
        if let Some(status) = old.exit_status() {
            break status;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(30),
            "the deposed leader still runs 30 s after resuming:\n{}",
            old.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let exited = resumed.elapsed();
    assert!(!status.success(), "a deposed leader exits with an error");
    let logs = old.logs();
    assert!(logs.contains("lost the leader Lease"), "{logs}");
    // Whatever it still reconciled, no spec write of its reached the server.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = generations(&env).await;
    let changed = settled
        .iter()
        .filter(|(k, g)| after.get(*k) != Some(g))
        .count();
    converged(&env, PARENTS, 3, &new).await;
    let refused = logs
        .matches("refused: this host does not hold the leader Lease")
        .count();
    println!(
        "measured: fault=\"leader frozen past its Lease\" takeover_s={:.1} exit_after_resume_s={:.1} deployments_written_after_takeover={changed} writes_refused_by_fence={refused}",
        takeover.as_secs_f64(),
        exited.as_secs_f64()
    );
    assert_eq!(changed, 0, "no Deployment written by the deposed leader");
    assert!(
        exited < Duration::from_secs(10),
        "exited {exited:?} after resuming"
    );
}

/// A leader killed outright leaves its Lease naming it; started again as the same pod (a
/// container restart), it must take its own Lease back and reconcile, not exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_killed_and_restarted_as_the_same_pod_leads_again() {
    let _turn = serial().await;
    let env = Env::new("f-relead").await;
    env.put_plugin("memcached", &memcached_wasm(), None).await;
    let args = ["--leader-elect"];
    let first = env.host().pod("wasmop-0").args(&args).start();
    testenv::wait_for("the first run to lead", TIMEOUT, || async {
        Ok::<_, String>(first.logs().contains(LEADER).then_some(()))
    })
    .await
    .unwrap();
    scale(&env, 20, 1).await;
    converged(&env, 20, 1, &first).await;
    first.kill();

    let mut again = env.host().pod("wasmop-0").args(&args).start();
    let restarted = Instant::now();
    scale(&env, 20, 2).await;
    converged(&env, 20, 2, &again).await;
    let took = restarted.elapsed();
    assert!(
        again.alive(),
        "the restarted leader still runs:\n{}",
        again.logs()
    );
    assert!(again.logs().contains(LEADER), "{}", again.logs());
    println!(
        "measured: fault=\"leader SIGKILLed, restarted as the same pod\" converge_s={:.1}",
        took.as_secs_f64()
    );
}
