//! What the sharding tests share: a world of a host namespace and parent namespaces, its
//! planes, and the questions the tests ask of replicas and the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::TestNamespace;
use wasmop::plugin::revision::Revisions;
use wasmop::shard::Shard;
use wasmop::shard::keeper;

use support::{Host, http_get, install_crds, memcached_resource};

/// Converging hundreds of parents on two shared cores.
pub(crate) const CONVERGE: Duration = Duration::from_secs(600);
/// Shard Leases in these tests: short, so a dead replica's shards move quickly.
pub(crate) const LEASE_SECONDS: &str = "6";
/// Two replicas' names.
pub(crate) const PAIR: [&str; 2] = ["wasmop-a", "wasmop-b"];

/// A host namespace with the Memcached plugin, and namespaces for parents.
pub(crate) struct World {
    pub(crate) client: Client,
    pub(crate) host_ns: TestNamespace,
    pub(crate) namespaces: Vec<TestNamespace>,
}

impl World {
    pub(crate) async fn new(client: Client, label: &str, namespaces: usize) -> World {
        let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
        World::with_plugin(client, label, namespaces, "memcached", wasm).await
    }

    /// The plugin `wasm` in ConfigMap `configmap` of a new host namespace, granted its
    /// rights in every namespace, and `namespaces` namespaces for parents.
    pub(crate) async fn with_plugin(
        client: Client,
        label: &str,
        namespaces: usize,
        configmap: &str,
        wasm: Vec<u8>,
    ) -> World {
        install_crds(&client).await;
        let host_ns = testenv::namespace(&client, &format!("{label}-host"))
            .await
            .expect("host namespace");
        let mut world = World {
            client,
            host_ns,
            namespaces: Vec::new(),
        };
        world.grant(configmap, &wasm).await;
        world.put_plugin(configmap, &wasm, None, &[]).await;
        world.add_namespaces(label, namespaces).await;
        world
    }

    /// Gives the plugin in ConfigMap `configmap` the rights `wasm` asks for, cluster-wide: the
    /// replicas reconcile in every namespace.
    pub(crate) async fn grant(&self, configmap: &str, wasm: &[u8]) {
        let host_ns = self.host_ns.name();
        let roles = format!("wasmop-plugin-{host_ns}");
        support::grant_everywhere(&self.client, wasm, configmap, host_ns, &roles, &[]).await;
    }

    /// Puts ConfigMap `configmap` as `wasmop package` builds it from `wasm` and `settings`,
    /// with `annotations`.
    pub(crate) async fn put_plugin(
        &self,
        configmap: &str,
        wasm: &[u8],
        settings: Option<&str>,
        annotations: &[(&str, &str)],
    ) {
        let settings = settings.map(str::to_owned);
        let mut cm =
            wasmop::plugin::package::package(wasm, configmap, self.host_ns.name(), settings)
                .expect("a plugin ConfigMap")
                .configmap;
        let ann = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in annotations {
            ann.insert(k.to_string(), v.to_string());
        }
        self.host_ns
            .api::<ConfigMap>()
            .patch(
                configmap,
                &PatchParams::apply("shards").force(),
                &Patch::Apply(&cm),
            )
            .await
            .expect("the plugin ConfigMap");
    }

    pub(crate) async fn add_namespaces(&mut self, label: &str, n: usize) {
        for _ in 0..n {
            let ns = testenv::namespace(&self.client, label)
                .await
                .expect("namespace");
            self.namespaces.push(ns);
        }
    }

    pub(crate) fn host(&self, pod: &str, kubeconfig: &Path, extra: &[&str]) -> Host {
        Host::build(kubeconfig, self.host_ns.name())
            .everywhere()
            .pod(pod)
            .args(extra)
            .start()
    }

