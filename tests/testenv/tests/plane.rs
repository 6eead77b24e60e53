//! Tests against a real control plane: the one shared by this test binary, plus a second one
//! started beside it. They check what wasmop's own tests rely on: the pinned version, real
//! Deployments with pods made Running and Ready by kwok, real garbage collection, CRDs with a
//! status subresource, isolation between planes, and the faults a test can inject: parts
//! killed and started again, etcd compacted, a proxy that black-holes the apiserver.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use testenv::{Part, Proxy};

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn version_is_the_pinned_release() -> anyhow::Result<()> {
    let client = testenv::client().await?;
    let info = client.apiserver_version().await?;
    assert_eq!(info.git_version, testenv::KUBERNETES_VERSION);
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "37"));
    Ok(())
}

#[tokio::test]
async fn deployment_gets_running_ready_pods_on_the_kwok_node() -> anyhow::Result<()> {
    let client = testenv::client().await?;
    let ns = testenv::namespace(&client, "deployment").await?;
    let deployments = ns.api::<Deployment>();
    deployments
        .create(&PostParams::default(), &memcached("web", 3))
        .await?;

    let pods = ns.api::<Pod>();
    let ready = testenv::wait_until(
        "3 pods of deployment web to be Running and Ready on the kwok node",
        TIMEOUT,
        || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await?;
            Ok::<_, kube::Error>(list.items.iter().map(pod_summary).collect::<Vec<_>>())
        },
        |pods| pods.len() == 3 && pods.iter().all(|p| p == &ready_pod_summary()),
    )
    .await?;
    assert_eq!(ready.len(), 3);

    testenv::wait_until(
        "deployment web to be Available with 3 available replicas",
        TIMEOUT,
        || async { deployments.get("web").await.map(|d| d.status) },
        |status| {
            let Some(status) = status else { return false };
            let available = status.conditions.iter().flatten().any(|c| {
                c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")
            });
            available && status.available_replicas == Some(3)
        },
    )
    .await?;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn deleting_a_deployment_collects_its_replica_set_and_pods() -> anyhow::Result<()> {
    let client = testenv::client().await?;
    let ns = testenv::namespace(&client, "gc").await?;
    let deployments = ns.api::<Deployment>();
    let replica_sets = ns.api::<ReplicaSet>();
    let pods = ns.api::<Pod>();
    deployments
        .create(&PostParams::default(), &memcached("doomed", 3))
        .await?;
    let by_label = ListParams::default().labels("app=doomed");

    let count_replica_sets = || async { replica_sets.list(&by_label).await.map(|l| l.items.len()) };
    let count_pods = || async { pods.list(&by_label).await.map(|l| l.items.len()) };
    testenv::wait_until("3 pods of deployment doomed", TIMEOUT, count_pods, |n| {
        *n == 3
    })
    .await?;
    assert_eq!(count_replica_sets().await?, 1);

    // Background propagation: the apiserver deletes the Deployment at once and leaves its
    // dependents to the garbage collector of the controller-manager.
    deployments
        .delete("doomed", &DeleteParams::background())
        .await?;
    testenv::wait_until(
        "the ReplicaSet to be collected",
        TIMEOUT,
        count_replica_sets,
        |n| *n == 0,
    )
    .await?;
    testenv::wait_until("the pods to be collected", TIMEOUT, count_pods, |n| *n == 0).await?;
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn custom_resource_status_goes_through_its_subresource() -> anyhow::Result<()> {
    let client = testenv::client().await?;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.testenv.wasmop.io" },
        "spec": {
            "group": "testenv.wasmop.io",
            "names": { "kind": "Widget", "plural": "widgets", "singular": "widget" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": { "type": "object", "properties": { "size": { "type": "integer" } } },
                        "status": { "type": "object", "properties": { "phase": { "type": "string" } } },
                    },
                } },
            }],
        },
    }))?;
    // Server-side apply: idempotent, so a rerun against an existing cluster works too.
    testenv::apply_crd(&client, &crd, "testenv-tests", TIMEOUT).await?;

    let ns = testenv::namespace(&client, "crd").await?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("testenv.wasmop.io", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &resource);
    let mut widget = DynamicObject::new("gizmo", &resource);
    widget.data = json!({ "spec": { "size": 3 }, "status": { "phase": "ignored" } });
    // The discovery cache of a fresh CRD can lag its Established condition by a moment.
    let created = testenv::wait_for("the Widget to be created", TIMEOUT, || async {
        match widgets.create(&PostParams::default(), &widget).await {
            Ok(created) => Ok(Some(created)),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await?;
    // With a status subresource, status in a create or update of the main resource is dropped.
    assert_eq!(
        created.data.get("status"),
        None,
        "status written through the main resource"
    );

    let patched = widgets
        .patch_status(
            "gizmo",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Ready" } })),
        )
        .await?;
    assert_eq!(patched.data["status"]["phase"], "Ready");

    let read = widgets.get("gizmo").await?;
    assert_eq!(read.data["spec"]["size"], 3);
    assert_eq!(read.data["status"]["phase"], "Ready");
    ns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn apiserver_metrics_count_requests() -> anyhow::Result<()> {
    let client = testenv::client().await?;
    let _ns = testenv::namespace(&client, "metrics").await?;
    let text = testenv::metrics::metrics_text(&client).await?;
    let creates = testenv::metrics::request_count(&text, Some("POST"), Some("namespaces"));
    assert!(
        creates >= 1.0,
        "no namespace creation counted in apiserver_request_total"
    );
    Ok(())
}

#[tokio::test]
async fn a_second_plane_runs_beside_the_shared_one() -> anyhow::Result<()> {
    let shared = testenv::shared().await?;
    let second = testenv::TestEnv::start().await?;
    let (shared_client, second_client) = (shared.client().await?, second.client().await?);
    if let Some(plane) = shared.plane() {
        assert_ne!(plane.apiserver_url(), second.apiserver_url());
    }

    for client in [&shared_client, &second_client] {
        assert_eq!(
            client.apiserver_version().await?.git_version,
            testenv::KUBERNETES_VERSION
        );
    }
    let ns = testenv::namespace(&second_client, "second").await?;
    let shared_namespaces: Api<Namespace> = Api::all(shared_client);
    assert!(
        shared_namespaces.get_opt(ns.name()).await?.is_none(),
        "the planes share state"
    );

    // The second plane schedules and runs pods on its own kwok node too.
    ns.api::<Deployment>()
        .create(&PostParams::default(), &memcached("solo", 1))
        .await?;
    let pods = ns.api::<Pod>();
    testenv::wait_until(
        "the pod of deployment solo to be Running and Ready",
        TIMEOUT,
        || async {
            let list = pods.list(&ListParams::default().labels("app=solo")).await?;
            Ok::<_, kube::Error>(list.items.iter().map(pod_summary).collect::<Vec<_>>())
        },
        |pods| pods == &[ready_pod_summary()],
    )
    .await?;

    let pids: Vec<u32> = second.processes().into_iter().map(|(_, pid)| pid).collect();
    assert_eq!(pids.len(), 5);
    let work_dir = second.work_dir().to_owned();
    second.stop().await.context("stopping the second plane")?;
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived stop()"
        );
    }
    assert!(!work_dir.exists(), "the work dir outlived stop()");
    if let Some(plane) = shared.plane() {
        plane.check_running()?;
    }
    Ok(())
}

#[tokio::test]
async fn parts_restart_etcd_compacts_and_a_proxy_black_holes() -> anyhow::Result<()> {
    let env = testenv::TestEnv::start().await?;
    let client = env.client().await?;
    let ns = testenv::namespace(&client, "faults").await?;
    let config_maps = ns.api::<ConfigMap>();
    let first = config_maps
        .create(&PostParams::default(), &config_map("first"))
        .await?;
    let names = |env: &testenv::TestEnv| -> Vec<&'static str> {
        env.processes().into_iter().map(|(name, _)| name).collect()
    };
    let all: Vec<&str> = Part::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(names(&env), all);

    // A write after `first`, so the watch cache of the restarted apiserver starts after
    // `first` and leaves reads at `first`'s revision to etcd (see the compaction below).
    config_maps
        .create(&PostParams::default(), &config_map("second"))
        .await?;

    // The apiserver, killed: not a crash, gone from processes(), back on the same port.
    let pid_of = |part: Part| env.processes().into_iter().find(|(n, _)| *n == part.name());
    let (_, old_pid) = pid_of(Part::Apiserver).context("no apiserver process")?;
    env.kill(Part::Apiserver)?;
    assert!(
        !Path::new(&format!("/proc/{old_pid}")).exists(),
        "the apiserver survived kill"
    );
    env.check_running()
        .context("a part killed on purpose counted as a crash")?;
    assert_eq!(pid_of(Part::Apiserver), None);
    assert!(
        client.apiserver_version().await.is_err(),
        "a killed apiserver answered"
    );
    env.start_part(Part::Apiserver).await?;
    assert_eq!(names(&env), all);
    assert_ne!(pid_of(Part::Apiserver).map(|(_, pid)| pid), Some(old_pid));
    // The client made before the kill reaches the new apiserver at the same URL.
    create_eventually(&config_maps, "after-apiserver").await?;

    // etcd, killed and started again: the apiserver reconnects, the data is still there.
    env.kill(Part::Etcd)?;
    env.check_running()?;
    env.start_part(Part::Etcd).await?;
    create_eventually(&config_maps, "after-etcd").await?;
    assert!(
        config_maps.get_opt("first").await?.is_some(),
        "etcd lost data"
    );

    // A graceful stop of a part, and a start.
    env.stop_part(Part::Scheduler).await?;
    env.check_running()?;
    env.start_part(Part::Scheduler).await?;
    assert_eq!(names(&env), all);

    // Compaction. An exact list at `first`'s revision is older than the watch cache of the
    // restarted apiserver, so etcd serves it: until the compaction, then it is Gone.
    let old: u64 = first
        .metadata
        .resource_version
        .context("no resourceVersion")?
        .parse()?;
    let exact_old = ListParams::default()
        .at(&old.to_string())
        .matching(kube::api::VersionMatch::Exact);
    config_maps
        .list(&exact_old)
        .await
        .context("an exact list at an old revision before compaction")?;
    let revision = env.compact().await?;
    assert!(
        u64::try_from(revision)? > old,
        "compacted at {revision}, not after {old}"
    );
    match config_maps.list(&exact_old).await {
        Err(kube::Error::Api(status)) if status.code == 410 => {}
        other => anyhow::bail!("an exact list at {old} after compacting at {revision}: {other:?}"),
    }
    env.compact().await.context("compacting again")?;

    // A proxy in front of the apiserver: through it a client works, black-holed it hangs,
    // healed it works again.
    let proxy = Proxy::start(env.apiserver_addr()).await?;
    assert!(env.kubeconfig_via(proxy.addr()).contains(&format!(
        "server: https://127.0.0.1:{}",
        proxy.addr().port()
    )));
    let via = env.client_via(proxy.addr()).await?;
    let version = |client: kube::Client| async move {
        tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await
    };
    version(via.clone()).await.context("through the proxy")??;
    assert!(proxy.connections() >= 1);
    proxy.black_hole();
    assert!(
        version(via.clone()).await.is_err(),
        "an answer through a black hole"
    );
    proxy.heal();
    version(via.clone())
        .await
        .context("through the healed proxy")??;
    proxy.cut();
    testenv::wait_for(
        "the client to get through again after a cut",
        TIMEOUT,
        || async {
            Ok::<_, std::convert::Infallible>(version(via.clone()).await.ok().and_then(Result::ok))
        },
    )
    .await?;
    drop(proxy);

    // A part left down is no crash at stop, and every process is gone after it.
    env.kill(Part::Kwok)?;
    let pids: Vec<u32> = env.processes().into_iter().map(|(_, pid)| pid).collect();
    assert_eq!(pids.len(), 4);
    env.stop().await.context("stopping with kwok down")?;
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} outlived stop()"
        );
    }
    Ok(())
}

