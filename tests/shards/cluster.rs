//! A cluster-scoped parent's children in every shard.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use wasmop::plugin::rollout::STRATEGY_ANNOTATION;

use support::Host;

use crate::world::*;

/// A cluster-scoped parent's world spans namespaces: the replica holding the shard of
/// cluster-scoped objects sees its children in every namespace, whichever replica holds
/// those namespaces' shards, so it is shown all of them and prunes the ones it drops. Only
/// that replica runs the plugin; a preview of it is whole all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_scoped_parent_sees_and_prunes_its_children_in_every_shard() {
    let (client, kubeconfig) = shared_plane().await;
    let crd = support::test_crd("ClusterProbe", "Cluster");
    testenv::apply_crd(
        &client,
        &serde_json::from_value(crd).unwrap(),
        "shards",
        support::TIMEOUT,
    )
    .await
    .expect("CRD established");
    let wasm = test_artifacts::read(test_artifacts::CLUSTER_PARENT);
    let mut world = World::with_plugin(client.clone(), "clp", 8, "cluster-parent", wasm).await;

    let (hosts, holders) = world.pair(&kubeconfig, &[]).await;
    // Its children's namespaces must include two on the other replica's shards (names are
    // random): one kept, one dropped.
    let designated = designated_of(&holders);
    let other = PAIR[1 - designated];
    let theirs = shards_of(&holders, other, 4);
    let on_other = |ns: &str| theirs.iter().any(|s| s.holds(ns));
    let names = |world: &World| -> Vec<String> {
        world
            .namespaces
            .iter()
            .map(|ns| ns.name().to_string())
            .collect()
    };
    while names(&world).iter().filter(|ns| on_other(ns)).count() < 2 {
        world.add_namespaces("clp", 1).await;
    }
    let namespaces = names(&world);

    let name = format!("{}-probe", world.host_ns.name());
    let probes =
        Api::<DynamicObject>::all_with(client.clone(), &support::test_resource("ClusterProbe"));
    let put = |namespaces: Vec<String>| {
        let probe = json!({"apiVersion": "test.wasmop.io/v1", "kind": "ClusterProbe",
                           "metadata": {"name": name}, "spec": {"namespaces": namespaces}});
        let (probes, name) = (probes.clone(), name.clone());
        async move {
            probes
                .patch(&name, &PatchParams::apply("shards"), &Patch::Apply(&probe))
                .await
                .expect("a ClusterProbe")
        }
    };
    let seen = |want: usize| {
        let (probes, name) = (probes.clone(), name.clone());
        async move {
            testenv::wait_until(
                &format!("ClusterProbe {name} to be shown {want} children"),
                support::TIMEOUT,
                || async { probes.get(&name).await },
                |p| p.data["status"]["seen"] == want,
            )
            .await
        }
    };
    put(namespaces.clone()).await;
    seen(namespaces.len())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", hosts.iter().map(Host::logs).collect::<String>()));

    // The plugin's parents are all on one replica: only that one runs it and caches its
    // kinds (the children across every shard); the other caches neither.
    let caches = |metrics: String| -> Vec<String> {
        metrics
            .lines()
            .filter(|l| l.starts_with("wasmop_cache_objects{"))
            .filter(|l| l.contains("kind=\"ClusterProbe.") || l.contains("kind=\"ConfigMap."))
            .map(str::to_string)
            .collect()
    };
    let theirs_cached = caches(scrape(&hosts[1 - designated]).await);
    let designated_cached = caches(scrape(&hosts[designated]).await);
    println!(
        "measured: the designated replica caches {designated_cached:?}, the other {theirs_cached:?}"
    );
    assert!(
        designated_cached.iter().any(|l| l.contains("ConfigMap.")),
        "the designated replica caches the children: {designated_cached:?}"
    );
    assert!(
        theirs_cached.is_empty(),
        "the other replica caches nothing of the plugin's: {theirs_cached:?}"
    );

    // Dropping namespaces prunes their ConfigMaps, on every shard: half of those on the other
    // replica's shards and half of the rest.
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for side in [true, false] {
        let of_side: Vec<&String> = namespaces
            .iter()
            .filter(|ns| on_other(ns) == side)
            .collect();
        for (i, ns) in of_side.into_iter().enumerate() {
            if i % 2 == 0 { &mut kept } else { &mut dropped }.push(ns.clone());
        }
    }
    assert!(dropped.iter().any(|ns| on_other(ns)) && kept.iter().any(|ns| on_other(ns)));
    put(kept.clone()).await;
    for ns in &dropped {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        testenv::wait_until(
            &format!("ConfigMap {ns}/{name} to be pruned"),
            support::TIMEOUT,
            || async { cms.get_opt(&name).await },
            Option::is_none,
        )
        .await
        .expect("pruned");
    }
    seen(kept.len()).await.expect("shown the kept ones");

    // A preview spans every shard: those where the plugin runs no controller report no
    // parents, so the preview is whole once the one parent is previewed and every shard has
    // reported (until then its summary says how many have).
    let wasm = test_artifacts::read(test_artifacts::CLUSTER_PARENT);
    let preview = [(STRATEGY_ANNOTATION, "preview")];
    world
        .put_plugin("cluster-parent", &wasm, Some("unread: 1\n"), &preview)
        .await;
    let whole = |s: &str| s.starts_with("1 of 1 parents previewed") && !s.contains("reported");
    let (summary, _) = testenv::wait_for("the preview to be whole", support::TIMEOUT, || async {
        let preview = world.preview("cluster-parent", 2).await?;
        Ok::<_, String>(preview.filter(|(s, _)| whole(s)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", hosts.iter().map(Host::logs).collect::<String>()));
    println!(
        "measured: the preview of a cluster-scoped parent's plugin over 2 replicas: {summary}"
    );
    probes
        .delete(&name, &Default::default())
        .await
        .expect("deleted");
}
