//! The controller stage in-process: a [`Supervisor`] over the shared plane, fed plugins the
//! way the registry feeds it (loaded by the same [`Loader`]), checked through the cluster and
//! rollout's [`Board`], never through a process or its log.
//!
//! Between the unit tests (pure logic, the schedule under a paused clock) and the suites that
//! run `wasmop` as a process, this tier covers what the supervisor and its controllers do: a
//! swap in place, a canary's tally and a preview's counts as they are posted, a finalizer
//! released when a plugin is retired, and a plugin stopped while its parent kind is gone and
//! started again when it is back.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::Reporter;
use serde_json::json;
use wasmop::client::Fence;
use wasmop::controller::Supervisor;
use wasmop::controller::supervisor::Setup;
use wasmop::kinds::Kinds;
use wasmop::plugin::rollout::{Board, Progress};
use wasmop::plugin::{Activation, Canary, Loaded, Loader, Supervise, source};
use wasmop::sandbox::{Limits, Sandbox, SandboxConfig};
use wasmop::telemetry::health::Health;
use wasmop::watch::Hub;

use support::{Env, TIMEOUT, put_probe, test_crd, test_resource};

/// One test's controller stage: a supervisor over its namespace, and the board it posts on.
struct Stage {
    env: Env,
    loader: Loader,
    supervisor: Supervisor,
    board: Board,
}

impl Stage {
    async fn new(test: &str) -> Stage {
        let env = Env::new(test).await;
        let ns = env.name().to_string();
        let sandbox = Sandbox::new(SandboxConfig::default()).expect("a sandbox");
        let loader = Loader::new(
            env.client.clone(),
            ns.clone(),
            sandbox,
            Some(ns.clone()),
            Duration::from_secs(600),
            Default::default(),
            Default::default(),
        );
        let board = Board::default();
        let setup = Setup {
            client: env.client.clone(),
            namespace: ns.clone(),
            hub: Hub::new(env.client.clone(), Some(ns), Health::default()),
            reporter: Reporter {
                controller: "wasmop-stage".into(),
                instance: None,
            },
            config: wasmop::controller::Config::default(),
            board: board.clone(),
        };
        let supervisor = Supervisor::new(setup, Fence::unfenced());
        Stage {
            env,
            loader,
            supervisor,
            board,
        }
    }

    /// Grants `configmap`'s identity what `wasmop rbac` prints for `wasm`, and loads it as
    /// the registry would from its ConfigMap.
    async fn load(&self, configmap: &str, wasm: &[u8]) -> (Loaded, Kinds) {
        self.env.grant(configmap, wasm, &[]).await;
        self.load_only(configmap, wasm).await
    }

    /// Grants `configmap`'s identity what `wasmop rbac` prints for `wasm` without
    /// `--watch-namespace` (ClusterRoles, named after the test: a cluster-scoped parent kind
    /// needs them), and loads it.
    async fn load_everywhere(&self, configmap: &str, wasm: &[u8]) -> (Loaded, Kinds) {
        let (client, ns) = (&self.env.client, self.env.name());
        let roles = format!("{ns}-{configmap}");
        support::grant_everywhere(client, wasm, configmap, ns, &roles, &[]).await;
        self.load_only(configmap, wasm).await
    }

    async fn load_only(&self, configmap: &str, wasm: &[u8]) -> (Loaded, Kinds) {
        let cm = wasmop::plugin::package::package(wasm, configmap, self.env.name(), None)
            .expect("a plugin ConfigMap")
            .configmap;
        let source = source::read(&cm, &Limits::default()).expect("a plugin source");
        self.loader.load(source).await.expect("the plugin loads")
    }

    async fn run(&mut self, configmap: &str, wasm: &[u8]) -> (Activation, Loaded, Kinds) {
        let (loaded, kinds) = self.load(configmap, wasm).await;
        let activation = self
            .supervisor
            .run(configmap, loaded.clone(), kinds.clone())
            .await;
        (activation, loaded, kinds)
    }

