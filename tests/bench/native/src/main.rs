//! `native-memcached`: the Memcached plugin's reconcile logic as a plain `kube::runtime`
//! controller, with no sandbox. It is the native baseline of `tests/bench`: what wasmop's
//! design costs at best, with the plugin's code called directly.
//!
//! It does what the host does for one plugin, natively: reflectors for the parents, the
//! Deployments they control and (metadata-only) the Pods their related selectors pick; a
//! request assembled from those stores and run through the SDK's JSON path
//! (`wasmop_guest::testing::reconcile`, the code the wasm export runs); then server-side apply
//! of each child that is not already as desired, pruning, and a status write when it changed
//! (`observedGeneration`, a `Ready` condition, `lastTransitionTime` stamping). Events the
//! plugin returns are not recorded.
//!
//! ```sh
//! native-memcached --kind cache.example.com/v1alpha1/Memcached --concurrency 4
//! ```
//!
//! kube-rs has no client-side rate limit; `--qps`/`--burst` add a token bucket in front of the
//! requests reconciles make (watches are not limited), so the knob matches the Go baseline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams,
    Preconditions,
};
use kube::core::{GroupVersionKind, Selector, SelectorExt};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use memcached::MemcachedPlugin;
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use wasmop_contract::wire::{WireRequest, kind_key};

/// The field manager of every write.
const MANAGER: &str = "native-memcached";
/// Same as the host: a burst of watch events becomes one reconcile.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "native-memcached",
    about = "The Memcached plugin as a native kube-rs controller"
)]
struct Args {
    /// The parent kind, `group/version/Kind`.
    #[arg(long, default_value = "cache.example.com/v1alpha1/Memcached")]
    kind: String,
    /// Parents reconciled at the same time.
    #[arg(long, default_value_t = 1)]
    concurrency: u16,
    /// Client requests per second from reconciles; 0: no limit (kube-rs's default).
    #[arg(long, default_value_t = 0.0)]
    qps: f64,
    /// Token-bucket burst for `--qps`.
    #[arg(long, default_value_t = 10)]
    burst: u32,
    /// Reconcile every parent this often even when nothing changed.
    #[arg(long, default_value_t = 600)]
    resync_seconds: u64,
}

