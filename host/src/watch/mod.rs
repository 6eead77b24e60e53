//! Shared watches: one watch and one cache per resource type, however many plugins use it.
//!
//! A plugin's controller [`Hub::subscribe`]s to the kinds it needs and gets a [`Subscription`]:
//! the shared [`Cache`] plus its own stream of [`Change`]s. The first subscriber starts the
//! watch; dropping the last one stops it. Changes fan out over unbounded channels so a slow
//! plugin never holds up the watch or the other plugins.
//!
//! Related kinds marked metadata-only are watched as `PartialObjectMetadata`: the cache then
//! holds only `apiVersion`, `kind` and `metadata`. A kind watched both ways gets two watches.

pub mod cache;
pub mod lenient;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta, TypeMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};

pub use cache::{Cache, ObjKey, controller_uid, key_of};

use crate::telemetry::health::Health;
pub use lenient::{Lenient, UNDECODABLE_ANNOTATION, undecodable};

/// What changed in a watched resource type.
#[derive(Debug, Clone)]
pub enum Change {
    /// An object was created or updated (or seen in a (re)list).
    Applied(Arc<DynamicObject>),
    /// An object is gone; this is its last known state.
    Deleted(Arc<DynamicObject>),
}

impl Change {
    /// The object concerned.
    pub fn object(&self) -> &Arc<DynamicObject> {
        match self {
            Change::Applied(o) | Change::Deleted(o) => o,
        }
    }
}

/// Identifies one shared watch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WatchKey {
    /// The resource type.
    pub resource: ApiResource,
    /// The namespace watched, `None` for all.
    pub namespace: Option<String>,
    /// Watch metadata only.
    pub metadata_only: bool,
}

impl std::fmt::Display for WatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.resource;
        match &self.namespace {
            Some(ns) => write!(f, "{} {} in {ns}", r.api_version, r.kind)?,
            None => write!(f, "{} {}", r.api_version, r.kind)?,
        }
        if self.metadata_only {
            f.write_str(" (metadata)")?;
        }
        Ok(())
    }
}

/// Starts and shares watches.
#[derive(Clone)]
pub struct Hub {
    client: Client,
    // Watch namespaced kinds in this namespace only (`--watch-namespace`).
    namespace: Option<String>,
    watches: Arc<Mutex<HashMap<WatchKey, Weak<SharedWatch>>>>,
    health: Health,
}

struct SharedWatch {
    key: WatchKey,
    cache: Arc<Cache>,
    subscribers: Mutex<Subscribers>,
    synced: watch::Receiver<bool>,
    task: tokio::task::AbortHandle,
    health: Health,
    // Since when the API server no longer serves the resource (its CRD was deleted): its
    // lists get 404.
    missing: Missing,
}

#[derive(Default)]
struct Subscribers {
    next_id: u64,
    senders: Vec<(u64, mpsc::UnboundedSender<Change>)>,
}

impl Drop for SharedWatch {
    fn drop(&mut self) {
        self.task.abort();
        self.health.watch_ok(&self.key.to_string());
        tracing::debug!(kind = %self.key.resource.kind, "watch stopped");
    }
}

/// One user's handle on a shared watch. Dropping it unsubscribes.
pub struct Subscription {
    watch: Arc<SharedWatch>,
    id: u64,
    /// Changes since subscribing, starting with every object already cached.
    pub changes: mpsc::UnboundedReceiver<Change>,
}

impl Subscription {
    /// The shared cache of this resource type.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.watch.cache
    }

    /// The watched resource type.
    pub fn resource(&self) -> &ApiResource {
        &self.watch.key.resource
    }

    /// Waits until the first list has been cached.
    pub async fn synced(&self) {
        let mut rx = self.watch.synced.clone();
        // The sender lives in the watch task, which only ends when the watch is dropped.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// True once the first list has been cached.
    pub fn is_synced(&self) -> bool {
        *self.watch.synced.borrow()
    }

    /// Since when the API server answers this watch with 404 Not Found (its resource type is
    /// no longer served), shared with the watch.
    pub fn missing(&self) -> Missing {
        self.watch.missing.clone()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = self.watch.subscribers.lock().expect("subscribers lock");
        subs.senders.retain(|(id, _)| *id != self.id);
    }
}

