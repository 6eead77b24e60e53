//! The cluster side of a run: CRDs, namespaces, the Memcached objects created in parallel,
//! convergence followed through watches, and the apiserver's request counters.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::artifacts;
use crate::kinds::Kind;
use crate::process::Proc;

/// The Memcached objects are spread over this many namespaces, one client each.
pub const NAMESPACES: usize = 10;
const FIELD_MANAGER: &str = "wasmop-bench";

/// The name of load namespace `i`.
pub fn namespace(i: usize) -> String {
    format!("bench-{i}")
}

/// Installs a CRD per kind, made from `deploy/crds/memcached.yaml`, and waits until served.
pub async fn install_crds(client: &Client, kinds: &[Kind]) -> Result<()> {
    let path = artifacts::root().join("deploy/crds/memcached.yaml");
    let text = std::fs::read_to_string(&path)?;
    let doc = serde_yaml::Deserializer::from_str(&text)
        .next()
        .context("an empty CRD file")?;
    let template = CustomResourceDefinition::deserialize(doc)
        .with_context(|| format!("parsing {}", path.display()))?;
    for kind in kinds {
        testenv::apply_crd(
            client,
            &kind.crd(&template),
            FIELD_MANAGER,
            Duration::from_secs(60),
        )
        .await?;
    }
    Ok(())
}

/// Creates the namespaces `names`.
pub async fn create_namespaces(client: &Client, names: &[String]) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in names {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
    }
    Ok(())
}

/// The plane's own floor for the hot swap: `n` headless Services like the second build's,
/// server-side applied `concurrency` at a time into a namespace of their own, with no operator
/// in the loop; how long they took.
pub async fn service_floor(client: &Client, n: usize, concurrency: usize) -> Result<Duration> {
    let ns = "bench-floor";
    create_namespaces(client, &[ns.to_owned()]).await?;
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let start = Instant::now();
    let applies = futures::stream::iter(0..n).map(|i| {
        let (api, params) = (&api, &params);
        async move {
            let name = format!("floor-{i}");
            let svc = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "clusterIP": "None",
                    "selector": {"app": "memcached", "memcached_cr": name},
                    "ports": [{"name": "memcached", "port": 11211, "targetPort": "memcached"}],
                },
            });
            api.patch(&name, params, &Patch::Apply(&svc))
                .await
                .with_context(|| format!("applying Service {ns}/{name}"))
        }
    });
    let mut applies = applies.buffer_unordered(concurrency.max(1));
    while let Some(done) = applies.next().await {
        done?;
    }
    Ok(start.elapsed())
}

