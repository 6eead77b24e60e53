//! One controller per loaded plugin: watch → queue → reconcile.
//!
//! The controller subscribes to the shared watches of its plugin's parent, child and related
//! kinds, maps every change to the parents it concerns, and runs reconciles from its
//! [`queue::Queue`] with bounded concurrency. A new plugin version with the same kinds is
//! [`ControllerHandle::swap`]ped in without restarting anything: calls in flight finish on the
//! old version, and every parent is reconciled again with the new one.
//!
//! A candidate revision can run beside the live one ([`ControllerHandle::route`]): it
//! reconciles the parents a canary's weight covers ([`crate::plugin::rollout::serves`]), the
//! live one the rest, and the controller tallies how the candidate's reconciles end.

pub mod error;
pub mod ledger;
pub mod queue;
pub mod reconcile;
pub mod related;
pub mod release;
pub mod shards;
pub mod slots;
pub mod supervisor;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use kube::Client;
use kube::runtime::events::Reporter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;
use wasmop_contract::Manifest;

use crate::apply::budget::Budget;
use crate::apply::preview::{Action, ParentPreview, describe as describe_preview};
use crate::client::Fence;
use crate::config;
use crate::kinds::{self, Kinds, ResolvedKind};
use crate::plugin::Loaded;
use crate::plugin::access::Resource;
use crate::plugin::reads::{HostNamespace, Reads, RequestKinds};
use crate::plugin::rollout::{PreviewReport, Report, Tally, serves};
use crate::telemetry::events::Events;
use crate::text::truncate;
use crate::watch::{Cache, Change, Hub, Missing, ObjKey, Object, Subscription};
use queue::{Backoff, Queue, Reason};
use related::RelatedIndex;
pub use shards::ShardedSupervisor;
pub use slots::Slots;
pub use supervisor::Supervisor;

/// How a controller schedules its work. One value serves every plugin of a host.
#[derive(Debug, Clone)]
pub struct Config {
    /// Parents reconciled at the same time, per plugin, over all its controllers on the host
    /// (see [`Slots`]).
    pub concurrency: usize,
    /// Delay that gathers a burst of child and related changes (a Deployment rolling out its
    /// pods) into one reconcile. Changes to the parent itself are not delayed.
    pub debounce: Duration,
    /// Reconcile every parent this often even when nothing changed (the plugin's ConfigMap can
    /// override it).
    pub resync: Duration,
    /// Retry delays after a failed reconcile.
    pub backoff: Backoff,
    /// Objects each plugin may create a minute (see [`Budget`]).
    pub creates_per_minute: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrency: config::CONCURRENCY,
            debounce: Duration::from_millis(config::DEBOUNCE_MS),
            resync: Duration::from_secs(config::RESYNC_SECONDS),
            backoff: Backoff::default(),
            creates_per_minute: config::CREATES_PER_MINUTE,
        }
    }
}

enum Command {
    Swap(Box<Loaded>),
    /// Run this candidate at this weight beside the live version, or none.
    Route(Option<(Box<Loaded>, u8)>),
    /// Preview this candidate for every parent beside the live version, or none.
    Preview(Option<Box<Loaded>>),
    /// Stop; with `release`, take the plugin's finalizer off every parent first.
    Stop {
        release: bool,
        ack: oneshot::Sender<()>,
    },
}

/// A running controller.
pub struct ControllerHandle {
    commands: mpsc::UnboundedSender<Command>,
    task: tokio::task::JoinHandle<()>,
    kinds: Kinds,
    loaded: Loaded,
    synced: watch::Receiver<bool>,
    // Per watched kind, `apiVersion Kind` and since when the API server has not served it.
    missing: Vec<(String, Missing)>,
    // How its task ended by itself, once [`ControllerHandle::death`] has seen it.
    died: Option<String>,
    // The parents, to count a canary's share.
    parents: Arc<Cache>,
    // The candidate's weight and what its reconciles showed, while one runs.
    tally: Arc<Mutex<Option<(u8, Tally)>>>,
    // What a previewed candidate would change, per parent, while one is previewed.
    previews: Arc<Mutex<Option<Previews>>>,
}

/// A previewed candidate's answers, per parent.
#[derive(Default)]
struct Previews {
    digest: String,
    parents: BTreeMap<ObjKey, ParentPreview>,
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

    /// The manifest of the version it runs.
    pub fn manifest(&self) -> &Manifest {
        self.loaded.plugin.manifest()
    }

    /// The version it runs.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The kinds it watches that the API server has not served for
    /// [`config::KIND_GONE_AFTER`] (a CRD deleted), as `apiVersion Kind`.
    pub fn missing_kinds(&self) -> Vec<String> {
        self.missing
            .iter()
            .filter(|(_, gone)| gone.for_at_least(config::KIND_GONE_AFTER))
            .map(|(kind, _)| kind.clone())
            .collect()
    }

