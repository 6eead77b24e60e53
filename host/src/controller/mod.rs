//! One controller per loaded plugin: watch → queue → reconcile.
//!
//! The controller subscribes to the shared watches of its plugin's parent, child and related
//! kinds, maps every change to the parents it concerns, and runs reconciles from its
//! [`queue::Queue`] with bounded concurrency. A new plugin version with the same kinds is
//! [`ControllerHandle::swap`]ped in without restarting anything: calls in flight finish on the
//! old version, and every parent is reconciled again with the new one.

pub mod queue;
pub mod reconcile;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use kube::Client;
use kube::api::DynamicObject;
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::Recorder;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use crate::config;
use crate::kinds::{self, Kinds};
use crate::sandbox::{Plugin, RelatedSelector};
use crate::telemetry::events::Events;
use crate::watch::{Cache, Change, Hub, ObjKey, Subscription, key_of};
use queue::{Backoff, Queue, Reason};

/// How a controller schedules its work. One value serves every plugin of a host.
#[derive(Debug, Clone)]
pub struct Config {
    /// Parents reconciled at the same time, per plugin.
    pub concurrency: usize,
    /// Delay that gathers a burst of child and related changes (a Deployment rolling out its
    /// pods) into one reconcile. Changes to the parent itself are not delayed.
    pub debounce: Duration,
    /// Reconcile every parent this often even when nothing changed (the plugin's ConfigMap can
    /// override it).
    pub resync: Duration,
    /// Retry delays after a failed reconcile.
    pub backoff: Backoff,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrency: config::CONCURRENCY,
            debounce: Duration::from_millis(config::DEBOUNCE_MS),
            resync: Duration::from_secs(config::RESYNC_SECONDS),
            backoff: Backoff::default(),
        }
    }
}

/// One version of a plugin with the configuration it runs with.
#[derive(Clone)]
pub struct Loaded {
    /// The compiled plugin.
    pub plugin: Plugin,
    /// Its settings.
    pub settings: Arc<Value>,
    /// Its resync period.
    pub resync: Duration,
}

impl Loaded {
    /// `name version (sha256:abcdef012345)` for logs, Events and conditions.
    pub fn describe(&self) -> String {
        let m = self.plugin.manifest();
        let digest = self.plugin.digest();
        let short = &digest[..digest.len().min(19)];
        format!("{} {} ({short})", m.name, m.version)
    }
}

enum Command {
    Swap(Loaded),
    Stop(oneshot::Sender<()>),
}

/// A running controller.
pub struct ControllerHandle {
    commands: mpsc::UnboundedSender<Command>,
    task: tokio::task::JoinHandle<()>,
    kinds: Kinds,
    synced: watch::Receiver<bool>,
}

impl ControllerHandle {
    /// The kinds this controller watches.
    pub fn kinds(&self) -> &Kinds {
        &self.kinds
    }

    /// True once every watch this controller needs has listed its objects.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Replaces the plugin version; every parent is reconciled again with the new one.
    pub fn swap(&self, loaded: Loaded) {
        let _ = self.commands.send(Command::Swap(loaded));
    }

    /// Stops taking work, waits for reconciles in flight, and drops the watches.
    pub async fn stop(self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Stop(tx)).is_ok() {
            let _ = rx.await;
        }
        let _ = self.task.await;
    }
}

/// What a reconcile needs that does not change between reconciles.
pub struct Shared {
    /// The API client.
    pub client: Client,
    /// The plugin's kinds, resolved.
    pub kinds: Kinds,
    /// `kinds.all_children()`, computed once.
    pub child_kinds: Vec<kinds::ResolvedKind>,
    /// Parents.
    pub parents: Arc<Cache>,
    /// Children, per entry of `kinds.all_children()`.
    pub children: Vec<Arc<Cache>>,
    /// Related objects, per entry of `kinds.related`.
    pub related: Vec<Arc<Cache>>,
    /// Records Events.
    pub events: Events,
    /// The related selectors each parent's last reconcile asked for, to map changes back.
    /// Ordered by key, so the parents of one namespace are one range.
    pub selectors: Mutex<BTreeMap<ObjKey, Related>>,
}

