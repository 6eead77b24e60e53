//! Sharding across host replicas (`wasmop run --shards`): real `wasmop` processes against a
//! plane with the API server's sharded lists and watches (`ShardedListAndWatch`) and, for
//! the client-side fallback, against the shared plane without them.
//!
//! The replicas reconcile in every namespace, so this binary has planes of its own.

#[path = "../e2e/common.rs"]
#[allow(dead_code)]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::TestNamespace;
use wasmop::plugin::revision::{Phase, Revisions};
use wasmop::plugin::rollout::{STEP_SECONDS_ANNOTATION, STEPS_ANNOTATION, STRATEGY_ANNOTATION};
use wasmop::shard::Shard;
use wasmop::shard::keeper;

use common::{Host, http_get, install_crds, memcached_resource};

/// Converging hundreds of parents on two shared cores.
const CONVERGE: Duration = Duration::from_secs(600);
/// Shard Leases in these tests: short, so a dead replica's shards move quickly.
const LEASE_SECONDS: &str = "6";
/// Two replicas' names.
const PAIR: [&str; 2] = ["wasmop-a", "wasmop-b"];

/// A host namespace with the Memcached plugin, and namespaces for parents.
struct World {
    client: Client,
    host_ns: TestNamespace,
    namespaces: Vec<TestNamespace>,
}

impl World {
    async fn new(client: Client, label: &str, namespaces: usize) -> World {
        let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
        World::with_plugin(client, label, namespaces, "memcached", wasm).await
    }

