//! Shared watches: one watch and one cache per resource type, however many plugins use it.
//!
//! A plugin's controller [`Hub::subscribe`]s to the kinds it needs and gets a [`Subscription`]:
//! the shared [`Cache`] plus its own stream of [`Change`]s. The first subscriber starts the
//! watch; dropping the last one stops it. Changes fan out over unbounded channels so a slow
//! plugin never holds up the watch or the other plugins.
//!
//! Every object is decoded straight from the API server's JSON into an [`Object`] (its text
//! and the metadata the host indexes), never into a `Value` tree.
//!
//! Related kinds marked metadata-only are watched as `PartialObjectMetadata`: the cache then
//! holds only `apiVersion`, `kind` and `metadata`. A kind watched both ways gets two watches.
//!
//! A hub of one [`Shard`] ([`Hub::sharded`]) asks the API server for that shard's objects only
//! (`shardSelector`) and drops any other it is sent, so it works the same on a server without
//! sharded watches; it says once in the log that the server sent objects of other shards.
//! [`Hub::whole`] is the hub it was narrowed from, for the kinds a shard must see whole (the
//! children of cluster-scoped parents, which may be in any namespace).

pub mod cache;
pub mod object;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, TypeMeta};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, watch};

pub use cache::{Cache, ObjKey, controller_uid};
pub use object::{Full, Labels, MetaOnly, Object};

use crate::shard::Shard;
use crate::telemetry::health::Health;
use crate::telemetry::metrics::{CacheLabels, metrics};

/// What changed in a watched resource type.
#[derive(Debug, Clone)]
pub enum Change {
    /// An object was created or updated (or seen in a (re)list).
    Applied(Arc<Object>),
    /// An object is gone; this is its last known state.
    Deleted(Arc<Object>),
}

impl Change {
    /// The object concerned.
    pub fn object(&self) -> &Arc<Object> {
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
    /// Watch this shard's objects only.
    pub shard: Option<Shard>,
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
        if let Some(shard) = &self.shard {
            write!(f, " (shard {shard})")?;
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
    shard: Option<Shard>,
    // Set once the server was seen sending objects of other shards.
    unsharded_server: Arc<AtomicBool>,
    // The hub this one was narrowed from: its watches see every shard.
    whole: Option<Arc<Hub>>,
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
        let labels = cache_labels(&self.key);
        metrics().cache_objects.remove(&labels);
        metrics().cache_bytes.remove(&labels);
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
            shard: None,
            unsharded_server: Arc::default(),
            whole: None,
        }
    }

    /// This hub, watching only the objects of `shard`: its lists and watches carry the
    /// shard's `shardSelector`, and what the server sends of other shards is dropped.
    pub fn sharded(self, shard: Shard) -> Hub {
        let whole = Arc::new(self.whole().clone());
        Hub {
            client: with_shard_selector(&whole.client, &shard),
            shard: Some(shard),
            watches: Arc::default(),
            whole: Some(whole),
            ..self
        }
    }

    /// The hub this one was narrowed from, whose watches see every shard (this one, when it
    /// is not sharded). Its watches are shared by every shard narrowed from it.
    pub fn whole(&self) -> &Hub {
        self.whole.as_deref().unwrap_or(self)
    }

    /// Whether this hub's watches see the objects of `namespace` (`""`: cluster-scoped).
    pub fn holds(&self, namespace: &str) -> bool {
        self.shard.is_none_or(|shard| shard.holds(namespace))
    }

