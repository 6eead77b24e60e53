//! A plugin deleted while some shards have no holder still has its finalizer released.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use support::Host;

use crate::world::*;

/// A plugin's ConfigMap deleted while the replica holding some shards is dead: the survivor
/// releases the finalizer from its own shards' parents at once, and from the dead one's (whose
/// shards include that of cluster-scoped objects, the one that sweeps) once it takes them.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_deleted_while_shards_have_no_holder_still_has_its_finalizer_released() {
    const FINALIZER: &str = "wasmop.io/finalizing";
    let (client, kubeconfig) = shared_plane().await;
    let wasm = test_artifacts::read(test_artifacts::FINALIZING);
    let world = World::with_plugin(client.clone(), "fin", 12, "finalizing", wasm).await;

    let (hosts, holders) = world.pair(&kubeconfig, &[]).await;
    let mut hosts: Vec<Option<Host>> = hosts.into_iter().map(Some).collect();
    let pods = PAIR;

    // A Probe in every namespace, each holding its deletion on the plugin's finalizer.
    let probes: Vec<(String, String)> = world
        .namespaces
        .iter()
        .map(|ns| (ns.name().to_string(), "p".to_string()))
        .collect();
    let api = |ns: &str| {
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &support::probe_resource())
    };
    for (ns, name) in &probes {
        let probe = json!({"apiVersion": "test.wasmop.io/v1", "kind": "Probe", "metadata": {"name": name}, "spec": {}});
        api(ns)
            .patch(name, &PatchParams::apply("shards"), &Patch::Apply(&probe))
            .await
            .expect("a Probe");
    }
    let finalized = |p: &DynamicObject| {
        p.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    };
    for (ns, name) in &probes {
        testenv::wait_until(
            &format!("Probe {ns}/{name} to get {FINALIZER}"),
            support::TIMEOUT,
            || async { api(ns).get(name).await },
            finalized,
        )
        .await
        .expect("the finalizer");
        api(ns)
            .delete(name, &Default::default())
            .await
            .expect("deleted");
    }

    // Kill the replica holding the shard of cluster-scoped objects, then delete the plugin.
    let victim = designated_of(&holders);
    let survivor = hosts[1 - victim].take().unwrap();
    let theirs = shards_of(&holders, pods[victim], 4);
    let orphaned = parents_in(&probes, &theirs);
    assert!(orphaned > 0, "the dead replica's shards have Probes");
    signal(hosts[victim].as_ref().unwrap(), "-KILL");
    world
        .host_ns
        .api::<ConfigMap>()
        .delete("finalizing", &Default::default())
        .await
        .expect("the plugin ConfigMap deleted");

    for (ns, name) in &probes {
        testenv::wait_until(
            &format!("Probe {ns}/{name} to be deleted"),
            support::TIMEOUT,
            || async { api(ns).get_opt(name).await },
            Option::is_none,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nsurvivor's log:\n{}", survivor.logs()));
    }
    // The sweep released exactly the dead replica's Probes: the survivor's went from its cache.
    let log = survivor.logs();
    let swept: usize = log
        .lines()
        .filter(|l| l.contains("released the finalizer of a plugin whose ConfigMap is gone"))
        .filter_map(|l| {
            l.split("released=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    println!(
        "measured: {orphaned} Probes in the dead replica's shards, {swept} released by the sweep"
    );
    assert_eq!(swept, orphaned, "{log}");
    let record = world
        .host_ns
        .api::<ConfigMap>()
        .get_opt("wasmop-finalizers")
        .await
        .unwrap();
    assert!(
        record.and_then(|cm| cm.data).unwrap_or_default().is_empty(),
        "the record forgets the plugin once released"
    );
}
