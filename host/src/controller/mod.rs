//! One controller per loaded plugin: watch → triggers → schedule → reconcile.
//!
//! The controller subscribes to the shared watches of its plugin's parent, child and related
//! kinds; [`triggers`] maps every change to the parents it concerns, the [`schedule`] decides
//! when each runs, and the runner (`runner.rs`) starts [`reconcile::run`] for what is due as
//! the plugin's [`Slots`] allow. A new plugin version with the same kinds is
//! [`ControllerHandle::swap`]ped in without restarting anything: calls in flight finish on the
//! old version, and every parent is reconciled again with the new one.
//!
//! A candidate revision can run beside the live one ([`ControllerHandle::route`] and
//! [`ControllerHandle::preview`]; see `candidate.rs`): the controller posts what it shows on
//! rollout's [`Board`], where rollout reads it. [`finalizers`] puts the plugin's finalizer on
//! parents and takes it off. The [`Supervisor`] runs one controller per plugin (one per
//! shard held, under a [`ShardedSupervisor`]).

mod candidate;
pub mod error;
pub mod finalizers;
pub mod ledger;
pub mod queue;
pub mod reconcile;
pub mod related;
mod runner;
pub mod schedule;
pub mod shards;
pub mod slots;
pub mod supervisor;
pub mod triggers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Reporter;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tracing::Instrument;
use wasmop_contract::Manifest;

use crate::apply::budget::Budget;
use crate::client::Fence;
use crate::config;
use crate::kinds::{self, Kinds};
use crate::plugin::Loaded;
use crate::plugin::access::Resource;
use crate::plugin::reads::{HostNamespace, Reads, RequestKinds};
use crate::plugin::rollout::Post;
use crate::telemetry::events::Events;
use crate::watch::{Cache, Hub, Missing, ObjKey, Object};
use queue::Backoff;
use related::RelatedIndex;
use runner::Runner;
pub use shards::ShardedSupervisor;
pub use slots::Slots;
pub use supervisor::Supervisor;
use triggers::Role;

#[cfg(doc)]
use crate::plugin::rollout::Board;

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
    // Its place on the board, taken down when it stops however it stops: a post left by a
    // controller that is gone would be judged as the candidate's.
    post: Post,
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
    /// reconciled again at once. What it shows is posted on the [`Board`].
    pub fn route(&mut self, candidate: Option<(Loaded, u8)>) {
        let _ = self
            .commands
            .send(Command::Route(candidate.map(|(l, w)| (Box::new(l), w))));
    }

    /// Previews `candidate` for every parent (nothing is written), or, with `None`, stops.
    /// What it would change is posted on the [`Board`].
    pub fn preview(&mut self, candidate: Option<Loaded>) {
        let _ = self
            .commands
            .send(Command::Preview(candidate.map(Box::new)));
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
        let post = self.post.clone();
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
        post.clear();
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

impl Shared {
    /// The parents whose last reconcile asked for a selector of the related kind at `index`
    /// that `obj` matches.
    pub fn related_parents(&self, index: usize, obj: &Object) -> Vec<ObjKey> {
        let selectors = self.selectors.lock().expect("selectors lock");
        selectors.parents_of(index, obj)
    }

    /// Drops what the reconciles of `parent` left (it was deleted).
    pub fn forget(&self, parent: &ObjKey) {
        self.selectors
            .lock()
            .expect("selectors lock")
            .remove(parent);
        self.quiet.lock().expect("quiet lock").remove(parent);
    }
}

/// What a controller is started with besides its kinds and plugin, the same for every
/// controller of a supervisor but for `slots` and `post`.
pub struct Wiring {
    /// Names the host in Events on parents.
    pub reporter: Reporter,
    /// How it schedules its work.
    pub config: Config,
    /// Its reconciles start only while this is open.
    pub fence: Fence,
    /// The plugin's reconcile slots on this host.
    pub slots: Arc<Semaphore>,
    /// Where its candidate's progress goes.
    pub post: Post,
}

/// Starts a controller for `loaded` over `kinds`.
pub fn spawn(hub: &Hub, kinds: Kinds, loaded: Loaded, wiring: Wiring) -> ControllerHandle {
    let Wiring {
        reporter,
        config,
        fence,
        slots,
        post,
    } = wiring;
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
    let handle_post = post.clone();
    let runner = Runner {
        shared,
        loaded: loaded.clone(),
        schedule: schedule::Schedule::new(config),
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
        candidate: candidate::Candidate::default(),
        post,
        published: None,
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
        post: handle_post,
    }
}