/// Creates an empty ConfigMap, retrying while the plane recovers from a restart.
async fn create_eventually(config_maps: &Api<ConfigMap>, name: &str) -> anyhow::Result<()> {
    testenv::wait_for(
        &format!("ConfigMap {name} to be created"),
        TIMEOUT,
        || async {
            match config_maps
                .create(&PostParams::default(), &config_map(name))
                .await
            {
                Ok(_) => Ok(Some(())),
                // An earlier try that failed on the way back.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(())),
                Err(e) => Err(e),
            }
        },
    )
    .await?;
    Ok(())
}

fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

/// A Deployment of `replicas` memcached pods labelled `app=<name>`.
fn memcached(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{
                    "name": "memcached",
                    "image": "memcached:1.4.36-alpine",
                    "ports": [{ "containerPort": 11211 }],
                }] },
            },
        },
    }))
    .expect("a valid Deployment")
}

/// The facts about a pod the tests check, as a map so a timeout shows them all.
fn pod_summary(pod: &Pod) -> BTreeMap<&'static str, String> {
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or("unknown", |c| c.status.as_str());
    BTreeMap::from([
        (
            "node",
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
        ),
        (
            "phase",
            status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        ),
        ("ready", ready.to_owned()),
    ])
}

fn ready_pod_summary() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("node", testenv::NODE_NAME.to_owned()),
        ("phase", "Running".to_owned()),
        ("ready", "True".to_owned()),
    ])
}