    /// How its task ended, if it has ended without being stopped (a panic, normally).
    pub fn death(&mut self) -> Option<String> {
        use futures::FutureExt;
        if self.died.is_none() && self.task.is_finished() {
            // A JoinHandle may be polled to its end once only: keep what it said.
            self.died = Some(match (&mut self.task).now_or_never() {
                Some(Err(e)) if e.is_panic() => format!("it panicked: {e}"),
                Some(Err(e)) => format!("its task was cancelled: {e}"),
                _ => "its task ended".to_string(),
            });
        }
        self.died.clone()
    }

    /// Replaces the plugin version; every parent is reconciled again with the new one. A
    /// finalizer the new version no longer puts on parents is released from them.
    pub fn swap(&mut self, loaded: Loaded) {
        self.loaded = loaded.clone();
        let _ = self.commands.send(Command::Swap(Box::new(loaded)));
    }

    /// Runs `candidate` beside the live version for the parents `weight` percent covers, or,
    /// with `None`, the live version alone again. Every parent whose version changes is
    /// reconciled again at once.
    pub fn route(&mut self, candidate: Option<(Loaded, u8)>) {
        let _ = self
            .commands
            .send(Command::Route(candidate.map(|(l, w)| (Box::new(l), w))));
    }

    /// Previews `candidate` for every parent (nothing is written), or, with `None`, stops.
    pub fn preview(&mut self, candidate: Option<Loaded>) {
        let _ = self
            .commands
            .send(Command::Preview(candidate.map(Box::new)));
    }

    /// What the previewed candidate would change, while one is previewed.
    pub fn preview_report(&self) -> Option<PreviewReport> {
        let previews = self.previews.lock().expect("previews lock");
        let previews = previews.as_ref()?;
        let mut report = PreviewReport {
            parents: self.parents.len(),
            previewed: previews.parents.len(),
            ..PreviewReport::default()
        };
        for ((ns, name), p) in &previews.parents {
            if p.is_empty() {
                continue;
            }
            report.changed += 1;
            if p.error.is_some() {
                report.failed += 1;
            }
            if !p.status.is_empty() {
                report.status += 1;
            }
            for c in &p.children {
                match c.action {
                    Action::Created => report.created += 1,
                    Action::Changed(_) => report.modified += 1,
                    Action::Deleted => report.deleted += 1,
                    Action::Conflict(_) | Action::Refused(_) => report.refused += 1,
                }
            }
            let parent = format!(
                "{} {}",
                self.kinds.parent.kind.kind,
                ns.as_ref()
                    .map_or(name.clone(), |ns| format!("{ns}/{name}"))
            );
            report.diffs.push(describe_preview(
                &parent,
                &p.children,
                &p.status,
                p.error.as_deref(),
            ));
        }
        Some(report)
    }

    /// What the candidate has shown at its current weight, while one runs.
    pub fn canary_report(&self) -> Option<Report> {
        let tally = self.tally.lock().expect("tally lock");
        let (weight, tally) = tally.as_ref()?;
        let mut covered: Vec<ObjKey> = self
            .parents
            .list(None, |p| serves(*weight, p.namespace(), p.name()))
            .iter()
            .map(|p| p.key())
            .collect();
        // In name order, so the reasons an abort gives read the same from run to run.
        covered.sort();
        let name = |(ns, name): &ObjKey| match ns {
            Some(ns) => format!("{ns}/{name}"),
            None => name.clone(),
        };
        let failed: Vec<(String, String)> = covered
            .iter()
            .filter_map(|k| Some((name(k), tally.failed.get(k)?.clone())))
            .collect();
        let reconciled = covered
            .iter()
            .filter(|k| tally.reconciled.contains(*k))
            .count();
        Some(Report::new(*weight, covered.len(), reconciled, &failed))
    }

    /// Stops taking work, waits for reconciles in flight, and drops the watches. With
    /// `release`, the plugin's finalizer is first taken off every parent: nothing would
    /// remove it any more.
    ///
    /// Without `release`, a controller not done after [`config::CONTROLLER_STOP_GRACE`]
    /// (calls stuck on a dead connection) is aborted: its parents are reconciled again by
    /// whoever runs next. Releasing is never cut short: a finalizer left behind would hold its
    /// parent's deletion for good.
    pub async fn stop(self, release: bool) {
        let (ack, rx) = oneshot::channel();
        let mut task = self.task;
        let reaped = self.died.is_some();
        let stopping = async {
            if self.commands.send(Command::Stop { release, ack }).is_ok() {
                let _ = rx.await;
            }
            if !reaped {
                let _ = (&mut task).await;
            }
        };
        if release {
            stopping.await;
        } else if tokio::time::timeout(config::CONTROLLER_STOP_GRACE, stopping)
            .await
            .is_err()
        {
            tracing::warn!(
                plugin = %self.loaded.plugin.manifest().name,
                "the controller did not stop within {}s; aborted it",
                config::CONTROLLER_STOP_GRACE.as_secs()
            );
            task.abort();
        }
    }
}