    /// Waits until the controllers of `configmap` post, for the candidate `digest`, what
    /// `pred` accepts; returns it.
    async fn posted(
        &self,
        configmap: &str,
        digest: &str,
        what: &str,
        pred: impl Fn(&Progress) -> bool,
    ) -> Progress {
        testenv::wait_for(what, TIMEOUT, || async {
            let posts = self.board.progress(configmap, digest);
            Ok::<_, String>(posts.into_iter().map(|(_, p)| p).find(|p| pred(p)))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; posted: {:?}", self.board.progress(configmap, digest)))
    }

    async fn services(&self) -> usize {
        let api: Api<Service> = self.env.ns.api();
        api.list(&Default::default()).await.unwrap().items.len()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_restarts_or_swaps_in_as_its_kinds_say_and_every_parent_follows() {
    let mut stage = Stage::new("stage-swap").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    // v2 adds Services: its rights cover v1's.
    stage.env.grant("memcached", &v2, &[]).await;
    let (activation, _, _) = stage.run("memcached", &v1).await;
    assert_eq!(activation, Activation::Started);
    for name in ["one", "two"] {
        stage.env.put_memcached(name, 1).await;
    }
    for name in ["one", "two"] {
        stage.env.wait_replicas(name, 1).await;
    }
    assert_eq!(stage.services().await, 0, "v1 makes no Service");

    let (activation, _, _) = stage.run("memcached", &v2).await;
    assert_eq!(
        activation,
        Activation::Restarted,
        "v2 watches Services too: a restart, not a swap"
    );
    testenv::wait_for("v2 to give both parents a Service", TIMEOUT, || async {
        Ok::<_, String>((stage.services().await == 2).then_some(()))
    })
    .await
    .unwrap();
    // The same kinds again (v2 → v2 with other settings would be the same): a swap.
    let (activation, _, _) = stage.run("memcached", &v2).await;
    assert_eq!(activation, Activation::Swapped);
    assert!(stage.supervisor.is_synced("memcached"));
    stage.supervisor.stop("memcached").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_canary_is_tallied_and_a_preview_counted_on_the_board() {
    let mut stage = Stage::new("stage-candidate").await;
    let v1 = test_artifacts::read(test_artifacts::MEMCACHED);
    let v2 = test_artifacts::read(test_artifacts::MEMCACHED_V2);
    stage.env.grant("memcached", &v2, &[]).await;
    let parents = ["a", "b", "c", "d"];
    for name in parents {
        stage.env.put_memcached(name, 1).await;
    }
    stage.run("memcached", &v1).await;
    for name in parents {
        stage.env.wait_replicas(name, 1).await;
    }
    let (candidate, kinds) = stage.load("memcached", &v2).await;
    let digest = candidate.plugin.digest().to_owned();

    // A preview of v2 for every parent: each would get a Service, and nothing is written.
    let route = |weight, preview| Canary {
        loaded: candidate.clone(),
        kinds: kinds.clone(),
        weight,
        preview,
    };
    stage
        .supervisor
        .route("memcached", Some(route(0, true)))
        .await;
    let posted = stage
        .posted("memcached", &digest, "a preview of every parent", |p| {
            p.preview.as_ref().is_some_and(|r| r.previewed == 4)
        })
        .await;
    let report = posted.preview.expect("a preview report");
    assert!(posted.canary.is_none(), "a preview is no canary");
    assert_eq!((report.parents, report.changed), (4, 4), "{report:?}");
    assert_eq!(report.created, 4, "one Service each: {report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    assert_eq!(stage.services().await, 0, "a preview writes nothing");

    // v2 as a canary for every parent: each is reconciled by it, and none fails.
    stage
        .supervisor
        .route("memcached", Some(route(100, false)))
        .await;
    let posted = stage
        .posted(
            "memcached",
            &digest,
            "the canary to reconcile every parent",
            |p| p.canary.as_ref().is_some_and(|r| r.reconciled == 4),
        )
        .await;
    let report = posted.canary.expect("a canary report");
    assert!(posted.preview.is_none(), "the preview stopped");
    assert_eq!((report.weight, report.share, report.failed), (100, 4, 0));
    assert_eq!(stage.services().await, 4, "the canary writes");

    // Dropped: nothing is posted any more.
    stage.supervisor.route("memcached", None).await;
    testenv::wait_for("the post to be taken down", TIMEOUT, || async {
        Ok::<_, String>(
            stage
                .board
                .progress("memcached", &digest)
                .is_empty()
                .then_some(()),
        )
    })
    .await
    .unwrap();
    stage.supervisor.stop("memcached").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn retiring_a_plugin_releases_its_finalizer_and_stopping_one_does_not() {
    let mut stage = Stage::new("stage-finalizers").await;
    let wasm = test_artifacts::read(test_artifacts::FINALIZING);
    stage.run("finalizing", &wasm).await;
    let probes = put_probe(&stage.env, "held").await;
    let carries = |p: &DynamicObject| {
        let list = p.metadata.finalizers.clone().unwrap_or_default();
        list.iter().any(|f| f == "wasmop.io/finalizing")
    };
    testenv::wait_until("the finalizer", TIMEOUT, || probes.get("held"), carries)
        .await
        .unwrap();
    // Stopped (a host shutting down): the finalizer stays for whoever runs next.
    stage.supervisor.stop("finalizing").await;
    assert!(carries(&probes.get("held").await.unwrap()));

    stage.run("finalizing", &wasm).await;
    probes
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        probes.get_opt("held").await.unwrap().is_some(),
        "the deletion is held"
    );
    // Retired (its ConfigMap is gone): released, and the deletion goes ahead.
    stage.supervisor.retire("finalizing").await;
    testenv::wait_until(
        "the held Probe to go",
        TIMEOUT,
        || probes.get_opt("held"),
        Option::is_none,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_whose_parent_kind_went_is_reported_and_runs_again_when_it_is_back() {
    let mut stage = Stage::new("stage-vanished").await;
    let crd = test_crd("ClusterProbe", "Cluster");
    testenv::apply_objects(&stage.env.client, vec![crd.clone()], "stage")
        .await
        .unwrap();
    let wasm = test_artifacts::read(test_artifacts::CLUSTER_PARENT);
    let (loaded, kinds) = stage.load_everywhere("cluster", &wasm).await;
    stage
        .supervisor
        .run("cluster", loaded.clone(), kinds.clone())
        .await;
    let probes: Api<DynamicObject> =
        Api::all_with(stage.env.client.clone(), &test_resource("ClusterProbe"));
    let first = format!("{}-one", stage.env.name());
    put_cluster_probe(&probes, &first, stage.env.name()).await;
    let configmaps: Api<ConfigMap> = stage.env.ns.api();
    testenv::wait_until(
        "its child",
        TIMEOUT,
        || configmaps.get_opt(&first),
        Option::is_some,
    )
    .await
    .unwrap();

    let crds: Api<CustomResourceDefinition> = Api::all(stage.env.client.clone());
    let crd_name = "clusterprobes.test.wasmop.io";
    crds.delete(crd_name, &DeleteParams::default())
        .await
        .unwrap();
    testenv::wait_for("the kind to be reported gone", TIMEOUT, || async {
        let vanished = stage.supervisor.vanished();
        let gone = vanished.iter().any(|(cm, kinds)| {
            cm == "cluster" && kinds.iter().any(|k| k.ends_with("ClusterProbe"))
        });
        Ok::<_, String>(gone.then_some(()))
    })
    .await
    .unwrap();
    // The kind stops being served before the CRD is gone: one applied before that would be
    // the terminating one, removed under it.
    testenv::wait_for("the CRD to be gone", TIMEOUT, || async {
        match crds.get_opt(crd_name).await {
            Ok(found) => Ok(found.is_none().then_some(())),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .unwrap();
    // The registry pauses it so; it starts again once the kind is served.
    stage.supervisor.stop("cluster").await;
    testenv::apply_objects(&stage.env.client, vec![crd], "stage")
        .await
        .unwrap();
    testenv::wait_for("the kind to be served again", TIMEOUT, || async {
        Ok::<_, String>(
            probes
                .list(&ListParams::default().limit(1))
                .await
                .ok()
                .map(|_| ()),
        )
    })
    .await
    .unwrap();
    stage.supervisor.run("cluster", loaded, kinds).await;
    // The CRD took its objects with it; a new one is reconciled by the new run.
    let second = format!("{}-two", stage.env.name());
    put_cluster_probe(&probes, &second, stage.env.name()).await;
    testenv::wait_until(
        "its status from the new run",
        TIMEOUT,
        || probes.get(&second),
        |p| p.data["status"]["seen"].is_number(),
    )
    .await
    .unwrap();
    assert!(stage.supervisor.vanished().is_empty());
    stage.supervisor.stop("cluster").await;
    let _ = crds.delete(crd_name, &DeleteParams::default()).await;
}

/// Applies ClusterProbe `name`, asking for a ConfigMap child in `namespace`.
async fn put_cluster_probe(probes: &Api<DynamicObject>, name: &str, namespace: &str) {
    let probe = json!({"apiVersion": "test.wasmop.io/v1", "kind": "ClusterProbe",
        "metadata": {"name": name}, "spec": {"namespaces": [namespace]}});
    probes
        .patch(name, &PatchParams::apply("stage"), &Patch::Apply(&probe))
        .await
        .unwrap();
}
