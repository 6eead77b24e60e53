//! Without the API server's sharded lists and watches: replicas filter on their side and
//! write as one host does.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::world::*;

#[tokio::test(flavor = "multi_thread")]
async fn without_server_sharding_replicas_filter_and_write_as_one_host_does() {
    let (client, kubeconfig) = shared_plane().await;
    let mut world = World::new(client.clone(), "fb", 8).await;

    // One reconcile at a time per plugin, however many shards a replica holds.
    let (hosts, holders) = world.pair(&kubeconfig, &["--concurrency", "1"]).await;
    let pods = PAIR;
    let mut addrs = Vec::new();
    for host in &hosts {
        addrs.push(host.http_addr().await);
    }
    let (done, sampler) = most_in_flight(addrs);
    let parents = world.put_parents(&world.namespaces, 120).await;
    wait_converged(&client, &parents).await;
    done.store(true, Ordering::Relaxed);
    let most = sampler.await.expect("sampler");
    println!("measured: most reconciles at once, per replica: {most:?}");
    for (pod, most) in pods.iter().zip(&most) {
        assert!(
            *most <= 1.0,
            "{pod} ran {most} reconciles at once with --concurrency 1"
        );
    }
    assert!(
        most.contains(&1.0),
        "the sampler saw no reconcile at all: {most:?}"
    );
    // Events are recorded off the reconcile's path: let them land, as for the single host.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut sharded_writes = 0.0;
    for (pod, host) in pods.iter().zip(&hosts) {
        let (metrics, _) = caches_its_shards(host, pod, &holders, 4, &parents).await;
        assert!(
            host.logs().contains("does not shard lists and watches"),
            "{pod} says once that it filters: {}",
            host.logs()
        );
        sharded_writes += metric(&metrics, "wasmop_api_writes_total", &["result=\"sent\""]);
        println!(
            "measured: {pod}'s writes by resource:\n{}",
            writes_by_resource(&metrics)
        );
    }

    // SIGSTOP one past its Leases: the other takes its shards and reconciles what changes;
    // woken up, the frozen one writes nothing of its backlog.
    // The one whose shards hold parents (eight random namespaces may all hash to the other's).
    let f = (0..2)
        .find(|&i| parents_in(&parents, &shards_of(&holders, pods[i], 4)) > 0)
        .expect("every parent is in some replica's shards");
    let frozen = &hosts[f];
    let sent = |m: &str| {
        metric(
            m,
            "wasmop_api_writes_total",
            &["result=\"sent\"", "resource=\"deployments\""],
        ) + metric(
            m,
            "wasmop_api_writes_total",
            &["result=\"sent\"", "resource=\"memcacheds/status\""],
        )
    };
    let before = sent(&scrape(frozen).await);
    let theirs = shards_of(&holders, pods[f], 4);
    signal(frozen, "-STOP");
    testenv::wait_for(
        "the frozen replica's shards to move",
        support::TIMEOUT,
        || async {
            let now = world.holders().await;
            let moved = theirs
                .iter()
                .all(|s| now.get(&s.index()).is_some_and(|h| h == pods[1 - f]));
            Ok::<_, String>(moved.then_some(()))
        },
    )
    .await
    .expect("the shards moved");
    resize_in(&client, &parents, &theirs, 10, 1).await;
    signal(frozen, "-CONT");
    // Before the other can give a shard back (two of its ticks), the woken one may hold none.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let woken = scrape(frozen).await;
    println!(
        "measured: the woken replica's writes refused by its fences: {}",
        metric(&woken, "wasmop_api_writes_total", &["result=\"refused\""])
    );
    assert_eq!(
        sent(&woken),
        before,
        "the woken replica wrote a parent's Deployment or status:\n{}",
        frozen.logs()
    );
    testenv::wait_for("the woken replica to notice", support::TIMEOUT, || async {
        Ok::<_, String>(
            frozen
                .logs()
                .contains("lost the shard's Lease")
                .then_some(()),
        )
    })
    .await
    .expect("the loss logged");

    for host in hosts {
        let log = host.log.clone();
        assert!(host.terminate().success());
        let log = std::fs::read_to_string(log).unwrap();
        assert!(log.contains("gave every shard back"), "{log}");
    }

    // One unsharded host, at rest over those parents, then as many new ones.
    let single = world.host("wasmop-single", &kubeconfig, &["--concurrency", "1"]);
    let started = Instant::now();
    let mut last = -1.0;
    let baseline = loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = metric(
            &scrape(&single).await,
            "wasmop_api_writes_total",
            &["result=\"sent\""],
        );
        if now == last {
            break now;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "the single host never came to rest"
        );
        last = now;
    };
    let before = world.namespaces.len();
    world.add_namespaces("fb", 8).await;
    let fresh = world.put_parents(&world.namespaces[before..], 120).await;
    wait_converged(&client, &fresh).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "measured: the single host's writes by resource (at rest over the first 120 parents, then 120 new):\n{}",
        writes_by_resource(&scrape(&single).await)
    );
    let single_writes = metric(
        &scrape(&single).await,
        "wasmop_api_writes_total",
        &["result=\"sent\""],
    ) - baseline;
    let (sharded, one) = (sharded_writes / 120.0, single_writes / 120.0);
    println!("measured: writes per parent, 2 sharded replicas {sharded:.2}, one host {one:.2}");
    assert!(
        (sharded - one).abs() <= 0.15 * one,
        "sharded replicas write {sharded:.2} per parent, one host {one:.2}"
    );
}