    /// Replicas [`PAIR`] with `--shards 4`, this test's Leases and `extra`, once they share
    /// the shards: the hosts, and who holds each shard.
    pub(crate) async fn pair(
        &self,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> (Vec<Host>, BTreeMap<u32, String>) {
        let args = ["--shards", "4", "--lease-duration-seconds", LEASE_SECONDS];
        let args: Vec<&str> = args.iter().chain(extra).copied().collect();
        let hosts = PAIR
            .iter()
            .map(|p| self.host(p, kubeconfig, &args))
            .collect();
        (hosts, wait_balanced(self, &PAIR, 4).await)
    }

    /// `n` Memcacheds of size 0 spread over `namespaces`: `(namespace, name)`.
    pub(crate) async fn put_parents(
        &self,
        namespaces: &[TestNamespace],
        n: usize,
    ) -> Vec<(String, String)> {
        let parents: Vec<(String, String)> = (0..n)
            .map(|i| {
                let ns = namespaces[i % namespaces.len()].name().to_string();
                (ns, format!("m-{i}"))
            })
            .collect();
        futures::stream::iter(parents.clone())
            .for_each_concurrent(16, |(ns, name)| {
                let client = self.client.clone();
                async move { put_memcached(&client, &ns, &name, 0).await }
            })
            .await;
        parents
    }

    /// The revisions of this world's plugins.
    pub(crate) fn revisions(&self) -> Revisions {
        Revisions::new(self.client.clone(), self.host_ns.name())
    }

    /// The preview summary and diff on revision `number` of `configmap`'s plugin, if written.
    pub(crate) async fn preview(
        &self,
        configmap: &str,
        number: i64,
    ) -> Result<Option<(String, String)>, String> {
        let all = self
            .revisions()
            .list(configmap)
            .await
            .map_err(|e| e.to_string())?;
        Ok(all
            .into_iter()
            .find(|r| r.number == number)
            .and_then(|r| r.preview))
    }

    /// The Leases of this world's shards: index → holder.
    pub(crate) async fn holders(&self) -> BTreeMap<u32, String> {
        let prefix = wasmop::config::SHARD_LEASE_PREFIX;
        keeper::holders(&self.client, self.host_ns.name(), prefix)
            .await
            .expect("shard Leases")
            .into_iter()
            .map(|(shard, holder)| (shard.index(), holder))
            .collect()
    }
}

pub(crate) async fn put_memcached(client: &Client, ns: &str, name: &str, size: i64) {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &memcached_resource());
    let obj = json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {"name": name},
        "spec": {"size": size},
    });
    api.patch(
        name,
        &PatchParams::apply("shards").force(),
        &Patch::Apply(&obj),
    )
    .await
    .expect("apply Memcached");
}

/// Sets `spec.size` of the first `n` of `parents` in `shards` (at least one) and waits until
/// they converge; returns them.
pub(crate) async fn resize_in(
    client: &Client,
    parents: &[(String, String)],
    shards: &[Shard],
    n: usize,
    size: i64,
) -> Vec<(String, String)> {
    let chosen: Vec<(String, String)> = parents
        .iter()
        .filter(|(ns, _)| shards.iter().any(|s| s.holds(ns)))
        .take(n)
        .cloned()
        .collect();
    assert!(!chosen.is_empty(), "no parent in shards {shards:?}");
    for (ns, name) in &chosen {
        put_memcached(client, ns, name, size).await;
    }
    wait_converged(client, &chosen).await;
    chosen
}

/// Whether a parent's last status was written for its current spec.
pub(crate) fn converged(obj: &DynamicObject) -> bool {
    let generation = obj.metadata.generation.unwrap_or(-1);
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["observedGeneration"] == generation))
}

