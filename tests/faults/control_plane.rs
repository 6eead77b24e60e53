//! The control plane fails under the host: kube-apiserver and etcd killed and restarted
//! while it converges, and its watches sent back to a compacted past (410 Gone).

use std::time::{Duration, Instant};

use testenv::Part;

use crate::fleet::{PARENTS, converged, measured, memcached_fleet, scale, signal, writes};
use crate::{plane, serial};
use support::Env;

/// Kills `part` mid-convergence (just after the fleet was scaled to `size`), brings it back
/// after a second, and measures convergence from then.
async fn kill_and_restart(env: &Env, host: &support::Host, part: Part, size: i64) {
    let plane = plane().await;
    let before = writes(host, "").await;
    scale(env, PARENTS, size).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    plane.kill(part).expect("killed");
    tokio::time::sleep(Duration::from_secs(1)).await;
    plane.start_part(part).await.expect("restarted");
    let back = Instant::now();
    converged(env, PARENTS, size, host).await;
    let took = back.elapsed();
    measured(
        &format!("{} killed mid-convergence", part.name()),
        took,
        writes(host, "").await - before,
        "",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_and_etcd_restarts_and_compaction_lose_nothing() {
    let _turn = serial().await;
    let (env, host) = memcached_fleet("f-plane", PARENTS).await;

    // What scaling costs with no fault, both ways: the baseline of the rows below.
    for size in [2, 1] {
        let before = writes(&host, "").await;
        scale(&env, PARENTS, size).await;
        let took = converged(&env, PARENTS, size, &host).await;
        let direction = if size == 2 { "up" } else { "down" };
        measured(
            &format!("none (baseline: scaling {direction})"),
            took,
            writes(&host, "").await - before,
            "",
        );
    }

    kill_and_restart(&env, &host, Part::Apiserver, 2).await;
    kill_and_restart(&env, &host, Part::Etcd, 1).await;

    // 410 Gone: the host is frozen while the fleet changes, etcd is compacted and the
    // apiserver restarted with a fresh watch cache, so every watch it resumes is too old.
    let plane = plane().await;
    let before = writes(&host, "").await;
    let mark = host.logs().len();
    signal(host.pid(), "STOP");
    scale(&env, PARENTS, 2).await;
    let revision = plane.compact().await.expect("compacted");
    plane.kill(Part::Apiserver).expect("killed");
    plane.start_part(Part::Apiserver).await.expect("restarted");
    signal(host.pid(), "CONT");
    let back = Instant::now();
    converged(&env, PARENTS, 2, &host).await;
    let took = back.elapsed();
    let expired = host.logs()[mark..]
        .matches("too old resource version")
        .count();
    assert!(
        expired > 0,
        "the resumed watches were told their resourceVersion expired (compacted at {revision})"
    );
    measured(
        "watches expired (410 Gone) after compaction",
        took,
        writes(&host, "").await - before,
        &format!("watches_expired={expired}"),
    );
}