/// One Memcached object of the load.
#[derive(Debug, Clone)]
pub struct Cr {
    /// Index into the run's kinds.
    pub kind: usize,
    /// Index of the namespace.
    pub ns_index: usize,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.size`, 1 to 3.
    pub size: i64,
}

/// `per_kind` objects of each of `kinds` kinds, round-robin over the namespaces.
pub fn plan(kinds: usize, per_kind: usize) -> Vec<Cr> {
    (0..kinds)
        .flat_map(|kind| {
            (0..per_kind).map(move |i| Cr {
                kind,
                ns_index: i % NAMESPACES,
                namespace: namespace(i % NAMESPACES),
                // Unique across kinds: each names a Deployment and its pods' label.
                name: format!("mc-{kind}-{i}"),
                size: 1 + (i % 3) as i64,
            })
        })
        .collect()
}

/// Creates every object, one task per namespace with its own client (`clients[i]` for
/// namespace `i`); returns the POSTs made.
pub async fn create_all(clients: &[Client], kinds: &[Kind], crs: &[Cr]) -> Result<usize> {
    let mut by_ns: BTreeMap<usize, Vec<&Cr>> = BTreeMap::new();
    for cr in crs {
        by_ns.entry(cr.ns_index).or_default().push(cr);
    }
    let resources: Vec<ApiResource> = kinds.iter().map(Kind::api_resource).collect();
    let tasks = by_ns.into_iter().map(|(i, crs)| {
        let (resources, client) = (&resources, &clients[i % clients.len()]);
        async move {
            for cr in &crs {
                let ar = &resources[cr.kind];
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &cr.namespace, ar);
                let obj = DynamicObject::new(&cr.name, ar)
                    .within(&cr.namespace)
                    .data(json!({"spec": {"size": cr.size}}));
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| {
                        format!("creating {} {}/{}", ar.kind, cr.namespace, cr.name)
                    })?;
            }
            anyhow::Ok(crs.len())
        }
    });
    let counts = futures::future::try_join_all(tasks).await?;
    Ok(counts.into_iter().sum())
}

/// Creates and deletes one object of each kind in `namespace`, so that the apiserver has set
/// up each new resource before the clock starts (the first create of a kind is slow).
pub async fn warm_up(client: &Client, kinds: &[Kind], namespace: &str) -> Result<()> {
    for kind in kinds {
        let ar = kind.api_resource();
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
        let obj = DynamicObject::new("warm-up", &ar)
            .within(namespace)
            .data(json!({"spec": {"size": 1}}));
        api.create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("creating a warm-up {}", ar.kind))?;
        api.delete("warm-up", &Default::default()).await?;
    }
    Ok(())
}

/// When the load reached each milestone, counted from the first create.
#[derive(Debug, Clone, Copy)]
pub struct Convergence {
    /// Every object has its Deployment.
    pub deployments_exist: Duration,
    /// Every Deployment has `size` available replicas and every `status.nodes` lists `size`
    /// pods.
    pub converged: Duration,
}

/// Watches the parents and Deployments, to tell when a load has converged without polling
/// the apiserver (and adding to its request counts).
pub struct Tracker {
    parents: Vec<(ApiResource, Store<DynamicObject>)>,
    deployments: Store<Deployment>,
    tasks: Vec<JoinHandle<()>>,
}

impl Tracker {
    /// Starts the watches and waits until their first lists are in.
    pub async fn start(client: &Client, kinds: &[Kind]) -> Result<Tracker> {
        let mut tasks = Vec::new();
        let mut parents = Vec::new();
        for kind in kinds {
            let ar = kind.api_resource();
            let writer = Writer::<DynamicObject>::new(ar.clone());
            let store = writer.as_reader();
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            tasks.push(tokio::spawn(drive(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer),
            )));
            parents.push((ar, store));
        }
        let (deployments, writer) = reflector::store::<Deployment>();
        tasks.push(tokio::spawn(drive(
            watcher(
                Api::<Deployment>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(writer),
        )));
        let tracker = Tracker {
            parents,
            deployments,
            tasks,
        };
        for (_, store) in &tracker.parents {
            store.wait_until_ready().await?;
        }
        tracker.deployments.wait_until_ready().await?;
        Ok(tracker)
    }

    /// How many objects have a Deployment, and how many have converged.
    fn progress(&self, crs: &[Cr]) -> (usize, usize, Option<String>) {
        let (mut exist, mut done, mut lagging) = (0, 0, None);
        for cr in crs {
            let dep = self
                .deployments
                .get(&ObjectRef::new(&cr.name).within(&cr.namespace));
            let (ar, store) = &self.parents[cr.kind];
            let parent =
                store.get(&ObjectRef::new_with(&cr.name, ar.clone()).within(&cr.namespace));
            let nodes = parent
                .as_ref()
                .and_then(|p| p.data["status"]["nodes"].as_array().map(Vec::len))
                .unwrap_or(0);
            let (replicas, available) = dep.as_ref().map_or((None, 0), |d| {
                (
                    d.spec.replicas,
                    d.status
                        .as_ref()
                        .and_then(|s| s.available_replicas)
                        .unwrap_or(0),
                )
            });
            let size = cr.size as i32;
            if dep.is_some() {
                exist += 1;
            }
            if nodes == cr.size as usize && replicas == Some(size) && available == size {
                done += 1;
            } else if lagging.is_none() {
                lagging = Some(format!(
                    "{} {}/{}: size {size}, deployment {}, replicas {replicas:?}, available {available}, status.nodes {nodes}",
                    ar.kind,
                    cr.namespace,
                    cr.name,
                    if dep.is_some() { "exists" } else { "missing" },
                ));
            }
        }
        (exist, done, lagging)
    }

    /// Waits until every object has converged, failing if an operator process exits or
    /// `timeout` passes. Times count from `start`.
    pub async fn wait(
        &self,
        crs: &[Cr],
        start: Instant,
        timeout: Duration,
        procs: &mut [Proc],
    ) -> Result<Convergence> {
        let mut deployments_exist = None;
        loop {
            let (exist, done, lagging) = self.progress(crs);
            if exist == crs.len() && deployments_exist.is_none() {
                deployments_exist = Some(start.elapsed());
            }
            if done == crs.len() {
                return Ok(Convergence {
                    deployments_exist: deployments_exist.unwrap_or_else(|| start.elapsed()),
                    converged: start.elapsed(),
                });
            }
            for p in procs.iter_mut() {
                p.check_alive()?;
            }
            if start.elapsed() > timeout {
                bail!(
                    "not converged after {timeout:?}: {exist}/{n} Deployments exist, {done}/{n} converged; e.g. {}",
                    lagging.unwrap_or_default(),
                    n = crs.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn drive<S: futures::Stream + Send>(stream: S) {
    stream.for_each(|_| std::future::ready(())).await;
}

/// How many of `crs` have a Service named after them (the second plugin build's child).
pub async fn services_for(client: &Client, crs: &[Cr]) -> Result<usize> {
    let list = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let have: HashSet<(String, String)> = list
        .items
        .iter()
        .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    Ok(crs
        .iter()
        .filter(|cr| have.contains(&(cr.namespace.clone(), cr.name.clone())))
        .count())
}

/// Events recorded on objects of these kinds (only operators record those).
pub async fn parent_events(client: &Client, kinds: &[Kind]) -> Result<usize> {
    let api: Api<Event> = Api::all(client.clone());
    let mut n = 0;
    for kind in kinds {
        let lp = ListParams::default().fields(&format!("involvedObject.kind={}", kind.kind));
        n += api.list(&lp).await?.items.len();
    }
    Ok(n)
}

/// `apiserver_request_total` by verb, resource and subresource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests(pub BTreeMap<(String, String, String), f64>);

impl Requests {
    /// Reads the counters now.
    pub async fn read(client: &Client) -> Result<Requests> {
        let text = testenv::metrics::metrics_text(client).await?;
        let mut map = BTreeMap::new();
        for s in testenv::metrics::samples(&text, "apiserver_request_total") {
            let label = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            *map.entry((label("verb"), label("resource"), label("subresource")))
                .or_default() += s.value;
        }
        Ok(Requests(map))
    }

    /// The requests made since `before`.
    pub fn since(&self, before: &Requests) -> Requests {
        Requests(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect(),
        )
    }

    /// Takes away `n` requests the runner itself made.
    pub fn discount(&mut self, verb: &str, resource: &str, n: usize) {
        if let Some(v) = self
            .0
            .get_mut(&(verb.to_owned(), resource.to_owned(), String::new()))
        {
            *v = (*v - n as f64).max(0.0);
        }
    }

    /// The requests an operator makes, by verb: everything on the parent resources, on
    /// Deployments and Services (not their status, which the controller-manager writes), and
    /// reads of Pods. The rest of the plane's traffic does not touch these. Watches are
    /// counted only when they end, so they are left out.
    pub fn operator(&self, parent_resources: &[String]) -> OperatorRequests {
        let mut by_verb = BTreeMap::new();
        let mut detail = BTreeMap::new();
        for ((verb, resource, sub), n) in &self.0 {
            // GETs of parents come from the controller-manager's garbage collector checking
            // owners (hundreds a minute at 1000 objects, alike for every operator); none of the
            // operators GETs a parent, they read them from watch caches.
            let gc_owner_check = verb == "GET" && sub.is_empty();
            let ours = (parent_resources.contains(resource) && !gc_owner_check)
                || (matches!(resource.as_str(), "deployments" | "services") && sub.is_empty())
                || (resource == "pods"
                    && sub.is_empty()
                    && matches!(verb.as_str(), "GET" | "LIST"));
            if !ours || verb.starts_with("WATCH") || *n <= 0.0 {
                continue;
            }
            *by_verb.entry(verb.clone()).or_insert(0.0) += n;
            let what = if sub.is_empty() {
                format!("{verb} {resource}")
            } else {
                format!("{verb} {resource}/{sub}")
            };
            *detail.entry(what).or_insert(0.0) += n;
        }
        OperatorRequests { by_verb, detail }
    }
}

/// An operator's requests over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorRequests {
    /// Count per verb (`GET`, `LIST`, `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`).
    pub by_verb: BTreeMap<String, f64>,
    /// Count per `VERB resource[/subresource]`.
    pub detail: BTreeMap<String, f64>,
}

impl OperatorRequests {
    /// GETs and LISTs.
    pub fn reads(&self) -> f64 {
        // A float sum starts at -0.0.
        ["GET", "LIST"].iter().map(|v| self.verb(v)).sum::<f64>() + 0.0
    }

    /// Everything else: creates, updates, patches, applies, deletes.
    pub fn writes(&self) -> f64 {
        self.by_verb
            .iter()
            .filter(|(v, _)| !matches!(v.as_str(), "GET" | "LIST"))
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0
    }

    /// The count for one verb.
    pub fn verb(&self, verb: &str) -> f64 {
        self.by_verb.get(verb).copied().unwrap_or(0.0)
    }

    /// `APPLY deployments 20, PUT memcacheds/status 41, …`.
    pub fn describe(&self) -> String {
        if self.detail.is_empty() {
            return "none".into();
        }
        self.detail
            .iter()
            .map(|(what, n)| format!("{what} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(entries: &[(&str, &str, &str, f64)]) -> Requests {
        Requests(
            entries
                .iter()
                .map(|(v, r, s, n)| ((v.to_string(), r.to_string(), s.to_string()), *n))
                .collect(),
        )
    }

    #[test]
    fn operator_view_keeps_only_operator_traffic() {
        let r = req(&[
            ("POST", "memcacheds", "", 20.0),
            ("PUT", "memcacheds", "status", 30.0),
            ("APPLY", "deployments", "", 20.0),
            ("PUT", "deployments", "status", 99.0),
            ("POST", "pods", "", 40.0),
            ("LIST", "pods", "", 1.0),
            ("GET", "memcacheds", "", 600.0),
            ("WATCH", "deployments", "", 3.0),
            ("PUT", "leases", "", 7.0),
        ]);
        let ops = r.operator(&["memcacheds".into()]);
        assert_eq!(ops.writes(), 70.0);
        assert_eq!(ops.reads(), 1.0);
        assert_eq!(ops.verb("APPLY"), 20.0);
    }

    #[test]
    fn deltas_and_discounts() {
        let before = req(&[("POST", "memcacheds", "", 5.0)]);
        let after = req(&[("POST", "memcacheds", "", 30.0), ("GET", "pods", "", 2.0)]);
        let mut d = after.since(&before);
        d.discount("POST", "memcacheds", 20);
        assert_eq!(
            d.0[&("POST".into(), "memcacheds".into(), String::new())],
            5.0
        );
    }

    #[test]
    fn plan_spreads_sizes_and_namespaces() {
        let p = plan(2, 20);
        assert_eq!(p.len(), 40);
        assert_eq!(p.iter().filter(|c| c.namespace == "bench-3").count(), 4);
        assert!(p.iter().all(|c| (1..=3).contains(&c.size)));
    }
}