    /// The plugin `wasm` in ConfigMap `configmap` of a new host namespace, granted its
    /// rights in every namespace, and `namespaces` namespaces for parents.
    async fn with_plugin(
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
    async fn grant(&self, configmap: &str, wasm: &[u8]) {
        let plugin = {
            let wasm = wasm.to_vec();
            tokio::task::spawn_blocking(move || wasmop::cmd::probe(&wasm))
                .await
                .unwrap()
                .expect("the plugin loads")
        };
        let options = wasmop::cmd::rbac::Options {
            configmap: Some(configmap.into()),
            name: Some(format!("wasmop-plugin-{}", self.host_ns.name())),
            namespace: self.host_ns.name().to_string(),
            service_account: "wasmop".into(),
            watch_namespace: None,
            plurals: Vec::new(),
        };
        let rbac = wasmop::cmd::rbac::objects(plugin.manifest(), &options).expect("rbac");
        testenv::apply_objects(&self.client, rbac, "shards")
            .await
            .expect("the plugin's RBAC");
    }

    /// Puts ConfigMap `configmap` as `wasmop package` builds it from `wasm` and `settings`,
    /// with `annotations`.
    async fn put_plugin(
        &self,
        configmap: &str,
        wasm: &[u8],
        settings: Option<&str>,
        annotations: &[(&str, &str)],
    ) {
        let settings = settings.map(str::to_owned);
        let mut cm = wasmop::cmd::package::package(wasm, configmap, self.host_ns.name(), settings)
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

    async fn add_namespaces(&mut self, label: &str, n: usize) {
        for _ in 0..n {
            let ns = testenv::namespace(&self.client, label)
                .await
                .expect("namespace");
            self.namespaces.push(ns);
        }
    }

    fn host(&self, pod: &str, kubeconfig: &Path, extra: &[&str]) -> Host {
        Host::start_everywhere_as(kubeconfig, self.host_ns.name(), pod, extra)
    }

    /// Replicas [`PAIR`] with `--shards 4`, this test's Leases and `extra`, once they share
    /// the shards: the hosts, and who holds each shard.
    async fn pair(&self, kubeconfig: &Path, extra: &[&str]) -> (Vec<Host>, BTreeMap<u32, String>) {
        let args = ["--shards", "4", "--lease-duration-seconds", LEASE_SECONDS];
        let args: Vec<&str> = args.iter().chain(extra).copied().collect();
        let hosts = PAIR
            .iter()
            .map(|p| self.host(p, kubeconfig, &args))
            .collect();
        (hosts, wait_balanced(self, &PAIR, 4).await)
    }

    /// `n` Memcacheds of size 0 spread over `namespaces`: `(namespace, name)`.
    async fn put_parents(&self, namespaces: &[TestNamespace], n: usize) -> Vec<(String, String)> {
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
    fn revisions(&self) -> Revisions {
        Revisions::new(self.client.clone(), self.host_ns.name())
    }

    /// The preview summary and diff on revision `number` of `configmap`'s plugin, if written.
    async fn preview(
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
    async fn holders(&self) -> BTreeMap<u32, String> {
        let prefix = wasmop::config::SHARD_LEASE_PREFIX;
        keeper::holders(&self.client, self.host_ns.name(), prefix)
            .await
            .expect("shard Leases")
            .into_iter()
            .map(|(shard, holder)| (shard.index(), holder))
            .collect()
    }
}

async fn put_memcached(client: &Client, ns: &str, name: &str, size: i64) {
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
async fn resize_in(
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
fn converged(obj: &DynamicObject) -> bool {
    let generation = obj.metadata.generation.unwrap_or(-1);
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["observedGeneration"] == generation))
}

/// Waits until every one of `parents` has a status for its spec and a Deployment.
async fn wait_converged(client: &Client, parents: &[(String, String)]) -> Duration {
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
fn reconciled_namespaces(log: &str) -> BTreeSet<String> {
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
fn metric(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// The `sent` lines of `wasmop_api_writes_total`, for the reader of a measurement.
fn writes_by_resource(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| l.starts_with("wasmop_api_writes_total{") && l.contains("result=\"sent\""))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn scrape(host: &Host) -> String {
    let addr = host.http_addr().await;
    http_get(&addr, "/metrics").await.1
}

/// Samples `wasmop_reconciles_in_flight` of each host at `addrs` until the flag is set; the
/// task answers the most each one showed.
fn most_in_flight(addrs: Vec<String>) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<f64>>) {
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

/// Which of [`PAIR`] holds the shard of cluster-scoped objects, given `holders` of 4 shards.
fn designated_of(holders: &BTreeMap<u32, String>) -> usize {
    let designated = Shard::all(4).into_iter().find(|s| s.holds("")).unwrap();
    PAIR.iter()
        .position(|p| holders.get(&designated.index()).map(String::as_str) == Some(*p))
        .expect("a replica holds every shard")
}

/// The plane this binary's tests share (its API server does not shard lists and watches), a
/// client of it and its kubeconfig.
async fn shared_plane() -> (Client, PathBuf) {
    let cluster = testenv::shared().await.expect("control plane");
    let client = cluster.client().await.expect("client");
    (client, cluster.kubeconfig_path().to_path_buf())
}

/// A plane of this test's own whose API server shards lists and watches, a client of it and
/// its kubeconfig.
async fn sharded_plane() -> (testenv::TestEnv, Client, PathBuf) {
    let plane = testenv::TestEnv::start_with_feature_gates(&["ShardedListAndWatch=true"])
        .await
        .expect("a control plane with sharded watches");
    let client = plane.client().await.expect("client");
    let kubeconfig = plane.kubeconfig_path().to_path_buf();
    (plane, client, kubeconfig)
}

/// Sends `kill <sig>` to the host.
fn signal(host: &Host, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &host.pid().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {sig}");
}

/// Parents of `parents` whose namespace is in one of `shards`.
fn parents_in(parents: &[(String, String)], shards: &[Shard]) -> usize {
    parents
        .iter()
        .filter(|(ns, _)| shards.iter().any(|s| s.holds(ns)))
        .count()
}

fn shards_of(holders: &BTreeMap<u32, String>, who: &str, count: u32) -> Vec<Shard> {
    holders
        .iter()
        .filter(|(_, h)| *h == who)
        .filter_map(|(i, _)| Shard::new(*i, count))
        .collect()
}

/// Waits until each of `pods` holds a shard, nothing else does, and all `count` are held.
async fn wait_balanced(world: &World, pods: &[&str], count: u32) -> BTreeMap<u32, String> {
    testenv::wait_for(
        "the replicas to share the shards",
        common::TIMEOUT,
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
async fn server_writes(client: &Client) -> (f64, f64) {
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
async fn server_shards_as_the_host_does(client: &Client, parents: &[(String, String)], count: u32) {
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
        let metrics = scrape(host).await;
        let mine = shards_of(&holders, pod, 3);
        let cached = metric(&metrics, "wasmop_cache_objects", &["kind=\"Memcached."]);
        println!(
            "measured: {pod} holds shards {mine:?}: {cached} of {} parents cached",
            parents.len()
        );
        assert_eq!(
            metric(&metrics, "wasmop_shards_held", &[]),
            mine.len() as f64
        );
        assert_eq!(
            cached as usize,
            parents_in(&parents, &mine),
            "{pod}\n{}",
            host.logs()
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
        common::TIMEOUT,
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
        let metrics = scrape(host).await;
        let mine = shards_of(&holders, pod, 4);
        let cached = metric(&metrics, "wasmop_cache_objects", &["kind=\"Memcached."]);
        assert_eq!(
            cached as usize,
            parents_in(&parents, &mine),
            "{pod}\n{}",
            host.logs()
        );
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
        common::TIMEOUT,
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
    testenv::wait_for("the woken replica to notice", common::TIMEOUT, || async {
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
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &common::probe_resource())
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
            common::TIMEOUT,
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
            common::TIMEOUT,
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
        common::TIMEOUT,
        || async { members.get_opt("wasmop-shard-member-wasmop-new").await },
        Option::is_some,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nnew replica's log:\n{}", new.logs()));
    // Then the tick that would take shards says why it takes none; one more tick after it
    // would show a take (the sampler above watches all along too).
    testenv::wait_for(
        "the new replica to say why it waits",
        common::TIMEOUT,
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
        common::TIMEOUT,
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

/// A cluster-scoped parent's world spans namespaces: the replica holding the shard of
/// cluster-scoped objects sees its children in every namespace, whichever replica holds
/// those namespaces' shards, so it is shown all of them and prunes the ones it drops. Only
/// that replica runs the plugin; a preview of it is whole all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_scoped_parent_sees_and_prunes_its_children_in_every_shard() {
    let (client, kubeconfig) = shared_plane().await;
    let crd = common::test_crd("ClusterProbe", "Cluster");
    testenv::apply_crd(
        &client,
        &serde_json::from_value(crd).unwrap(),
        "shards",
        common::TIMEOUT,
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
        Api::<DynamicObject>::all_with(client.clone(), &common::test_resource("ClusterProbe"));
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
                common::TIMEOUT,
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
            common::TIMEOUT,
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
    let (summary, _) = testenv::wait_for("the preview to be whole", common::TIMEOUT, || async {
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