/// Waits until every one of `parents` has a status for its spec and a Deployment.
pub(crate) async fn wait_converged(client: &Client, parents: &[(String, String)]) -> Duration {
    let started = Instant::now();
    let wanted: BTreeSet<(String, String)> = parents.iter().cloned().collect();
    let namespaces: BTreeSet<&str> = parents.iter().map(|(ns, _)| ns.as_str()).collect();
    let memcacheds = Api::<DynamicObject>::all_with(client.clone(), &memcached_resource());
    let deployments: Api<Deployment> = Api::all(client.clone());
    testenv::wait_for(
        &format!("{} parents to converge", parents.len()),
        CONVERGE,
        || async {
            let done: BTreeSet<(String, String)> = memcacheds
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .filter(|o| converged(o))
                .map(|o| {
                    (
                        o.metadata.namespace.clone().unwrap(),
                        o.metadata.name.clone().unwrap(),
                    )
                })
                .collect();
            let with_child = deployments
                .list_metadata(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .filter(|d| namespaces.contains(d.metadata.namespace.as_deref().unwrap_or("")))
                .count();
            let left = wanted.difference(&done).count();
            Ok::<_, String>((left == 0 && with_child >= wanted.len()).then_some(()))
        },
    )
    .await
    .expect("every parent converges");
    started.elapsed()
}

/// Namespaces a host's log shows reconciles in.
pub(crate) fn reconciled_namespaces(log: &str) -> BTreeSet<String> {
    log.lines()
        .filter_map(|l| l.split("reconcile{").nth(1))
        .filter_map(|rest| rest.split("namespace=").nth(1))
        .map(|rest| {
            rest.split([' ', '}'])
                .next()
                .unwrap_or("")
                .trim_matches('"')
                .to_string()
        })
        .collect()
}

/// The sum of a metric's samples whose labels contain every one of `with`.
pub(crate) fn metric(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// The `sent` lines of `wasmop_api_writes_total`, for the reader of a measurement.
pub(crate) fn writes_by_resource(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| l.starts_with("wasmop_api_writes_total{") && l.contains("result=\"sent\""))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) async fn scrape(host: &Host) -> String {
    let addr = host.http_addr().await;
    http_get(&addr, "/metrics").await.1
}

/// Samples `wasmop_reconciles_in_flight` of each host at `addrs` until the flag is set; the
/// task answers the most each one showed.
pub(crate) fn most_in_flight(
    addrs: Vec<String>,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<f64>>) {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let task = tokio::spawn(async move {
        let mut most = vec![0.0f64; addrs.len()];
        while !stop.load(Ordering::Relaxed) {
            for (addr, most) in addrs.iter().zip(most.iter_mut()) {
                let text = http_get(addr, "/metrics").await.1;
                *most = most.max(metric(&text, "wasmop_reconciles_in_flight", &[]));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    });
    (done, task)
}

/// Checks that `host` (the replica `pod`, of `count` shards held as `holders` says) caches
/// exactly the parents of its shards; returns its metrics and its shards.
pub(crate) async fn caches_its_shards(
    host: &Host,
    pod: &str,
    holders: &BTreeMap<u32, String>,
    count: u32,
    parents: &[(String, String)],
) -> (String, Vec<Shard>) {
    let metrics = scrape(host).await;
    let mine = shards_of(holders, pod, count);
    let cached = metric(&metrics, "wasmop_cache_objects", &["kind=\"Memcached."]);
    println!(
        "measured: {pod} holds shards {mine:?}: {cached} of {} parents cached",
        parents.len()
    );
    assert_eq!(
        cached as usize,
        parents_in(parents, &mine),
        "{pod}\n{}",
        host.logs()
    );
    (metrics, mine)
}

/// Which of [`PAIR`] holds the shard of cluster-scoped objects, given `holders` of 4 shards.
pub(crate) fn designated_of(holders: &BTreeMap<u32, String>) -> usize {
    let designated = Shard::all(4).into_iter().find(|s| s.holds("")).unwrap();
    PAIR.iter()
        .position(|p| holders.get(&designated.index()).map(String::as_str) == Some(*p))
        .expect("a replica holds every shard")
}

/// The plane this binary's tests share (its API server does not shard lists and watches), a
/// client of it and its kubeconfig.
pub(crate) async fn shared_plane() -> (Client, PathBuf) {
    let cluster = testenv::shared().await.expect("control plane");
    let client = cluster.client().await.expect("client");
    (client, cluster.kubeconfig_path().to_path_buf())
}

/// A plane of this test's own whose API server shards lists and watches, a client of it and
/// its kubeconfig.
pub(crate) async fn sharded_plane() -> (testenv::TestEnv, Client, PathBuf) {
    let plane = testenv::TestEnv::start_with_feature_gates(&["ShardedListAndWatch=true"])
        .await
        .expect("a control plane with sharded watches");
    let client = plane.client().await.expect("client");
    let kubeconfig = plane.kubeconfig_path().to_path_buf();
    (plane, client, kubeconfig)
}

/// Sends `kill <sig>` to the host.
pub(crate) fn signal(host: &Host, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &host.pid().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {sig}");
}

/// Parents of `parents` whose namespace is in one of `shards`.
pub(crate) fn parents_in(parents: &[(String, String)], shards: &[Shard]) -> usize {
    parents
        .iter()
        .filter(|(ns, _)| shards.iter().any(|s| s.holds(ns)))
        .count()
}

pub(crate) fn shards_of(holders: &BTreeMap<u32, String>, who: &str, count: u32) -> Vec<Shard> {
    holders
        .iter()
        .filter(|(_, h)| *h == who)
        .filter_map(|(i, _)| Shard::new(*i, count))
        .collect()
}

/// Waits until each of `pods` holds a shard, nothing else does, and all `count` are held.
pub(crate) async fn wait_balanced(
    world: &World,
    pods: &[&str],
    count: u32,
) -> BTreeMap<u32, String> {
    testenv::wait_for(
        "the replicas to share the shards",
        support::TIMEOUT,
        || async {
            let holders = world.holders().await;
            let held = |p: &&str| holders.values().filter(|h| h == p).count();
            let (most, least) = (pods.iter().map(held).max(), pods.iter().map(held).min());
            let all_held = holders.len() == count as usize;
            let even = most.zip(least).is_some_and(|(m, l)| l > 0 && m - l <= 1);
            let only = holders.values().all(|h| pods.contains(&h.as_str()));
            Ok::<_, String>((all_held && even && only).then_some(holders))
        },
    )
    .await
    .expect("balanced shards")
}

/// Writes the API server has answered to Deployments and to Memcacheds' status, so far.
pub(crate) async fn server_writes(client: &Client) -> (f64, f64) {
    let text = testenv::metrics::metrics_text(client)
        .await
        .expect("apiserver metrics");
    let mut counts = (0.0, 0.0);
    for s in testenv::metrics::samples(&text, "apiserver_request_total") {
        let label = |k: &str| s.labels.get(k).map(String::as_str).unwrap_or("");
        if !matches!(label("verb"), "APPLY" | "PATCH" | "PUT" | "POST") {
            continue;
        }
        match (label("resource"), label("subresource")) {
            ("deployments", "") => counts.0 += s.value,
            ("memcacheds", "status") => counts.1 += s.value,
            _ => {}
        }
    }
    counts
}

/// The API server filters lists by shard exactly as `Shard::holds` computes.
pub(crate) async fn server_shards_as_the_host_does(
    client: &Client,
    parents: &[(String, String)],
    count: u32,
) {
    let mut seen = 0;
    for shard in Shard::all(count) {
        let query = format!(
            "/apis/cache.example.com/v1alpha1/memcacheds?{}",
            shard.query()
        );
        let request = http::Request::get(query).body(Vec::new()).unwrap();
        let list: Value = client.request(request).await.expect("a sharded list");
        let items = list["items"].as_array().unwrap();
        for item in items {
            let ns = item["metadata"]["namespace"].as_str().unwrap();
            assert!(shard.holds(ns), "the server put {ns} in shard {shard}");
        }
        assert_eq!(items.len(), parents_in(parents, &[shard]), "shard {shard}");
        seen += items.len();
    }
    assert_eq!(seen, parents.len(), "every parent in exactly one shard");
}