/// What a failed reconcile reports; the controller retries with backoff.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("plugin: {0}")]
    Plugin(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

type ParentKey = (String, String);

/// Shared by every reconcile.
struct Ctx {
    client: Client,
    parent_ar: ApiResource,
    deployments: Store<Deployment>,
    pods: Store<PartialObjectMeta<Pod>>,
    /// The related selectors of each parent's last reconcile, to map Pod changes back.
    selectors: Mutex<HashMap<ParentKey, Vec<Selector>>>,
    /// The status last written per parent: the store may not show it yet when the next
    /// event comes, and writing it again would be a wasted request.
    written: Mutex<HashMap<ParentKey, Value>>,
    /// Consecutive failures per parent, for the backoff.
    failures: Mutex<HashMap<ParentKey, u32>>,
    limiter: Option<RateLimiter>,
    resync: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    let gvk = parse_kind(&args.kind)?;
    let client = Client::try_default().await?;
    let (parent_ar, _) = kube::discovery::pinned_kind(&client, &gvk).await?;

    let wc = watcher::Config::default();
    let parent_writer = Writer::<DynamicObject>::new(parent_ar.clone());
    let parents = parent_writer.as_reader();
    let parent_stream = watcher(Api::all_with(client.clone(), &parent_ar), wc.clone())
        .default_backoff()
        .modify(|o: &mut DynamicObject| o.managed_fields_mut().clear())
        .reflect(parent_writer)
        .applied_objects();

    let (deployments, dep_writer) = reflector::store::<Deployment>();
    let dep_stream = watcher(Api::<Deployment>::all(client.clone()), wc.clone())
        .default_backoff()
        .modify(|d: &mut Deployment| d.managed_fields_mut().clear())
        .reflect(dep_writer)
        .touched_objects();

    let (pods, pod_writer) = reflector::store::<PartialObjectMeta<Pod>>();
    let pod_stream = watcher(Api::<PartialObjectMeta<Pod>>::all(client.clone()), wc)
        .default_backoff()
        .modify(|p: &mut PartialObjectMeta<Pod>| p.managed_fields_mut().clear())
        .reflect(pod_writer)
        .touched_objects();

    let limiter = (args.qps > 0.0).then(|| RateLimiter::new(args.qps, args.burst));
    let ctx = Arc::new(Ctx {
        client,
        parent_ar: parent_ar.clone(),
        deployments,
        pods,
        selectors: Mutex::default(),
        written: Mutex::default(),
        failures: Mutex::default(),
        limiter,
        resync: Duration::from_secs(args.resync_seconds),
    });
    tracing::info!(kind = %args.kind, concurrency = args.concurrency, qps = args.qps, "starting");

    // The streams below fill the stores once the controller polls them.
    let (ready_parents, ready_ctx) = (parents.clone(), Arc::clone(&ctx));
    tokio::spawn(async move {
        ready(&ready_parents).await;
        ready(&ready_ctx.deployments).await;
        ready(&ready_ctx.pods).await;
        tracing::info!("stores ready; reconciling");
    });
    let mapper_ctx = Arc::clone(&ctx);
    let mapper_ar = parent_ar.clone();
    Controller::for_stream_with(parent_stream, parents, parent_ar)
        .owns_stream_with(dep_stream, ())
        .watches_stream(pod_stream, move |pod: PartialObjectMeta<Pod>| {
            parents_of_pod(&mapper_ctx, &mapper_ar, &pod)
        })
        .with_config(
            ControllerConfig::default()
                .concurrency(args.concurrency)
                .debounce(DEBOUNCE),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
    Ok(())
}

fn parse_kind(kind: &str) -> anyhow::Result<GroupVersionKind> {
    match kind.split('/').collect::<Vec<_>>()[..] {
        [group, version, kind] if !version.is_empty() && !kind.is_empty() => {
            Ok(GroupVersionKind::gvk(group, version, kind))
        }
        _ => anyhow::bail!("--kind wants group/version/Kind, got {kind:?}"),
    }
}

/// Waits until `store` has its first list. `Store::wait_until_ready` wakes only the last of
/// several concurrent waiters, so each wait is short and retried.
async fn ready<K: kube::Resource + Clone>(store: &Store<K>)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    while tokio::time::timeout(Duration::from_millis(50), store.wait_until_ready())
        .await
        .is_err()
    {}
}

/// The parents whose last related selectors match this Pod (same namespace).
fn parents_of_pod(
    ctx: &Ctx,
    ar: &ApiResource,
    pod: &PartialObjectMeta<Pod>,
) -> Vec<ObjectRef<DynamicObject>> {
    let ns = pod.namespace().unwrap_or_default();
    let labels = pod.labels();
    let selectors = ctx.selectors.lock().expect("selectors lock");
    selectors
        .iter()
        .filter(|((pns, _), sels)| *pns == ns && sels.iter().any(|s| s.matches(labels)))
        .map(|((pns, name), _)| ObjectRef::new_with(name, ar.clone()).within(pns))
        .collect()
}

async fn reconcile(parent: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // The controller waits for the parents' store only.
    ready(&ctx.deployments).await;
    ready(&ctx.pods).await;
    let ns = parent.namespace().unwrap_or_default();
    let name = parent.name_any();
    let key = (ns.clone(), name.clone());
    if parent.meta().deletion_timestamp.is_some() {
        ctx.selectors.lock().expect("selectors lock").remove(&key);
        ctx.written.lock().expect("written lock").remove(&key);
        return Ok(Action::await_change());
    }
    let uid = parent.uid().unwrap_or_default();
    let parent_json = serde_json::to_value(parent.as_ref())?;

    let related =
        wasmop_guest::testing::related::<MemcachedPlugin>(&parent_json).map_err(Error::Plugin)?;
    let selectors = related
        .iter()
        .map(|r| Selector::try_from(r.label_selector.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Plugin(format!("selector: {e}")))?;
    let pods = ctx.pods.state_filter(|p| {
        p.namespace().as_deref() == Some(&ns) && selectors.iter().any(|s| s.matches(p.labels()))
    });
    ctx.selectors
        .lock()
        .expect("selectors lock")
        .insert(key.clone(), selectors);
    let children = ctx.deployments.state_filter(|d| {
        d.namespace().as_deref() == Some(&ns)
            && d.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.uid == uid)
    });

    let mut request = WireRequest {
        parent: parent_json,
        ..WireRequest::default()
    };
    let deployment_key = kind_key("apps/v1", "Deployment");
    let observed = request.children.entry(deployment_key).or_default();
    for d in &children {
        let mut obj = serde_json::to_value(d.as_ref())?;
        obj["apiVersion"] = json!("apps/v1");
        obj["kind"] = json!("Deployment");
        observed.insert(d.name_any(), obj);
    }
    let related_pods = request.related.entry(kind_key("v1", "Pod")).or_default();
    for p in &pods {
        let meta = serde_json::to_value(&p.metadata)?;
        related_pods.insert(
            p.name_any(),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta}),
        );
    }
    let response =
        wasmop_guest::testing::reconcile::<MemcachedPlugin>(&request).map_err(Error::Plugin)?;

    // Apply each child that is not already as desired.
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = json!([{
        "apiVersion": ctx.parent_ar.api_version, "kind": ctx.parent_ar.kind,
        "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true,
    }]);
    let mut desired_names = Vec::new();
    for mut child in response.children {
        let Some(obj) = child.as_object_mut() else {
            continue;
        };
        obj.remove("status");
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        meta["namespace"] = json!(ns);
        meta["ownerReferences"] = owner.clone();
        let child_name = meta["name"].as_str().unwrap_or_default().to_owned();
        let current = children.iter().find(|d| d.name_any() == child_name);
        let up_to_date = match current {
            Some(d) => wasmop::apply::diff::is_subset(&child, &serde_json::to_value(d.as_ref())?),
            None => false,
        };
        if !up_to_date {
            ctx.throttle().await;
            api.patch(
                &child_name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&child),
            )
            .await?;
        }
        desired_names.push(child_name);
    }
    // Prune what the parent controls and no longer wants.
    for d in children
        .iter()
        .filter(|d| !desired_names.contains(&d.name_any()))
    {
        ctx.throttle().await;
        let dp = DeleteParams::background().preconditions(Preconditions {
            uid: d.uid(),
            resource_version: None,
        });
        api.delete(&d.name_any(), &dp).await?;
    }

    let observed_status = parent.data.get("status");
    // The host's own rules, so both write the same status.
    let ready = wasmop::status::Ready {
        ok: true,
        reason: "Reconciled".into(),
        message: "reconciled natively".into(),
    };
    let status = wasmop::status::desired(
        observed_status,
        response.status.as_ref(),
        parent.meta().generation,
        &ready,
        &wasmop::status::now(),
    );
    let already_written = ctx.written.lock().expect("written lock").get(&key) == Some(&status);
    if observed_status != Some(&status) && !already_written {
        ctx.throttle().await;
        let parents: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &ns, &ctx.parent_ar);
        let patch = json!({
            "apiVersion": ctx.parent_ar.api_version, "kind": ctx.parent_ar.kind, "status": status,
        });
        parents
            .patch_status(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        ctx.written
            .lock()
            .expect("written lock")
            .insert(key.clone(), status);
    }

    ctx.failures.lock().expect("failures lock").remove(&key);
    let requeue = response
        .requeue_after_seconds
        .map_or(ctx.resync, |s| Duration::from_secs(s.max(1)));
    Ok(Action::requeue(requeue))
}