impl Hub {
    /// A hub that watches through `client`, in every namespace or only in `namespace`, and
    /// reports failing watches to `health`.
    pub fn new(client: Client, namespace: Option<String>, health: Health) -> Self {
        Hub {
            client,
            namespace,
            watches: Arc::default(),
            health,
        }
    }

    /// Number of watches running now.
    pub fn watch_count(&self) -> usize {
        let map = self.watches.lock().expect("hub lock");
        map.values().filter(|w| w.strong_count() > 0).count()
    }

    /// Subscribes to a resource type, starting its watch if nobody watches it yet.
    pub fn subscribe(
        &self,
        resource: &ApiResource,
        namespaced: bool,
        metadata_only: bool,
    ) -> Subscription {
        let key = WatchKey {
            resource: resource.clone(),
            namespace: if namespaced {
                self.namespace.clone()
            } else {
                None
            },
            metadata_only,
        };
        let mut map = self.watches.lock().expect("hub lock");
        map.retain(|_, w| w.strong_count() > 0);
        let shared = match map.get(&key).and_then(Weak::upgrade) {
            Some(w) => w,
            None => {
                let w = self.start(key.clone());
                map.insert(key, Arc::downgrade(&w));
                w
            }
        };
        drop(map);

        let (tx, rx) = mpsc::unbounded_channel();
        let mut subs = shared.subscribers.lock().expect("subscribers lock");
        // Seed a late subscriber with what is cached; a fresh watch seeds it itself.
        if *shared.synced.borrow() {
            for obj in shared.cache.list(None, |_| true) {
                let _ = tx.send(Change::Applied(obj));
            }
        }
        let id = subs.next_id;
        subs.next_id += 1;
        subs.senders.push((id, tx));
        drop(subs);
        Subscription {
            watch: shared,
            id,
            changes: rx,
        }
    }

    fn start(&self, key: WatchKey) -> Arc<SharedWatch> {
        let cache = Arc::new(Cache::default());
        let (synced_tx, synced_rx) = watch::channel(false);
        let missing = Missing::default();
        Arc::new_cyclic(|weak: &Weak<SharedWatch>| {
            let task = tokio::spawn(run_watch(
                self.client.clone(),
                key.clone(),
                cache.clone(),
                weak.clone(),
                synced_tx,
                (self.health.clone(), missing.clone()),
            ));
            SharedWatch {
                key,
                cache,
                subscribers: Mutex::default(),
                synced: synced_rx,
                task: task.abort_handle(),
                health: self.health.clone(),
                missing,
            }
        })
    }
}

/// What the cache keeps of an object: no managed fields, and always its `apiVersion` and
/// `kind` (list items of built-in kinds come without them).
fn strip(mut obj: DynamicObject, types: &TypeMeta) -> Arc<DynamicObject> {
    if obj.types.as_ref().is_none_or(|t| t.kind.is_empty()) {
        obj.types = Some(types.clone());
    }
    if let Some(error) = undecodable(&obj) {
        tracing::warn!(
            kind = obj.types.as_ref().map_or("", |t| t.kind.as_str()),
            namespace = obj.metadata.namespace.as_deref().unwrap_or(""),
            name = obj.metadata.name.as_deref().unwrap_or(""),
            error,
            "object cannot be decoded; kept by its metadata only"
        );
    }
    obj.managed_fields_mut().clear();
    Arc::new(obj)
}

fn broadcast(watch: &Weak<SharedWatch>, changes: impl IntoIterator<Item = Change>) {
    let Some(watch) = watch.upgrade() else { return };
    let mut subs = watch.subscribers.lock().expect("subscribers lock");
    for change in changes {
        subs.senders
            .retain(|(_, tx)| tx.send(change.clone()).is_ok());
    }
}