    /// The namespace watched, `None` for all.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
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
            shard: self.shard,
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
                self.unsharded_server.clone(),
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

/// What the cache keeps of an object: always its `apiVersion` and `kind` (list items of
/// built-in kinds come without them, metadata-only ones name `PartialObjectMetadata`).
fn typed(obj: Object, types: &TypeMeta) -> Arc<Object> {
    let obj = obj.with_type(types);
    if let Some(error) = obj.undecodable() {
        tracing::warn!(
            kind = obj.kind(),
            namespace = obj.namespace().unwrap_or(""),
            name = obj.name(),
            error,
            "object cannot be decoded; kept by its metadata only"
        );
    }
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
    unsharded_server: Arc<AtomicBool>,
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
            Some(ns) => Api::<MetaOnly>::namespaced_with(client, ns, &key.resource),
            None => Api::all_with(client, &key.resource),
        };
        watcher(api, config)
            .default_backoff()
            .map(|ev| ev.map(|e| unwrap(e, |MetaOnly(o)| o)))
            .boxed()
    } else {
        let api = match &key.namespace {
            Some(ns) => Api::<Full>::namespaced_with(client, ns, &key.resource),
            None => Api::all_with(client, &key.resource),
        };
        watcher(api, config)
            .default_backoff()
            .map(|ev| ev.map(|e| unwrap(e, |Full(o)| o)))
            .boxed()
    };
    let mut events = std::pin::pin!(events);
    let mut relist: Vec<Arc<Object>> = Vec::new();
    let labels = cache_labels(&key);
    let m = metrics();
    let (objects, bytes) = (
        m.cache_objects.get_or_create_owned(&labels),
        m.cache_bytes.get_or_create_owned(&labels),
    );
    // Objects of other shards, which a server without sharded watches sends, go no further.
    let mine = |obj: &Object| {
        let Some(shard) = &key.shard else { return true };
        if shard.holds(obj.namespace().unwrap_or("")) {
            return true;
        }
        if !unsharded_server.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                shard = %shard,
                "the API server sent objects of other shards: it does not shard lists and watches (feature gate ShardedListAndWatch); filtering them here instead"
            );
        }
        false
    };
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) | watcher::Event::Delete(o),
            ) if !mine(&o) => {
                continue;
            }
            other => other,
        };
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
            Ok(watcher::Event::InitApply(obj)) => relist.push(typed(obj, &types)),
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
                let obj = typed(obj, &types);
                cache.apply(obj.clone());
                broadcast(&me, [Change::Applied(obj)]);
            }
            Ok(watcher::Event::Delete(obj)) => {
                let obj = typed(obj, &types);
                let last = cache.delete(&obj.key()).unwrap_or(obj);
                broadcast(&me, [Change::Deleted(last)]);
            }
            Err(err) => {
                tracing::warn!(%kind, error = %crate::text::chain(&err), "watch failed; retrying with backoff")
            }
        }
        objects.set(cache.len() as i64);
        bytes.set(cache.bytes() as i64);
    }
}

fn cache_labels(key: &WatchKey) -> CacheLabels {
    CacheLabels {
        shard: key.shard.map(|s| s.to_string()).unwrap_or_default(),
        kind: wasmop_contract::wire::kind_key(&key.resource.api_version, &key.resource.kind),
        body: if key.metadata_only {
            "metadata"
        } else {
            "full"
        },
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

fn unwrap<K>(event: watcher::Event<K>, object: impl Fn(K) -> Object) -> watcher::Event<Object> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(object(o)),
        watcher::Event::Apply(o) => watcher::Event::Apply(object(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(object(o)),
    }
}

/// `client`, adding `shard`'s `shardSelector` to every request (a hub's client only lists and
/// watches).
fn with_shard_selector(client: &Client, shard: &Shard) -> Client {
    let param = shard.query();
    let inner = client.clone();
    let service = tower::service_fn(move |mut request: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let uri = request.uri();
        let with = match uri.path_and_query().and_then(|pq| pq.query()) {
            Some(q) if !q.is_empty() => format!("{}?{q}&{param}", uri.path()),
            _ => format!("{}?{param}", uri.path()),
        };
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = with.parse().ok().or(parts.path_and_query);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        async move { inner.send(request).await }
    });
    Client::new(service, client.default_namespace())
}