/// What a reconcile needs that does not change between reconciles.
pub struct Shared {
    /// The plugin's identity: every write of this controller is made with it.
    pub writer: Client,
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
    pub selectors: Mutex<RelatedIndex>,
    /// Per parent, the last request that changed nothing, and the requeue it asked for: the
    /// same request again needs no sandbox call (see [`reconcile`]).
    pub quiet: Mutex<HashMap<ObjKey, reconcile::Quiet>>,
    /// What the plugin's identity may read: only that is handed to it.
    pub reads: Reads,
    /// The kinds of the plugin's requests as RBAC names them, for [`Reads::withhold`].
    pub request_kinds: RequestKinds,
    /// How many more objects this plugin may create now.
    pub creates: Mutex<Budget>,
}

#[derive(Clone, Copy)]
enum Role {
    Parent,
    Child(usize),
    Related(usize),
}

/// Starts a controller for `loaded` over `kinds`.
pub fn spawn(
    hub: &Hub,
    reporter: Reporter,
    kinds: Kinds,
    loaded: Loaded,
    config: Config,
    fence: Fence,
    slots: Arc<Semaphore>,
) -> ControllerHandle {
    let mut subs = vec![(
        Role::Parent,
        hub.subscribe(&kinds.parent.resource, kinds.parent.namespaced, false),
    )];
    let child_kinds = kinds.all_children();
    // A cluster-scoped parent's children and related objects may be in any namespace, so on
    // a sharded host the shard holding such parents (that of the empty namespace) watches
    // their kinds across every shard. A namespaced parent's are all in its namespace.
    let world = if !kinds.parent.namespaced && hub.holds("") {
        hub.whole()
    } else {
        hub
    };
    for (i, k) in child_kinds.iter().enumerate() {
        subs.push((
            Role::Child(i),
            world.subscribe(&k.resource, k.namespaced, false),
        ));
    }
    for (i, (k, metadata_only)) in kinds.related.iter().enumerate() {
        subs.push((
            Role::Related(i),
            world.subscribe(&k.resource, k.namespaced, *metadata_only),
        ));
    }
    let cache_of = |role: fn(&Role) -> bool| -> Vec<Arc<Cache>> {
        subs.iter()
            .filter(|(r, _)| role(r))
            .map(|(_, s)| s.cache().clone())
            .collect()
    };
    // The identity is the ConfigMap's, so it stays the same across swaps. Every write passes
    // this controller's fence: the leader's, or the shard's on a sharded host.
    let writer = fence.guard(loaded.identity.client());
    // Reviews are questions, not writes: they pass no fence.
    let host_namespace = loaded.identity.namespace();
    let reads = Reads::new(
        loaded.identity.client().clone(),
        HostNamespace {
            name: host_namespace.to_string(),
            served: hub.namespace() == Some(host_namespace),
        },
        &loaded.plugin.manifest().name,
        crate::config::READ_REVIEW_TTL,
    );
    let request_kinds = kinds
        .all_children()
        .iter()
        .chain(kinds.related.iter().map(|(k, _)| k))
        .map(|k| (k.kind.key(), Resource::from(k)))
        .collect();
    let shared = Arc::new(Shared {
        reads,
        request_kinds,
        creates: Mutex::new(Budget::new(config.creates_per_minute)),
        events: Events::folding(writer.clone(), reporter),
        writer,
        parents: subs[0].1.cache().clone(),
        children: cache_of(|r| matches!(r, Role::Child(_))),
        related: cache_of(|r| matches!(r, Role::Related(_))),
        kinds: kinds.clone(),
        child_kinds,
        selectors: Mutex::new(RelatedIndex::new(kinds.parent.namespaced)),
        quiet: Mutex::default(),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let name = loaded.plugin.manifest().name.clone();
    let tally = Arc::new(Mutex::new(None));
    let previews = Arc::new(Mutex::new(None));
    let parents = shared.parents.clone();
    let runner = Runner {
        canary: None,
        preview: None,
        previews: previews.clone(),
        tally: tally.clone(),
        shared,
        loaded: loaded.clone(),
        config,
        queue: Queue::default(),
        fence,
        slots,
        spare: None,
        in_flight: crate::telemetry::metrics()
            .reconciles_in_flight
            .get_or_create(&crate::telemetry::metrics::PluginLabels {
                plugin: name.clone(),
            })
            .clone(),
        running: JoinSet::new(),
        tasks: HashMap::new(),
        parents: HashMap::new(),
    };
    let (synced_tx, synced) = watch::channel(false);
    let missing = subs
        .iter()
        .map(|(_, sub)| {
            let r = sub.resource();
            (format!("{} {}", r.api_version, r.kind), sub.missing())
        })
        .collect();
    let span = tracing::info_span!("controller", plugin = %name);
    let task = tokio::spawn(runner.run(subs, rx, synced_tx).instrument(span));
    ControllerHandle {
        commands: tx,
        task,
        kinds,
        loaded,
        synced,
        missing,
        died: None,
        parents,
        tally,
        previews,
    }
}

struct Runner {
    shared: Arc<Shared>,
    loaded: Loaded,
    config: Config,
    queue: Queue,
    // Reconciles start only while it is open: see [`crate::client::Fence`].
    fence: Fence,
    // The plugin's reconcile slots on this host, shared with its other controllers (one per
    // shard held), and one taken while waiting, for the next dispatch.
    slots: Arc<Semaphore>,
    spare: Option<OwnedSemaphorePermit>,
    in_flight: Gauge,
    running: JoinSet<(ObjKey, Result<reconcile::Outcome, error::Error>)>,
    // Which parent each running task reconciles (for a task that panics), and whether with
    // the candidate (its digest).
    tasks: HashMap<tokio::task::Id, (ObjKey, Option<String>)>,
    // A candidate revision and the share of parents it serves.
    canary: Option<(Loaded, u8)>,
    // How the candidate's reconciles ended, shared with the handle.
    tally: Arc<Mutex<Option<(u8, Tally)>>>,
    // A candidate previewed after each reconcile, and what it would change.
    preview: Option<Loaded>,
    previews: Arc<Mutex<Option<Previews>>>,
    parents: HashMap<ObjKey, ParentState>,
}

/// One of the plugin's slots, taken by a reconcile for as long as it runs.
struct Running {
    _slot: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Running {
    fn start(slot: OwnedSemaphorePermit, gauge: Gauge) -> Self {
        gauge.inc();
        Running { _slot: slot, gauge }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// What a controller keeps about one parent between reconciles, in one place so that it is
/// dropped in one place.
#[derive(Debug, Default)]
struct ParentState {
    /// A reconcile of it is running.
    in_flight: bool,
    /// A change came while it ran: reconcile again right after, for this reason.
    dirty: Option<Reason>,
    /// Failed reconciles in a row.
    failures: u32,
    /// Its last reconcile left the status to the next one, which writes it.
    status_deferred: bool,
    /// What of it, besides its status, we last saw: a status-only update (our own write,
    /// usually) does not trigger a reconcile.
    fingerprint: Option<u64>,
}

/// What the queue should do after a reconcile.
#[derive(Debug, PartialEq, Eq)]
struct Next {
    /// Failed reconciles in a row, this one counted.
    failures: u32,
    /// The status was left to the next reconcile.
    status_deferred: bool,
    /// When (from now) to reconcile again, and why; `None` when the parent is gone.
    again: Option<(Duration, Reason)>,
}

/// Decides when a parent is reconciled next, given how its reconcile ended and how many
/// failed before it.
fn after_reconcile(
    result: &Result<reconcile::Outcome, error::Error>,
    failures: u32,
    config: &Config,
    resync: Duration,
) -> Next {
    match result {
        Ok(outcome) if outcome.gone => Next {
            failures: 0,
            status_deferred: false,
            again: None,
        },
        // The children's watch events normally ask first; this is in case none comes.
        Ok(outcome) if outcome.status_deferred => Next {
            failures: 0,
            status_deferred: true,
            again: Some((config.debounce, Reason::Settle)),
        },
        Ok(outcome) => Next {
            failures: 0,
            status_deferred: false,
            again: Some(match outcome.requeue_after {
                Some(after) if after < resync => (after, Reason::Requeue),
                _ => (resync, Reason::Resync),
            }),
        },
        Err(e) => {
            let n = failures + 1;
            // The same plugin on the same input fails the same way: wait for a change (of the
            // parent, a child, a related object or the plugin), or the resync.
            let delay = if e.error.is_guest_fault() {
                resync
            } else if e.error.is_transient() {
                // Failures piled up during an outage must not push the retry long past its end.
                config.backoff.delay(n).min(config::TRANSIENT_RETRY_MAX)
            } else {
                config.backoff.delay(n)
            };
            Next {
                failures: n,
                status_deferred: false,
                again: Some((delay, Reason::Retry(n))),
            }
        }
    }
}

/// The parent a child belongs to: the namespace and name of its controller owner of the
/// parent kind (same group and kind, any version).
fn child_owner(parent: &ResolvedKind, obj: &Object) -> Option<ObjKey> {
    let (group, _) = kinds::split_api_version(&parent.kind.api_version);
    let owner = obj.controller().filter(|o| {
        o.kind == parent.kind.kind && kinds::split_api_version(&o.api_version).0 == group
    })?;
    let ns = parent
        .namespaced
        .then(|| obj.namespace().map(str::to_owned))
        .flatten();
    Some((ns, owner.name.clone()))
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
        // A version swapped in meanwhile takes over once the caches are filled.
        let swapped = {
            let mut synced = std::pin::pin!(futures::future::join_all(
                subs.iter().map(|(_, s)| s.synced())
            ));
            let mut swapped: Option<Loaded> = None;
            loop {
                tokio::select! {
                    _ = &mut synced => break swapped,
                    cmd = commands.recv() => match cmd {
                        Some(Command::Swap(loaded)) => swapped = Some(*loaded),
                        Some(Command::Route(route)) => self.set_canary(route),
                        Some(Command::Preview(p)) => self.set_preview(p),
                        // Nothing reconciled yet, and no cache to release finalizers from.
                        Some(Command::Stop { ack, .. }) => { let _ = ack.send(()); return; }
                        None => return,
                    },
                }
            }
        };
        synced_tx.send_replace(true);
        tracing::info!(
            version = %self.loaded.plugin.manifest().version,
            parents = self.shared.parents.len(),
            "caches synced; reconciling"
        );
        if let Some(loaded) = swapped {
            self.on_swap(loaded);
        }

        let mut stop: Option<(bool, oneshot::Sender<()>)> = None;
        let depth = crate::telemetry::metrics()
            .workqueue_depth
            .get_or_create(&crate::telemetry::metrics::PluginLabels {
                plugin: self.loaded.plugin.manifest().name.clone(),
            })
            // A clone shares the value and drops the registry's lock guard.
            .clone();
        // Other controllers of the plugin (other shards) add to the same gauge: only this
        // one's change is applied.
        let mut queued = 0;
        loop {
            // Once asked to stop, only the reconciles in flight are waited for.
            if stop.is_none() {
                self.dispatch();
            }
            let len = self.queue.len() as i64;
            depth.inc_by(len - queued);
            queued = len;
            let due = self.queue.next_due();
            // A due parent waits for one of the plugin's slots, which another shard's
            // controller may hold: acquiring one wakes this loop when it is free.
            let slot = {
                let slots = self.slots.clone();
                async move {
                    sleep_until(due).await;
                    slots.acquire_owned().await
                }
            };
            tokio::select! {
                Some((role, change)) = changes.next() => self.on_change(role, change),
                cmd = commands.recv(), if stop.is_none() => match cmd {
                    Some(Command::Swap(loaded)) => self.on_swap(*loaded),
                    Some(Command::Route(route)) => self.on_route(route),
                    Some(Command::Preview(p)) => self.on_preview(p),
                    Some(Command::Stop { release, ack }) => stop = Some((release, ack)),
                    None => break,
                },
                Some(done) = self.running.join_next_with_id(), if !self.running.is_empty() => {
                    match done {
                        Ok((id, (key, result))) => {
                            let candidate = self.tasks.remove(&id).and_then(|(_, c)| c);
                            self.count_candidate(candidate.as_deref(), &key, &result);
                            self.on_done(key, result);
                        }
                        // The parent must not stay in flight for good: it is retried.
                        Err(e) => match self.tasks.remove(&e.id()) {
                            Some((key, candidate)) => {
                                tracing::error!(parent = %key.1, error = %e, "reconcile task panicked; retrying with backoff");
                                let error = error::ReconcileError::Panicked(e.to_string());
                                let failed = Err(error::Error { parent: key.clone(), error: Box::new(error) });
                                self.count_candidate(candidate.as_deref(), &key, &failed);
                                self.on_done(key, failed);
                            }
                            None => tracing::error!(error = %e, "reconcile task panicked"),
                        },
                    }
                },
                slot = slot, if due.is_some() && stop.is_none() && self.fence.is_open() => {
                    self.spare = slot.ok();
                },
            }
            if stop.is_some() && self.running.is_empty() {
                break;
            }
        }
        depth.dec_by(queued);
        if let Some((true, _)) = &stop {
            let manifest = self.loaded.plugin.manifest();
            if manifest.finalizer {
                release::release_all(&self.shared, &manifest.finalizer_name()).await;
            }
        }
        drop(subs);
        if let Some((_, ack)) = stop {
            let _ = ack.send(());
        }
    }

    fn dispatch(&mut self) {
        // Kept past this call, a slot would idle while other shards' parents wait for it.
        let mut spare = self.spare.take();
        // A leader whose Lease is lost or stale starts nothing (its writes would be refused).
        if !self.fence.is_open() {
            return;
        }
        let now = Instant::now();
        loop {
            let Some(slot) = spare
                .take()
                .or_else(|| self.slots.clone().try_acquire_owned().ok())
            else {
                break;
            };
            let Some((key, reason)) = self.queue.pop_due(now) else {
                break;
            };
            let state = self.parents.entry(key.clone()).or_default();
            if state.in_flight {
                state.dirty = Some(reason);
                spare = Some(slot);
                continue;
            }
            state.in_flight = true;
            let may_defer = !state.status_deferred;
            let shared = self.shared.clone();
            let candidate = self
                .canary
                .as_ref()
                .filter(|(_, weight)| serves(*weight, key.0.as_deref(), &key.1));
            let by_candidate = candidate.map(|(l, _)| l.plugin.digest().to_owned());
            let loaded = candidate.map_or(&self.loaded, |(l, _)| l).clone();
            let parent = key.clone();
            let preview = self.preview.clone().map(|p| (p, self.previews.clone()));
            let running = Running::start(slot, self.in_flight.clone());
            let task = self.running.spawn(async move {
                let _running = running;
                let result = reconcile::run(&shared, &loaded, &key, &reason, may_defer).await;
                // After the live version, so the preview sees what it left.
                if let Some((candidate, previews)) = preview {
                    let answer = reconcile::preview(&shared, &candidate, &key).await;
                    let mut previews = previews.lock().expect("previews lock");
                    if let Some(p) = previews
                        .as_mut()
                        .filter(|p| p.digest == candidate.plugin.digest())
                    {
                        match answer {
                            Some(a) => p.parents.insert(key.clone(), a),
                            None => p.parents.remove(&key),
                        };
                    }
                }
                (key, result)
            });
            self.tasks.insert(task.id(), (parent, by_candidate));
        }
    }

    fn on_change(&mut self, role: Role, change: Change) {
        let now = Instant::now();
        let at = now + self.config.debounce;
        let obj = change.object();
        match role {
            Role::Parent => {
                let key = obj.key();
                match change {
                    Change::Applied(ref o) => {
                        let fp = Some(fingerprint(o));
                        let state = self.parents.entry(key.clone()).or_default();
                        if std::mem::replace(&mut state.fingerprint, fp) == fp {
                            return;
                        }
                        self.queue.schedule(key, now, Reason::ParentChanged);
                    }
                    Change::Deleted(_) => {
                        self.queue.remove(&key);
                        // A reconcile in flight still reports back; the rest is forgotten.
                        if let Some(state) = self.parents.remove(&key)
                            && state.in_flight
                        {
                            self.parents.insert(
                                key.clone(),
                                ParentState {
                                    in_flight: true,
                                    dirty: state.dirty,
                                    ..ParentState::default()
                                },
                            );
                        }
                        self.shared
                            .selectors
                            .lock()
                            .expect("selectors lock")
                            .remove(&key);
                        self.shared.quiet.lock().expect("quiet lock").remove(&key);
                        if let Some(p) = self.previews.lock().expect("previews lock").as_mut() {
                            p.parents.remove(&key);
                        }
                    }
                }
            }
            Role::Child(i) => {
                if let Some(key) = child_owner(&self.shared.kinds.parent, obj) {
                    let what = describe(&self.shared.child_kinds[i].kind.kind, obj);
                    self.queue.schedule(key, at, Reason::ChildChanged(what));
                }
            }
            Role::Related(i) => {
                let hits = {
                    let selectors = self.shared.selectors.lock().expect("selectors lock");
                    selectors.parents_of(i, obj)
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
        let old = std::mem::replace(&mut self.loaded, loaded);
        if let Some(finalizer) =
            release::orphaned(old.plugin.manifest(), self.loaded.plugin.manifest(), true)
        {
            let shared = self.shared.clone();
            tokio::spawn(async move { release::release_all(&shared, &finalizer).await });
        }
        let now = Instant::now();
        for parent in self.shared.parents.list(None, |_| true) {
            self.queue
                .schedule(parent.key(), now, Reason::PluginSwapped);
        }
    }

    /// Sets the candidate without rescheduling anything (before the caches are synced).
    fn set_canary(&mut self, route: Option<(Box<Loaded>, u8)>) {
        let route = route.map(|(l, w)| (*l, w));
        let mut tally = self.tally.lock().expect("tally lock");
        *tally = match &route {
            None => None,
            Some((loaded, weight)) => {
                let digest = loaded.plugin.digest();
                let same = tally.take().filter(|(_, t)| t.digest == digest);
                Some((
                    *weight,
                    same.map(|(_, t)| t).unwrap_or_else(|| Tally {
                        digest: digest.to_owned(),
                        ..Tally::default()
                    }),
                ))
            }
        };
        drop(tally);
        self.canary = route;
    }

    /// Sets the previewed candidate without rescheduling anything.
    fn set_preview(&mut self, candidate: Option<Box<Loaded>>) {
        let candidate = candidate.map(|c| *c);
        let mut previews = self.previews.lock().expect("previews lock");
        *previews = match &candidate {
            None => None,
            Some(c) => {
                let digest = c.plugin.digest();
                Some(
                    previews
                        .take()
                        .filter(|p| p.digest == digest)
                        .unwrap_or_else(|| Previews {
                            digest: digest.to_owned(),
                            ..Previews::default()
                        }),
                )
            }
        };
        drop(previews);
        self.preview = candidate;
    }

    /// Previews a candidate (every parent is reconciled again at once, and previewed after),
    /// or stops.
    fn on_preview(&mut self, candidate: Option<Box<Loaded>>) {
        let fresh = match (&self.preview, &candidate) {
            (Some(old), Some(new)) => old.plugin.digest() != new.plugin.digest(),
            (None, Some(_)) => true,
            _ => false,
        };
        if let Some(c) = &candidate {
            tracing::info!(candidate = %c.describe(), "previewing a candidate for every parent");
        }
        self.set_preview(candidate);
        if fresh {
            let now = Instant::now();
            for parent in self.shared.parents.list(None, |_| true) {
                self.queue
                    .schedule(parent.key(), now, Reason::PluginSwapped);
            }
        }
    }

    /// Changes the candidate or its weight, and reconciles every parent whose version changes
    /// at once.
    fn on_route(&mut self, route: Option<(Box<Loaded>, u8)>) {
        let before = self
            .canary
            .as_ref()
            .map(|(l, w)| (l.plugin.digest().to_owned(), *w));
        let after = route
            .as_ref()
            .map(|(l, w)| (l.plugin.digest().to_owned(), *w));
        match &after {
            Some((_, w)) => {
                tracing::info!(weight = w, candidate = %route.as_ref().map(|(l, _)| l.describe()).unwrap_or_default(), "canary weight set")
            }
            None => tracing::info!("candidate dropped; the live version reconciles every parent"),
        }
        self.set_canary(route);
        let now = Instant::now();
        let same = matches!((&before, &after), (Some((a, _)), Some((b, _))) if a == b);
        for parent in self.shared.parents.list(None, |_| true) {
            let key = parent.key();
            let on = |route: &Option<(String, u8)>| {
                route
                    .as_ref()
                    .is_some_and(|(_, w)| serves(*w, key.0.as_deref(), &key.1))
            };
            let (was, is) = (on(&before), on(&after));
            if (same && was != is) || (!same && (was || is)) {
                self.queue.schedule(key, now, Reason::PluginSwapped);
            }
        }
    }

    /// Records in the tally how a reconcile by the candidate ended.
    fn count_candidate(
        &self,
        candidate: Option<&str>,
        key: &ObjKey,
        result: &Result<reconcile::Outcome, error::Error>,
    ) {
        let Some(digest) = candidate else {
            return;
        };
        let mut tally = self.tally.lock().expect("tally lock");
        // A reconcile by a candidate since replaced says nothing of the new one.
        let Some((_, tally)) = tally.as_mut().filter(|(_, t)| t.digest == digest) else {
            return;
        };
        tally.reconciled.insert(key.clone());
        match result {
            Ok(_) => {
                tally.failed.remove(key);
            }
            Err(e) => {
                tally.failed.insert(
                    key.clone(),
                    truncate(format!("{}: {}", e.error.reason(), e.error), 300),
                );
            }
        }
    }

    fn on_done(&mut self, key: ObjKey, result: Result<reconcile::Outcome, error::Error>) {
        let now = Instant::now();
        let state = self.parents.entry(key.clone()).or_default();
        state.in_flight = false;
        let next = after_reconcile(&result, state.failures, &self.config, self.loaded.resync);
        state.failures = next.failures;
        state.status_deferred = next.status_deferred;
        let dirty = state.dirty.take();
        if let Err(e) = &result
            && e.error.is_guest_fault()
        {
            tracing::info!(parent = %key.1, reason = e.error.reason(), "guest fault; not retried until its input or the plugin changes");
        }
        if let Some((after, reason)) = next.again {
            self.queue.schedule(key.clone(), now + after, reason);
        }
        if let Some(reason) = dirty {
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

fn describe(kind: &str, obj: &Object) -> String {
    match obj.namespace() {
        Some(ns) => format!("{kind} {ns}/{}", obj.name()),
        None => format!("{kind} {}", obj.name()),
    }
}

/// Everything of a parent that a reconcile depends on, except its status.
pub(crate) fn fingerprint(obj: &Object) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    obj.uid().hash(&mut h);
    obj.generation().hash(&mut h);
    obj.labels().hash(&mut h);
    obj.metadata().annotations.hash(&mut h);
    obj.finalizers().hash(&mut h);
    obj.is_deleting().hash(&mut h);
    // Kinds without a status subresource bump no generation on spec changes.
    if obj.generation().is_none() {
        let mut body = obj.value();
        if let Some(map) = body.as_object_mut() {
            map.remove("metadata");
        }
        body.to_string().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ApiResource;
    use kube::core::GroupVersionKind;
    use wasmop_contract::KindRef;

    use super::error::{Error, ReconcileError};
    use super::reconcile::Outcome;
    use super::*;

    fn memcached(namespaced: bool) -> ResolvedKind {
        let gvk = GroupVersionKind::gvk("cache.example.com", "v1alpha1", "Memcached");
        ResolvedKind {
            kind: KindRef::new("cache.example.com/v1alpha1", "Memcached"),
            resource: ApiResource::from_gvk_with_plural(&gvk, "memcacheds"),
            namespaced,
        }
    }

    fn pod(ns: Option<&str>, name: &str, meta: serde_json::Value) -> Object {
        let mut value = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta});
        value["metadata"]["name"] = name.into();
        if let Some(ns) = ns {
            value["metadata"]["namespace"] = ns.into();
        }
        Object::from_value(&value).unwrap()
    }

    fn object(ns: Option<&str>, name: &str) -> Object {
        pod(ns, name, serde_json::json!({}))
    }

    fn owned_by(obj: Object, api_version: &str, kind: &str, controller: bool) -> Object {
        let owner = OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "cache".into(),
            uid: "u1".into(),
            controller: Some(controller),
            ..Default::default()
        };
        pod(
            obj.namespace(),
            obj.name(),
            serde_json::json!({"ownerReferences": [owner]}),
        )
    }

    fn failed(error: ReconcileError) -> Result<Outcome, Error> {
        Err(Error {
            parent: (Some("ns".into()), "cache".into()),
            error: Box::new(error),
        })
    }

    #[test]
    fn a_child_maps_to_its_controller_owner_of_the_parent_kind() {
        let parent = memcached(true);
        let child = object(Some("ns"), "cache-abc");
        let key = (Some("ns".to_string()), "cache".to_string());
        let any_version = owned_by(child.clone(), "cache.example.com/v1", "Memcached", true);
        assert_eq!(child_owner(&parent, &any_version), Some(key));
        let not_controller = owned_by(
            child.clone(),
            "cache.example.com/v1alpha1",
            "Memcached",
            false,
        );
        assert_eq!(child_owner(&parent, &not_controller), None);
        let other_group = owned_by(
            child.clone(),
            "other.example.com/v1alpha1",
            "Memcached",
            true,
        );
        assert_eq!(child_owner(&parent, &other_group), None);
        assert_eq!(child_owner(&parent, &child), None, "no owner");
        // A cluster-scoped parent is keyed without a namespace.
        let cluster = owned_by(child, "cache.example.com/v1alpha1", "Memcached", true);
        assert_eq!(
            child_owner(&memcached(false), &cluster),
            Some((None, "cache".into()))
        );
    }

    #[test]
    fn after_a_reconcile_the_parent_is_due_again_at_the_right_time() {
        let config = Config::default();
        let resync = Duration::from_secs(600);
        let ok = |requeue_after, status_deferred, gone| -> Result<Outcome, Error> {
            Ok(Outcome {
                gone,
                requeue_after,
                status_deferred,
            })
        };
        // Success: the resync, or the plugin's requeue when sooner; failures forgotten.
        let next = after_reconcile(&ok(None, false, false), 3, &config, resync);
        assert_eq!(
            next,
            Next {
                failures: 0,
                status_deferred: false,
                again: Some((resync, Reason::Resync))
            }
        );
        let soon = Duration::from_secs(5);
        let next = after_reconcile(&ok(Some(soon), false, false), 0, &config, resync);
        assert_eq!(next.again, Some((soon, Reason::Requeue)));
        let later = Duration::from_secs(900);
        let next = after_reconcile(&ok(Some(later), false, false), 0, &config, resync);
        assert_eq!(next.again, Some((resync, Reason::Resync)));
        // Children changed: the status waits for their events, with a fallback.
        let next = after_reconcile(&ok(None, true, false), 0, &config, resync);
        assert_eq!(
            next,
            Next {
                failures: 0,
                status_deferred: true,
                again: Some((config.debounce, Reason::Settle))
            }
        );
        // Gone: nothing more.
        assert_eq!(
            after_reconcile(&ok(None, false, true), 2, &config, resync).again,
            None
        );
    }

    #[test]
    fn api_faults_back_off_and_guest_faults_wait_for_a_change() {
        let config = Config::default();
        let resync = Duration::from_secs(600);
        let api = failed(ReconcileError::Apply(Vec::new()));
        for (before, delay) in [(0, 250), (1, 500), (2, 1000)] {
            let next = after_reconcile(&api, before, &config, resync);
            assert_eq!(next.failures, before + 1);
            assert_eq!(
                next.again,
                Some((Duration::from_millis(delay), Reason::Retry(before + 1)))
            );
        }
        let unavailable = kube::Error::Api(Box::new(
            kube::core::Status::failure("etcd is unavailable", "InternalError").with_code(503),
        ));
        let outage = failed(ReconcileError::Status(unavailable));
        let next = after_reconcile(&outage, 9, &config, resync);
        assert_eq!(
            next.again,
            Some((config::TRANSIENT_RETRY_MAX, Reason::Retry(10))),
            "an outage's retries stay short: 250 ms doubled 9 times would be 128 s"
        );
        let guest = failed(ReconcileError::InvalidSelector(
            "a selector for v1 Secret".into(),
        ));
        let next = after_reconcile(&guest, 0, &config, resync);
        assert_eq!(
            next.again,
            Some((resync, Reason::Retry(1))),
            "not a short backoff"
        );
    }
}
