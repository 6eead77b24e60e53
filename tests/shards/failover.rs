//! Replicas sharing the parents, taking over a dead one's shards, and a change of shard count
//! handed over without two writers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use wasmop::shard::Shard;
use wasmop::shard::keeper;

use support::Host;

use crate::world::*;

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_share_the_parents_and_take_over_a_dead_ones_shards() {
    let (plane, client, kubeconfig) = sharded_plane().await;
    let world = World::new(client.clone(), "sh", 30).await;

    let args = ["--shards", "3", "--lease-duration-seconds", LEASE_SECONDS];
    let pods = ["wasmop-0", "wasmop-1", "wasmop-2"];
    let mut hosts: Vec<Option<Host>> = pods
        .iter()
        .map(|p| Some(world.host(p, &kubeconfig, &args)))
        .collect();
    let holders = wait_balanced(&world, &pods, 3).await;

    let before = server_writes(&client).await;
    let parents = world.put_parents(&world.namespaces, 1000).await;
    server_shards_as_the_host_does(&client, &parents, 3).await;
    let took = wait_converged(&client, &parents).await;
    println!("measured: 1000 parents in 30 namespaces converged on 3 replicas in {took:.1?}");
    // The API server's own count: one Deployment apply and one status write per parent, as
    // one host makes (the fallback test below), so no parent was written by two replicas.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (applies, statuses) = server_writes(&client).await;
    let (applies, statuses) = (applies - before.0, statuses - before.1);
    println!(
        "measured: the API server saw {applies} Deployment writes and {statuses} Memcached status writes for 1000 parents"
    );
    assert_eq!(applies, 1000.0, "one Deployment write per parent");
    assert_eq!(statuses, 1000.0, "one status write per parent");

    // Each replica caches its own shard's parents, and only reconciles in its namespaces.
    let mut writes = 0.0;
    let mut reconciled: Vec<BTreeSet<String>> = Vec::new();
    for (pod, host) in pods.iter().zip(&hosts) {
        let host = host.as_ref().unwrap();
        let (metrics, mine) = caches_its_shards(host, pod, &holders, 3, &parents).await;
        assert_eq!(
            metric(&metrics, "wasmop_shards_held", &[]),
            mine.len() as f64
        );
        assert!(
            !host.logs().contains("does not shard lists and watches"),
            "the server shards: nothing to filter"
        );
        writes += metric(&metrics, "wasmop_api_writes_total", &["result=\"sent\""]);
        let namespaces = reconciled_namespaces(&host.logs());
        assert!(!namespaces.is_empty(), "{pod} logged no reconcile");
        assert!(
            namespaces.iter().all(|ns| mine.iter().any(|s| s.holds(ns))),
            "{pod} reconciled outside its shards: {namespaces:?}"
        );
        reconciled.push(namespaces);
    }
    for (i, a) in reconciled.iter().enumerate() {
        for b in &reconciled[i + 1..] {
            assert!(a.is_disjoint(b), "two replicas reconciled one namespace");
        }
    }
    println!(
        "measured: {:.2} writes per parent across the replicas",
        writes / parents.len() as f64
    );

    // SIGKILL one: its Lease expires, another takes its shard and reconciles what changes.
    let dead = shards_of(&holders, pods[0], 3);
    let killed = Instant::now();
    hosts[0].take().unwrap().kill();
    let after = testenv::wait_for(
        "the dead replica's shard to move",
        support::TIMEOUT,
        || async {
            let holders = world.holders().await;
            let moved = dead
                .iter()
                .all(|s| holders.get(&s.index()).is_some_and(|h| h != pods[0]));
            Ok::<_, String>(moved.then_some(holders))
        },
    )
    .await
    .expect("the shard moved");
    println!(
        "measured: a dead replica's shards held by another {:.1?} after SIGKILL",
        killed.elapsed()
    );
    let orphans = resize_in(&client, &parents, &dead, 20, 1).await;
    println!(
        "measured: the dead replica's parents reconciled by another {:.1?} after SIGKILL",
        killed.elapsed()
    );
    let survivors: Vec<BTreeSet<String>> = hosts[1..]
        .iter()
        .map(|h| reconciled_namespaces(&h.as_ref().unwrap().logs()))
        .collect();
    assert!(
        survivors[0].is_disjoint(&survivors[1]),
        "two replicas reconciled one namespace"
    );
    for (ns, _) in &orphans {
        assert!(
            survivors.iter().any(|s| s.contains(ns)),
            "nobody reconciled {ns}"
        );
    }
    for (pod, host) in pods[1..].iter().zip(&hosts[1..]) {
        let mine = shards_of(&after, pod, 3);
        let metrics = scrape(host.as_ref().unwrap()).await;
        let cached = metric(&metrics, "wasmop_cache_objects", &["kind=\"Memcached."]);
        assert_eq!(
            cached as usize,
            parents_in(&parents, &mine),
            "{pod} after the failover"
        );
    }

    // A replica joins: the one holding two shards gives one back, and the newcomer takes it.
    hosts.push(Some(world.host("wasmop-3", &kubeconfig, &args)));
    let joined = wait_balanced(
        &world,
        &pods[1..]
            .iter()
            .copied()
            .chain(["wasmop-3"])
            .collect::<Vec<_>>(),
        3,
    )
    .await;
    let theirs = shards_of(&joined, "wasmop-3", 3);
    let moved = resize_in(&client, &parents, &theirs, 20, 2).await;
    let newcomer = hosts[3].as_ref().unwrap();
    let namespaces = reconciled_namespaces(&newcomer.logs());
    for (ns, _) in &moved {
        assert!(namespaces.contains(ns), "the newcomer reconciled {ns}");
    }
    let gave = hosts[1..3]
        .iter()
        .filter(|h| h.as_ref().unwrap().logs().contains("giving the shard back"))
        .count();
    assert_eq!(gave, 1, "one replica gave a shard back");
    let metrics = scrape(newcomer).await;
    let cached = metric(&metrics, "wasmop_cache_objects", &["kind=\"Memcached."]);
    assert_eq!(
        cached as usize,
        parents_in(&parents, &theirs),
        "the newcomer's cache"
    );
    drop(hosts);
    plane.stop().await.expect("the plane stops");
}