/// Per-parent backoff, the host's own: 250 ms, doubling up to 5 minutes.
fn error_policy(parent: Arc<DynamicObject>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let key = (parent.namespace().unwrap_or_default(), parent.name_any());
    let mut failures = ctx.failures.lock().expect("failures lock");
    let n = failures.entry(key).or_default();
    *n = n.saturating_add(1);
    let delay = wasmop::controller::queue::Backoff::default().delay(*n);
    tracing::warn!(parent = %parent.name_any(), %error, ?delay, "reconcile failed");
    Action::requeue(delay)
}

impl Ctx {
    async fn throttle(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.acquire().await;
        }
    }
}

/// A token bucket: `qps` tokens a second, at most `burst` saved up.
struct RateLimiter {
    qps: f64,
    burst: f64,
    state: tokio::sync::Mutex<(f64, Instant)>,
}

impl RateLimiter {
    fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            state: tokio::sync::Mutex::new((burst, Instant::now())),
        }
    }

    async fn acquire(&self) {
        loop {
            let wait = {
                let mut state = self.state.lock().await;
                let (tokens, last) = &mut *state;
                let now = Instant::now();
                *tokens =
                    (*tokens + now.duration_since(*last).as_secs_f64() * self.qps).min(self.burst);
                *last = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    return;
                }
                Duration::from_secs_f64((1.0 - *tokens) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}
