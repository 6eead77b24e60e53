//! Staged rollouts across replicas: a canary and a preview span every replica's shards.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use wasmop::plugin::revision::Phase;
use wasmop::plugin::rollout::{STEP_SECONDS_ANNOTATION, STEPS_ANNOTATION, STRATEGY_ANNOTATION};

use support::{Host, memcached_resource};

use crate::world::*;

/// Each parent's `Ready` condition message, where the status is `True`, by (namespace, name).
async fn ready_messages(client: &Client) -> BTreeMap<(String, String), String> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &memcached_resource());
    let list = api.list(&ListParams::default()).await.expect("Memcacheds");
    list.items
        .into_iter()
        .filter_map(|o| {
            let conditions = o.data["status"]["conditions"].as_array()?.clone();
            let ready = conditions
                .iter()
                .find(|c| c["type"] == "Ready" && c["status"] == "True")?;
            let key = (o.metadata.namespace?, o.metadata.name?);
            Some((key, ready["message"].as_str()?.to_owned()))
        })
        .collect()
}

/// Waits until every one of `parents` is Ready, last reconciled by revision `number`.
async fn wait_all_on(
    client: &Client,
    parents: &[(String, String)],
    number: i64,
    logs: impl Fn() -> String,
) {
    let suffix = format!(", revision {number}");
    testenv::wait_for(
        &format!("{} parents reconciled by revision {number}", parents.len()),
        CONVERGE,
        || async {
            let ready = ready_messages(client).await;
            let all = parents
                .iter()
                .all(|p| ready.get(p).is_some_and(|m| m.ends_with(&suffix)));
            Ok::<_, String>(all.then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
}

async fn phases(world: &World) -> Vec<(i64, Phase)> {
    world
        .revisions()
        .list("memcached")
        .await
        .expect("revisions")
        .into_iter()
        .map(|r| (r.number, r.phase))
        .collect()
}

/// Staged rollouts on a sharded host: the replica holding the designated shard judges a canary
/// from every shard's report on the candidate's revision and the other follows it, so a bad
/// candidate is rolled back and a good one made live on both; a preview covers both replicas'
/// parents and writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_canary_and_a_preview_span_every_replicas_shards() {
    let (plane, client, kubeconfig) = sharded_plane().await;
    let world = World::new(client.clone(), "cy", 12).await;
    let (v1, v2) = (
        test_artifacts::read(test_artifacts::MEMCACHED),
        test_artifacts::read(test_artifacts::MEMCACHED_V2),
    );
    world.grant("memcached", &v2).await;

    let (hosts, holders) = world.pair(&kubeconfig, &[]).await;
    let logs = || hosts.iter().map(Host::logs).collect::<Vec<_>>().join("\n");
    let pods = PAIR;
    let parents = world.put_parents(&world.namespaces, 80).await;
    wait_all_on(&client, &parents, 1, logs).await;
    for pod in pods {
        assert!(
            parents_in(&parents, &shards_of(&holders, pod, 4)) > 0,
            "{pod}'s shards hold none of the 12 namespaces: nothing would span replicas"
        );
    }
    let judge = designated_of(&holders);
    let follower = &hosts[1 - judge];

    // A bad candidate: settings the plugin cannot read, so each of its reconciles fails.
    let canary = [
        (STRATEGY_ANNOTATION, "canary"),
        (STEPS_ANNOTATION, "50,100"),
        (STEP_SECONDS_ANNOTATION, "2"),
    ];
    world
        .put_plugin("memcached", &v1, Some("image: [1, 2]\n"), &canary)
        .await;
    testenv::wait_for("revision 2 to be rolled back", CONVERGE, || async {
        let p = phases(&world).await;
        Ok::<_, String>((p == [(1, Phase::Live), (2, Phase::Aborted)]).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let revision = world.revisions().list("memcached").await.unwrap();
    let reported: Vec<u32> = revision[1].shard_reports.keys().copied().collect();
    assert_eq!(
        reported,
        [0, 1, 2, 3],
        "every shard reported on the revision"
    );
    let note = revision[1].note.clone().unwrap_or_default();
    assert!(note.contains("at step 1 (50%)"), "{note}");
    wait_all_on(&client, &parents, 1, logs).await;
    testenv::wait_for(
        "the other replica to follow the rollback",
        CONVERGE,
        || async { Ok::<_, String>(follower.logs().contains("rolled back").then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", follower.logs()));

    // A preview of another image: every shard's parents, nothing written.
    let preview = [(STRATEGY_ANNOTATION, "preview")];
    world
        .put_plugin(
            "memcached",
            &v1,
            Some("image: memcached:1.6.99\n"),
            &preview,
        )
        .await;
    let n = parents.len();
    let whole = format!("{n} of {n} parents previewed: {n} would change");
    let (summary, diff) =
        testenv::wait_for("the preview to cover every parent", CONVERGE, || async {
            let preview = world.preview("memcached", 3).await?;
            Ok::<_, String>(preview.filter(|(s, _)| s.starts_with(&whole)))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    println!("measured: the preview over 2 replicas: {summary}");
    assert!(!summary.contains("shards reported"), "{summary}");
    for pod in pods {
        let mine = shards_of(&holders, pod, 4);
        let (ns, name) = parents
            .iter()
            .find(|(ns, _)| mine.iter().any(|s| s.holds(ns)))
            .unwrap();
        assert!(
            diff.contains(&format!("{ns}/{name}")),
            "the diff shows {pod}'s parents too:\n{diff}"
        );
    }
    let deployments: Api<Deployment> = Api::all(client.clone());
    let previewed_image = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|d| d.spec.template.spec.iter())
        .flat_map(|p| p.containers.iter())
        .any(|c| c.image.as_deref() == Some("memcached:1.6.99"));
    assert!(!previewed_image, "a preview writes nothing");

    // A good candidate replaces the preview; the judging replica is killed at its first step,
    // and the other takes the designated shard and carries the canary on from the revision.
    let canary = [
        (STRATEGY_ANNOTATION, "canary"),
        (STEPS_ANNOTATION, "50,100"),
        (STEP_SECONDS_ANNOTATION, "5"),
    ];
    world.put_plugin("memcached", &v2, None, &canary).await;
    let revisions = world.revisions();
    testenv::wait_for(
        "revision 4's first step to be recorded",
        CONVERGE,
        || async {
            let all = revisions
                .list("memcached")
                .await
                .map_err(|e| e.to_string())?;
            let started = all.iter().any(|r| r.number == 4 && r.step == Some(0));
            Ok::<_, String>(started.then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let mut hosts = hosts;
    let survivor = hosts.remove(1 - judge);
    hosts.pop().unwrap().kill();
    testenv::wait_for("revision 4 to be made live", CONVERGE, || async {
        let p = phases(&world).await;
        let want = [
            (1, Phase::Retired),
            (2, Phase::Aborted),
            (3, Phase::Aborted),
            (4, Phase::Live),
        ];
        Ok::<_, String>((p == want).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", survivor.logs()));
    let steps: Vec<String> = survivor
        .logs()
        .lines()
        .filter(|l| l.contains("revision 4") && l.contains("% of parents"))
        .map(|l| l.split(" (step ").next().unwrap_or(l).to_owned())
        .collect();
    println!("measured: the surviving replica's canary steps: {steps:#?}");
    assert!(
        survivor
            .logs()
            .contains("serves 100% of parents (step 2 of 2)"),
        "the survivor judged the last step:\n{}",
        survivor.logs()
    );
    wait_all_on(&client, &parents, 4, || survivor.logs()).await;
    let services: Api<Service> = Api::all(client.clone());
    let with_service = services
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| {
            let key = (
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            );
            parents.contains(&key)
        })
        .count();
    assert_eq!(with_service, parents.len(), "every parent has v2's Service");
    assert!(survivor.terminate().success());
    plane.stop().await.expect("the plane stops");
}