/// What `related(parent)` returned for one parent, and for which version of both.
pub struct Related {
    /// The plugin's digest.
    pub digest: String,
    /// [`fingerprint`] of the parent.
    pub fingerprint: u64,
    /// The selectors as the plugin returned them.
    pub selectors: Vec<RelatedSelector>,
    /// The same, parsed, with the index of their kind in `kinds.related`.
    pub parsed: Vec<(usize, Selector)>,
}

#[derive(Clone, Copy)]
enum Role {
    Parent,
    Child(usize),
    Related(usize),
}

/// Starts a controller for `loaded` over `kinds`.
pub fn spawn(
    client: Client,
    hub: &Hub,
    recorder: Recorder,
    kinds: Kinds,
    loaded: Loaded,
    config: Config,
) -> ControllerHandle {
    let mut subs = vec![(
        Role::Parent,
        hub.subscribe(&kinds.parent.resource, kinds.parent.namespaced, false),
    )];
    let child_kinds = kinds.all_children();
    for (i, k) in child_kinds.iter().enumerate() {
        subs.push((
            Role::Child(i),
            hub.subscribe(&k.resource, k.namespaced, false),
        ));
    }
    for (i, (k, metadata_only)) in kinds.related.iter().enumerate() {
        subs.push((
            Role::Related(i),
            hub.subscribe(&k.resource, k.namespaced, *metadata_only),
        ));
    }
    let cache_of = |role: fn(&Role) -> bool| -> Vec<Arc<Cache>> {
        subs.iter()
            .filter(|(r, _)| role(r))
            .map(|(_, s)| s.cache().clone())
            .collect()
    };
    let shared = Arc::new(Shared {
        client,
        parents: subs[0].1.cache().clone(),
        children: cache_of(|r| matches!(r, Role::Child(_))),
        related: cache_of(|r| matches!(r, Role::Related(_))),
        kinds: kinds.clone(),
        child_kinds,
        events: Events::folding(recorder),
        selectors: Mutex::default(),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let name = loaded.plugin.manifest().name.clone();
    let runner = Runner {
        shared,
        loaded,
        config,
        queue: Queue::default(),
        running: JoinSet::new(),
        in_flight: HashSet::new(),
        dirty: HashMap::new(),
        failures: HashMap::new(),
        deferred: HashSet::new(),
        fingerprints: HashMap::new(),
    };
    let (synced_tx, synced) = watch::channel(false);
    let span = tracing::info_span!("controller", plugin = %name);
    let task = tokio::spawn(runner.run(subs, rx, synced_tx).instrument(span));
    ControllerHandle {
        commands: tx,
        task,
        kinds,
        synced,
    }
}

struct Runner {
    shared: Arc<Shared>,
    loaded: Loaded,
    config: Config,
    queue: Queue,
    running: JoinSet<(ObjKey, Result<reconcile::Outcome, ()>)>,
    in_flight: HashSet<ObjKey>,
    dirty: HashMap<ObjKey, Reason>,
    failures: HashMap<ObjKey, u32>,
    // Parents whose last reconcile left the status to the next one; the next writes it.
    deferred: HashSet<ObjKey>,
    // What of each parent, besides its status, we last saw: a status-only update (our own
    // write, usually) does not trigger a reconcile.
    fingerprints: HashMap<ObjKey, u64>,
}

impl Runner {
    async fn run(
        mut self,
        mut subs: Vec<(Role, Subscription)>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        synced_tx: watch::Sender<bool>,
    ) {
        let streams: Vec<BoxStream<'static, (Role, Change)>> = subs
            .iter_mut()
            .map(|(role, sub)| {
                let role = *role;
                let mut rx = std::mem::replace(&mut sub.changes, mpsc::unbounded_channel().1);
                stream::poll_fn(move |cx| rx.poll_recv(cx))
                    .map(move |c| (role, c))
                    .boxed()
            })
            .collect();
        let mut changes = stream::select_all(streams);

        // Reconciling before every cache is filled would see children as missing.
        let synced = futures::future::join_all(subs.iter().map(|(_, s)| s.synced()));
        tokio::select! {
            _ = synced => {
                synced_tx.send_replace(true);
                tracing::info!(
                version = %self.loaded.plugin.manifest().version,
                parents = self.shared.parents.len(),
                "caches synced; reconciling"
            )},
            cmd = commands.recv() => {
                if let Some(Command::Stop(ack)) = cmd { let _ = ack.send(()); }
                return;
            }
        }

        let mut stop: Option<oneshot::Sender<()>> = None;
        let depth = crate::telemetry::metrics()
            .workqueue_depth
            .get_or_create(&crate::telemetry::metrics::PluginLabels {
                plugin: self.loaded.plugin.manifest().name.clone(),
            })
            // A clone shares the value and drops the registry's lock guard.
            .clone();
        loop {
            self.dispatch();
            depth.set(self.queue.len() as i64);
            let due = self.queue.next_due();
            tokio::select! {
                Some((role, change)) = changes.next() => self.on_change(role, change),
                cmd = commands.recv(), if stop.is_none() => match cmd {
                    Some(Command::Swap(loaded)) => self.on_swap(loaded),
                    Some(Command::Stop(ack)) => stop = Some(ack),
                    None => break,
                },
                Some(done) = self.running.join_next(), if !self.running.is_empty() => {
                    match done {
                        Ok((key, result)) => self.on_done(key, result),
                        Err(e) => tracing::error!(error = %e, "reconcile task panicked"),
                    }
                },
                // With every slot busy a due entry waits for `join_next`; arming the timer
                // then would wake this loop at once, again and again.
                _ = sleep_until(due), if due.is_some() && stop.is_none()
                    && self.running.len() < self.config.concurrency => {},
            }
            if stop.is_some() && self.running.is_empty() {
                break;
            }
        }
        depth.set(0);
        drop(subs);
        if let Some(ack) = stop {
            let _ = ack.send(());
        }
    }

    fn dispatch(&mut self) {
        let now = Instant::now();
        while self.running.len() < self.config.concurrency {
            let Some((key, reason)) = self.queue.pop_due(now) else {
                break;
            };
            if self.in_flight.contains(&key) {
                self.dirty.insert(key, reason);
                continue;
            }
            self.in_flight.insert(key.clone());
            let shared = self.shared.clone();
            let loaded = self.loaded.clone();
            let may_defer = !self.deferred.contains(&key);
            self.running.spawn(async move {
                let result = reconcile::run(&shared, &loaded, &key, &reason, may_defer).await;
                (key, result)
            });
        }
    }

    fn on_change(&mut self, role: Role, change: Change) {
        let now = Instant::now();
        let at = now + self.config.debounce;
        let obj = change.object();
        match role {
            Role::Parent => {
                let key = key_of(obj);
                match change {
                    Change::Applied(ref o) => {
                        let fp = fingerprint(o);
                        if self.fingerprints.insert(key.clone(), fp) == Some(fp) {
                            return;
                        }
                        self.queue.schedule(key, now, Reason::ParentChanged);
                    }
                    Change::Deleted(_) => {
                        self.queue.remove(&key);
                        self.fingerprints.remove(&key);
                        self.failures.remove(&key);
                        self.deferred.remove(&key);
                        self.shared
                            .selectors
                            .lock()
                            .expect("selectors lock")
                            .remove(&key);
                    }
                }
            }
            Role::Child(i) => {
                let parent = &self.shared.kinds.parent;
                let (group, _) = kinds::split_api_version(&parent.kind.api_version);
                let owner = obj.metadata.owner_references.iter().flatten().find(|o| {
                    o.controller == Some(true)
                        && o.kind == parent.kind.kind
                        && kinds::split_api_version(&o.api_version).0 == group
                });
                if let Some(owner) = owner {
                    let ns = parent
                        .namespaced
                        .then(|| obj.metadata.namespace.clone())
                        .flatten();
                    let what = describe(&self.shared.child_kinds[i].kind.kind, obj);
                    self.queue
                        .schedule((ns, owner.name.clone()), at, Reason::ChildChanged(what));
                }
            }
            Role::Related(i) => {
                let labels = obj.metadata.labels.clone().unwrap_or_default();
                let ns = obj.metadata.namespace.as_deref();
                let parent_namespaced = self.shared.kinds.parent.namespaced;
                let hits: Vec<ObjKey> = {
                    let selectors = self.shared.selectors.lock().expect("selectors lock");
                    let matches = |(key, r): (&ObjKey, &Related)| {
                        r.parsed
                            .iter()
                            .any(|(k, s)| *k == i && s.matches(&labels))
                            .then(|| key.clone())
                    };
                    if parent_namespaced {
                        let ns = ns.map(str::to_owned);
                        selectors
                            .range((ns.clone(), String::new())..)
                            .take_while(|((pns, _), _)| *pns == ns)
                            .filter_map(matches)
                            .collect()
                    } else {
                        selectors.iter().filter_map(matches).collect()
                    }
                };
                let what = describe(&self.shared.kinds.related[i].0.kind.kind, obj);
                for key in hits {
                    self.queue
                        .schedule(key, at, Reason::RelatedChanged(what.clone()));
                }
            }
        }
    }

    fn on_swap(&mut self, loaded: Loaded) {
        tracing::info!(from = %self.loaded.describe(), to = %loaded.describe(), "plugin swapped; reconciling every parent");
        self.loaded = loaded;
        let now = Instant::now();
        for parent in self.shared.parents.list(None, |_| true) {
            self.queue
                .schedule(key_of(&parent), now, Reason::PluginSwapped);
        }
    }

    fn on_done(&mut self, key: ObjKey, result: Result<reconcile::Outcome, ()>) {
        self.in_flight.remove(&key);
        let now = Instant::now();
        let deferred = matches!(&result, Ok(o) if o.status_deferred);
        if deferred {
            self.deferred.insert(key.clone());
            // The children's watch events normally ask first; this is in case none comes.
            self.queue
                .schedule(key.clone(), now + self.config.debounce, Reason::Settle);
        } else {
            self.deferred.remove(&key);
        }
        match result {
            Ok(outcome) if outcome.gone => {
                self.failures.remove(&key);
            }
            Ok(_) if deferred => {
                self.failures.remove(&key);
            }
            Ok(outcome) => {
                self.failures.remove(&key);
                match outcome.requeue_after {
                    Some(after) if after < self.loaded.resync => {
                        self.queue
                            .schedule(key.clone(), now + after, Reason::Requeue)
                    }
                    _ => self
                        .queue
                        .schedule(key.clone(), now + self.loaded.resync, Reason::Resync),
                }
            }
            Err(()) => {
                let n = self.failures.entry(key.clone()).or_default();
                *n += 1;
                let delay = self.config.backoff.delay(*n);
                self.queue
                    .schedule(key.clone(), now + delay, Reason::Retry(*n));
            }
        }
        if let Some(reason) = self.dirty.remove(&key) {
            let at = match reason {
                Reason::ParentChanged => now,
                _ => now + self.config.debounce,
            };
            self.queue.schedule(key, at, reason);
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn describe(kind: &str, obj: &DynamicObject) -> String {
    match &obj.metadata.namespace {
        Some(ns) => format!(
            "{kind} {ns}/{}",
            obj.metadata.name.as_deref().unwrap_or_default()
        ),
        None => format!(
            "{kind} {}",
            obj.metadata.name.as_deref().unwrap_or_default()
        ),
    }
}

/// Everything of a parent that a reconcile depends on, except its status.
pub(crate) fn fingerprint(obj: &DynamicObject) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let m = &obj.metadata;
    m.uid.hash(&mut h);
    m.generation.hash(&mut h);
    m.labels.hash(&mut h);
    m.annotations.hash(&mut h);
    m.finalizers.hash(&mut h);
    m.deletion_timestamp.is_some().hash(&mut h);
    // Kinds without a status subresource bump no generation on spec changes.
    if m.generation.is_none() {
        obj.data.to_string().hash(&mut h);
    }
    h.finish()
}
