//! Leader election: two hosts, one reconciles; kill it and the other takes over.

use std::time::{Duration, Instant};

use support::{Env, Host, TIMEOUT};

const LEADER: &str = "became the leader";

async fn wait_leader(hosts: &[&Host]) -> usize {
    testenv::wait_for("one host to become the leader", TIMEOUT, || async {
        Ok::<_, String>(hosts.iter().position(|h| h.logs().contains(LEADER)))
    })
    .await
    .expect("a leader")
}

/// Reconcile spans logged before the host became the leader.
fn writes_before_leading(log: &str) -> usize {
    let until = log.find(LEADER).unwrap_or(log.len());
    log[..until].matches("reconcile{").count()
}

#[tokio::test(flavor = "multi_thread")]
async fn standby_takes_over_when_the_leader_dies() {
    let env = Env::new("e2e-leader").await;
    env.put_memcached_plugin().await;
    let args = ["--leader-elect"];
    let a = env.host().pod("wasmop-a").args(&args).start();
    let b = env.host().pod("wasmop-b").args(&args).start();
    let leader = wait_leader(&[&a, &b]).await;
    let (leader, standby) = if leader == 0 { (a, b) } else { (b, a) };
    env.memcached_ready("cache", 1).await;
    assert!(!standby.logs().contains(LEADER), "only one leader");
    assert_eq!(
        writes_before_leading(&standby.logs()),
        0,
        "the standby does not reconcile"
    );

    // SIGKILL: the Lease is not released, so the standby waits for it to expire (15 s).
    let killed = Instant::now();
    leader.kill();
    testenv::wait_for("the standby to take over", TIMEOUT, || async {
        Ok::<_, String>(standby.logs().contains(LEADER).then_some(()))
    })
    .await
    .unwrap();
    let takeover = killed.elapsed();
    println!("measured: failover (leader SIGKILLed → standby leads) in {takeover:?}");
    assert!(takeover < Duration::from_secs(60), "took {takeover:?}");
    env.memcached_ready("cache", 2).await;

    // SIGTERM: a graceful stop releases the Lease.
    let log = standby.log.clone();
    let status = standby.terminate();
    let log = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "exit status {status:?}\n{log}");
    assert!(log.contains("released the leader Lease"), "{log}");
}