async fn run_watch(
    client: Client,
    key: WatchKey,
    cache: Arc<Cache>,
    me: Weak<SharedWatch>,
    synced: watch::Sender<bool>,
    (health, missing): (Health, Missing),
) {
    let kind = key.resource.kind.clone();
    let name = key.to_string();
    tracing::debug!(%kind, metadata_only = key.metadata_only, "watch started");
    let config = watcher::Config::default()
        .any_semantic()
        .timeout(crate::config::WATCH_TIMEOUT_SECONDS);
    let types = TypeMeta {
        api_version: key.resource.api_version.clone(),
        kind: key.resource.kind.clone(),
    };
    let events = if key.metadata_only {
        let api = match &key.namespace {
            Some(ns) => {
                Api::<PartialObjectMeta<DynamicObject>>::namespaced_with(client, ns, &key.resource)
            }
            None => Api::all_with(client, &key.resource),
        };
        let types = types.clone();
        watcher(api, config)
            .default_backoff()
            .map(move |ev| ev.map(|e| e.map_to_dynamic(&types)))
            .boxed()
    } else {
        let api = match &key.namespace {
            Some(ns) => Api::<Lenient>::namespaced_with(client, ns, &key.resource),
            None => Api::all_with(client, &key.resource),
        };
        // One object too deep to decode must not fail its kind's watch.
        watcher(api, config)
            .default_backoff()
            .map(|ev| ev.map(unwrap_lenient))
            .boxed()
    };
    let mut events = std::pin::pin!(events);
    let mut relist: Vec<Arc<DynamicObject>> = Vec::new();
    while let Some(event) = events.next().await {
        match &event {
            Ok(_) => {
                health.watch_ok(&name);
                missing.set(false);
            }
            Err(e) => {
                health.watch_failed(&name, &crate::text::chain(e));
                missing.set(is_not_found(e));
            }
        }
        match event {
            Ok(watcher::Event::Init) => relist.clear(),
            Ok(watcher::Event::InitApply(obj)) => relist.push(strip(obj, &types)),
            Ok(watcher::Event::InitDone) => {
                let listed = std::mem::take(&mut relist);
                let applied: Vec<Change> = listed.iter().cloned().map(Change::Applied).collect();
                let gone = cache.replace(listed);
                synced.send_replace(true);
                broadcast(
                    &me,
                    applied
                        .into_iter()
                        .chain(gone.into_iter().map(Change::Deleted)),
                );
            }
            Ok(watcher::Event::Apply(obj)) => {
                let obj = strip(obj, &types);
                cache.apply(obj.clone());
                broadcast(&me, [Change::Applied(obj)]);
            }
            Ok(watcher::Event::Delete(obj)) => {
                let obj = strip(obj, &types);
                let last = cache.delete(&key_of(&obj)).unwrap_or(obj);
                broadcast(&me, [Change::Deleted(last)]);
            }
            Err(err) => {
                tracing::warn!(%kind, error = %crate::text::chain(&err), "watch failed; retrying with backoff")
            }
        }
    }
}

/// Since when a watch's resource type has not been served (its lists answered 404).
#[derive(Debug, Clone, Default)]
pub struct Missing(Arc<Mutex<Option<Instant>>>);

impl Missing {
    fn set(&self, missing: bool) {
        let mut since = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match (missing, since.is_some()) {
            (true, false) => *since = Some(Instant::now()),
            (false, true) => *since = None,
            _ => {}
        }
    }

    /// Whether it has been missing for `long` at least (an apiserver that just started
    /// answers 404 for custom resources until it has read their CRDs).
    pub fn for_at_least(&self, long: std::time::Duration) -> bool {
        let since = *self.0.lock().unwrap_or_else(|p| p.into_inner());
        since.is_some_and(|t| t.elapsed() >= long)
    }
}

/// A list or watch answered 404: the resource type is not served (any more).
fn is_not_found(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

fn unwrap_lenient(event: watcher::Event<Lenient>) -> watcher::Event<DynamicObject> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(Lenient(o)) => watcher::Event::InitApply(o),
        watcher::Event::Apply(Lenient(o)) => watcher::Event::Apply(o),
        watcher::Event::Delete(Lenient(o)) => watcher::Event::Delete(o),
    }
}

/// Turns metadata-only watch events into [`DynamicObject`]s with empty bodies.
trait MapToDynamic {
    fn map_to_dynamic(self, types: &TypeMeta) -> watcher::Event<DynamicObject>;
}

impl MapToDynamic for watcher::Event<PartialObjectMeta<DynamicObject>> {
    fn map_to_dynamic(self, types: &TypeMeta) -> watcher::Event<DynamicObject> {
        let convert = |p: PartialObjectMeta<DynamicObject>| DynamicObject {
            types: Some(types.clone()),
            metadata: p.metadata,
            data: serde_json::Value::Object(Default::default()),
        };
        match self {
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
            watcher::Event::InitApply(p) => watcher::Event::InitApply(convert(p)),
            watcher::Event::Apply(p) => watcher::Event::Apply(convert(p)),
            watcher::Event::Delete(p) => watcher::Event::Delete(convert(p)),
        }
    }
}