/// The holders of this world's live shard Leases, by Lease name (`…-<i>-of-<N>`): those whose
/// holder is set. Leases released on SIGTERM name none.
async fn lease_holders(
    leases: &Api<k8s_openapi::api::coordination::v1::Lease>,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let selector = format!("{}=shard", keeper::ROLE_LABEL);
    Ok(leases
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter_map(|l| {
            let holder = l.spec?.holder_identity.filter(|h| !h.is_empty())?;
            Some((l.metadata.name?, holder))
        })
        .collect())
}

/// A rolling update that changes `--shards`: a replica of the new count takes nothing while
/// the old one holds its Leases, so no moment has both counts holding shards (a Lease list
/// every 200 ms, all along); once the old one leaves, the new one takes every shard and serves.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_of_shard_count_hands_over_without_two_writers() {
    // A plane of its own: on the shared one, other tests' hosts would reconcile its
    // Memcacheds too, and count them in their caches.
    let (plane, client, kubeconfig) = sharded_plane().await;
    let world = World::new(client.clone(), "count", 6).await;
    let parents = world.put_parents(&world.namespaces, 12).await;

    let old = world.host(
        "wasmop-old",
        &kubeconfig,
        &["--shards", "4", "--lease-duration-seconds", LEASE_SECONDS],
    );
    wait_balanced(&world, &["wasmop-old"], 4).await;
    wait_converged(&client, &parents).await;

    // Every Lease list from here on: which counts hold shards at once.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = world.host_ns.api();
    let (stop, overlaps) = {
        let (stop, leases) = (Arc::new(AtomicBool::new(false)), leases.clone());
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut lists, mut both) = (0, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                if let Ok(held) = lease_holders(&leases).await {
                    lists += 1;
                    let counts: BTreeSet<&str> = held
                        .keys()
                        .filter_map(|name| Some(name.rsplit_once("-of-")?.1))
                        .collect();
                    if counts.len() > 1 {
                        both.push(format!("{held:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (lists, both)
        });
        (stop, task)
    };

    let new = world.host(
        "wasmop-new",
        &kubeconfig,
        &["--shards", "6", "--lease-duration-seconds", LEASE_SECONDS],
    );
    // Its first tick announces it (its member Lease); the next ones would take shards.
    let members: Api<k8s_openapi::api::coordination::v1::Lease> = world.host_ns.api();
    testenv::wait_until(
        "the new replica's member Lease",
        support::TIMEOUT,
        || async { members.get_opt("wasmop-shard-member-wasmop-new").await },
        Option::is_some,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nnew replica's log:\n{}", new.logs()));
    // Then the tick that would take shards says why it takes none; one more tick after it
    // would show a take (the sampler above watches all along too).
    testenv::wait_for(
        "the new replica to say why it waits",
        support::TIMEOUT,
        || async {
            let waits = new.logs().contains(
                "replicas run with --shards 4 hold shard Leases of this group; taking no shard",
            );
            Ok::<_, String>(waits.then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nnew replica's log:\n{}", new.logs()));
    tokio::time::sleep(keeper::TICK).await;
    let held = lease_holders(&leases).await.expect("shard Leases");
    assert!(
        held.keys().all(|name| name.ends_with("-of-4")) && held.len() == 4,
        "only the old count holds shards: {held:?}\nnew replica's log:\n{}",
        new.logs()
    );
    let moved = resize_in(&client, &parents, &Shard::all(4), 2, 1).await;

    // The old replica leaves (SIGTERM releases its Leases): the new one takes all six.
    let status = tokio::task::spawn_blocking(move || old.terminate())
        .await
        .unwrap();
    assert!(status.success(), "the old replica exits cleanly: {status}");
    testenv::wait_for(
        "the new replica to hold every shard of its count",
        support::TIMEOUT,
        || async {
            let held = lease_holders(&leases).await.expect("shard Leases");
            let all = held.len() == 6
                && held
                    .iter()
                    .all(|(name, h)| name.ends_with("-of-6") && h == "wasmop-new");
            Ok::<_, String>(all.then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nnew replica's log:\n{}", new.logs()));
    for (ns, name) in &moved {
        put_memcached(&client, ns, name, 2).await;
    }
    wait_converged(&client, &moved).await;

    stop.store(true, Ordering::Relaxed);
    let (lists, both) = overlaps.await.unwrap();
    println!(
        "measured: {lists} Lease lists during the change, {} with both counts holding",
        both.len()
    );
    assert!(
        lists > 20,
        "the Leases were watched all along ({lists} lists)"
    );
    assert!(both.is_empty(), "both counts held shards at once: {both:?}");
    drop(new);
    plane.stop().await.expect("the plane stops");
}
