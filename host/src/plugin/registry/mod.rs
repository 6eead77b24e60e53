//! The registry of plugins: it follows the plugin ConfigMaps, loads each version in the
//! background ([`super::load`]), and hands every good one to a [`Supervise`] implementation
//! (the controller stage's supervisor) that runs it.
//!
//! Only a version that passes every check replaces the running one; a bad one leaves the last
//! good version running and says why in a Warning Event on its ConfigMap and in the log.
//! Plugin states are visible with `kubectl describe configmap <plugin>` (Events `Loaded` for a
//! first load, `Swapped` for any replacement, `LoadFailed`, `WaitingForKinds`, `Forbidden`).
//! Each state change is an Event of its own whose note names the version now running and the
//! one it replaced; none is folded into an earlier one.
//!
//! A plugin's name and its parent kind are each served by one plugin at a time: a second is
//! refused (`LoadFailed`), since two plugins on one parent would fight over its status.
//!
//! Every version that loads is recorded as a revision ([`super::revision`]); whether it goes
//! live at once, is previewed or rolls out as a canary is [`super::rollout::plan`]'s answer,
//! carried out by `staging.rs` (Events `Canary`, `Previewed`, `RolloutAborted`,
//! `RevisionFailed`).
//!
//! Deleting a ConfigMap stops its controller and leaves the children in place: they belong to
//! their parents, not to the plugin.
//!
//! The registry never holds a module inflated: it reads each ConfigMap with
//! [`source::read_stored`] (checked and digested as it streams) and keeps the stored form
//! only while a version runs or may be loaded again (one that waits for kinds or RBAC); a
//! version that failed for good keeps its digests and the reason, never its bytes, and the
//! same bytes are not loaded again. Loads inflate under the budget of [`super::load`].

mod shown;
mod staging;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Event, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::mpsc;
use wasmop_contract::{KindRef, Manifest};

use super::load::{LoadError, Loaded, Loader};
use super::notice::Notice;
use super::revision::{Phase, Revision, Revisions};
use super::rollout::{self, Board, Plan, Report, Rollout};
use super::source::{self, PLUGIN_LABEL, PluginSource};
use crate::config;
use crate::kinds::Kinds;
use crate::sandbox::Limits;
use crate::telemetry::events::Events;
use crate::telemetry::health::Health;
use crate::telemetry::metrics;
use crate::telemetry::metrics::{ConfigMapLabels, InfoLabels, LoadLabels};

/// How often at most a preview's summary and diff are written to its revision.
const PREVIEW_PUBLISH: std::time::Duration = std::time::Duration::from_secs(2);

/// What the registry knows about one plugin ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Being read or compiled.
    Loading,
    /// Loaded, but not servable yet (a CRD is missing, or RBAC); checked again on a timer.
    Waiting(String),
    /// Reconciling.
    Running,
    /// The last version failed to load; if an older version was good, it still runs.
    Failed(String),
}

/// One plugin as the registry sees it, for logs and probes.
#[derive(Debug, Clone)]
pub struct Status {
    /// The ConfigMap's name.
    pub configmap: String,
    /// The manifest name and version, and the digest of the version that runs, if any.
    pub running: Option<String>,
    /// State of the newest version.
    pub state: State,
}

/// How a version was put to work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// No version of this plugin ran: its controller started.
    Started,
    /// Swapped into the running controller (same kinds): nothing restarted.
    Swapped,
    /// Its kinds differ from the running version's: the controller restarted for it.
    Restarted,
}

/// Runs the plugins the registry loads: one controller each. Implemented by the controller
/// stage, so loading never reaches into reconciling: it answers for the lifecycle and health
/// of what runs, and what a candidate shows comes back on the [`Board`], never as a query.
pub trait Supervise: Send {
    /// Catches up with what changed beside the registry (a sharded host's shards taken or
    /// lost); called every second.
    fn rebalance(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    /// Runs `loaded` for `configmap`, replacing what runs for it, if anything.
    fn run(&mut self, configmap: &str, loaded: Loaded, kinds: Kinds) -> BoxFuture<'_, Activation>;
    /// Stops what runs for `configmap`, after its reconciles in flight (the host is shutting
    /// down or stepping back; another will carry on).
    fn stop<'a>(&'a mut self, configmap: &'a str) -> BoxFuture<'a, ()>;
    /// Stops what runs for `configmap` for good (its ConfigMap is gone): its finalizer is
    /// released from every parent first, since nothing would remove it any more.
    fn retire<'a>(&'a mut self, configmap: &'a str) -> BoxFuture<'a, ()>;
    /// Takes the finalizer of every plugin on record whose ConfigMap is not in `present` off
    /// its parents, then forgets it: the ConfigMap was deleted while no host ran that plugin
    /// (or a shard had no holder), so no [`Supervise::retire`] released it.
    fn sweep<'a>(&'a mut self, present: &'a [String]) -> BoxFuture<'a, ()>;
    /// The plugins some of whose kinds the API server stopped serving (a CRD deleted), with
    /// those kinds.
    fn vanished(&self) -> Vec<(String, Vec<String>)>;
    /// Restarts the controllers whose task died (a panic), backing off one that keeps dying;
    /// returns their ConfigMaps and how each ended.
    fn revive(&mut self) -> Vec<(String, String)>;
    /// Whether the caches of what runs for `configmap` are synced (`true` if nothing runs).
    fn is_synced(&self, configmap: &str) -> bool;
    /// Runs `canary` beside what runs for `configmap`, for the parents its weight covers, or,
    /// with `None`, what runs alone again: the parents whose version changes are reconciled
    /// again at once. Its controllers post what it shows on the [`Board`].
    fn route<'a>(&'a mut self, configmap: &'a str, canary: Option<Canary>) -> BoxFuture<'a, ()>;
    /// How many shards the parents are split into, on a sharded host.
    fn shards(&self) -> Option<u32> {
        None
    }
    /// Whether this host judges staged rollouts: always, but on a sharded host, where the
    /// replica holding the designated shard does and the others follow its revisions.
    fn judges(&self) -> bool {
        true
    }
}

/// A candidate revision to run beside the live one.
#[derive(Clone)]
pub struct Canary {
    /// The candidate.
    pub loaded: Loaded,
    /// Its kinds.
    pub kinds: Kinds,
    /// The share of parents it serves, in percent.
    pub weight: u8,
    /// It serves no parent, but is previewed for every one (nothing written).
    pub preview: bool,
}

struct Slot {
    // Its metadata only, for Events: the module and settings are in `latest`.
    configmap: ConfigMap,
    // The newest source seen: its stored form only, never the inflated module.
    latest: Option<PluginSource>,
    // `latest` failed to load for good and its module was dropped (`PluginSource::release`):
    // its digest stays, so the same bytes are not loaded again, but it cannot be.
    released: bool,
    // The registry's number for the newest source (or pause) of this slot: a load result, or
    // a retry timer, of an older one is dropped, even when only its settings differ. Numbers
    // are never reused, not even by a ConfigMap deleted and created again.
    seq: u64,
    // Loads of the newest source that failed and were tried again, for the backoff.
    retries: u32,
    // State of the newest version.
    state: State,
    // The version that runs, if any.
    running: Option<Loaded>,
    // Its controller was stopped because its kinds are no longer served.
    paused: bool,
    // A candidate rolling out beside the running version.
    candidate: Option<Candidate>,
    // The ConfigMap could not be read (say, two module keys): the state before, which a
    // repair back to the same source restores.
    unreadable: Option<State>,
}

/// A revision rolling out as a canary.
struct Candidate {
    loaded: Loaded,
    kinds: Kinds,
    revision: Revision,
    rollout: Rollout,
    // The step (0-based) and when it started.
    step: usize,
    started: Timestamp,
    // A preview, not a canary: what was last published of it, and when.
    preview: Option<Published>,
    // On a sharded host, what this replica last wrote of each shard it holds.
    shard_reports: BTreeMap<u32, Report>,
}

/// What of a preview was last written to its revision.
#[derive(Default)]
struct Published {
    summary: String,
    diff: Option<String>,
    at: Option<std::time::Instant>,
    // An Event said the preview covers every parent.
    complete: bool,
    // On a sharded host, what this replica last wrote of each shard it holds (the counts as
    // JSON, and the diff), and when.
    shards: BTreeMap<u32, (String, String)>,
    shards_at: Option<std::time::Instant>,
}

enum Msg {
    Loaded {
        configmap: String,
        seq: u64,
        result: Box<Result<(Loaded, Kinds), LoadError>>,
    },
    Retry {
        configmap: String,
        seq: u64,
    },
}

/// What a [`Registry`] is made of.
pub struct Parts {
    /// The host's client.
    pub client: Client,
    /// The namespace of the plugin ConfigMaps.
    pub namespace: String,
    /// Limits where a ConfigMap sets none.
    pub defaults: Limits,
    /// Loads each version.
    pub loader: Loader,
    /// Runs each good one.
    pub supervisor: Box<dyn Supervise>,
    /// Where the supervisor's controllers post what candidates show.
    pub board: Board,
    /// Names the host in Events.
    pub reporter: Reporter,
    /// Told that the registry's loop turns.
    pub health: Health,
}

/// Follows the plugin ConfigMaps of one namespace.
pub struct Registry {
    client: Client,
    namespace: String,
    defaults: Limits,
    loader: Arc<Loader>,
    supervisor: Box<dyn Supervise>,
    // What the supervisor's controllers post of candidates.
    board: Board,
    // Events on plugin ConfigMaps: one per state change, never folded.
    notices: Events,
    slots: HashMap<String, Slot>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    status: tokio::sync::watch::Sender<Vec<Status>>,
    ready: tokio::sync::watch::Sender<bool>,
    // The first list of plugin ConfigMaps has been seen.
    listed: bool,
    health: Health,
    // The last number given to a slot's source.
    last_seq: u64,
    revisions: Revisions,
    // Kinds an admin allows to be one plugin's child and another's parent.
    chains: Vec<KindRef>,
    // Each plugin's state as `kubectl get wasmopplugins` shows it, and the last Event on each
    // ConfigMap, which it includes.
    shower: shown::Shower,
    last_notice: std::sync::Mutex<HashMap<String, (Notice, String)>>,
}

impl Registry {
    /// A registry for the plugin ConfigMaps in `parts.namespace`, loading with its loader
    /// (its limits where a ConfigMap sets none) and running through its supervisor; its loop
    /// reports to its health that it turns.
    pub fn new(parts: Parts) -> Self {
        let Parts {
            client,
            namespace,
            defaults,
            loader,
            supervisor,
            board,
            reporter,
            health,
        } = parts;
        let (tx, rx) = mpsc::unbounded_channel();
        let (client_for_revisions, namespace_for_revisions) = (client.clone(), namespace.clone());
        Registry {
            notices: Events::distinct(client.clone(), reporter),
            client,
            namespace,
            defaults,
            loader: Arc::new(loader),
            supervisor,
            board,
            slots: HashMap::new(),
            tx,
            rx,
            status: tokio::sync::watch::channel(Vec::new()).0,
            ready: tokio::sync::watch::channel(false).0,
            listed: false,
            health,
            last_seq: 0,
            shower: shown::Shower::new(client_for_revisions.clone(), &namespace_for_revisions),
            revisions: Revisions::new(client_for_revisions, &namespace_for_revisions),
            chains: Vec::new(),
            last_notice: std::sync::Mutex::default(),
        }
    }

    /// Lets each of `kinds` be one plugin's child kind and another's parent kind (see
    /// [`clash`]); without it, such a pair is refused at load.
    #[must_use]
    pub fn with_chains(mut self, kinds: Vec<KindRef>) -> Self {
        self.chains = kinds;
        self
    }

    /// The state of every plugin, updated as it changes.
    pub fn status(&self) -> tokio::sync::watch::Receiver<Vec<Status>> {
        self.status.subscribe()
    }

    /// Whether every plugin has loaded (or failed for good) and every controller's caches
    /// are synced: what `/readyz` reports.
    pub fn ready(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Runs until `shutdown` resolves, then stops every controller gracefully.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default()
            .labels(PLUGIN_LABEL)
            .timeout(crate::config::WATCH_TIMEOUT_SECONDS);
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        let mut shutdown = std::pin::pin!(shutdown);
        let mut relisted: Option<Vec<String>> = None;
        let watch_name = format!("plugin ConfigMaps in {}", self.namespace);
        // Controllers sync on their own time: look again now and then.
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        let mut sweep = tokio::time::interval(crate::config::FINALIZER_SWEEP);
        tracing::info!(namespace = %self.namespace, "watching plugin ConfigMaps labelled {PLUGIN_LABEL}");
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => {
                    self.health.beat();
                    self.supervisor.rebalance().await;
                    for (configmap, how) in self.supervisor.revive() {
                        tracing::error!(configmap, "the plugin's controller stopped by itself ({how}); restarted it");
                    }
                    for (configmap, kinds) in self.supervisor.vanished() {
                        self.pause(&configmap, &kinds).await;
                    }
                    self.judge_canaries().await;
                    self.publish_previews().await;
                    // The judging replica speaks for every shard's rollout.
                    if self.supervisor.judges() {
                        let plugins = self.shown();
                        self.shower.show(plugins).await;
                    }
                },
                _ = sweep.tick(), if self.listed => self.sweep().await,
                Some(msg) = self.rx.recv() => self.on_msg(msg).await,
                ev = events.next() => {
                    if let Some(Ok(_)) = &ev {
                        self.health.watch_ok(&watch_name);
                    }
                    match ev {
                        Some(Err(e)) => {
                            let error = crate::text::chain(&e);
                            tracing::warn!(error, "plugin ConfigMap watch failed; retrying");
                            self.health.watch_failed(&watch_name, &error);
                        }
                        Some(Ok(watcher::Event::Init)) => relisted = Some(Vec::new()),
                        Some(Ok(watcher::Event::InitApply(cm))) => {
                            if let Some(seen) = relisted.as_mut() {
                                seen.push(cm.metadata.name.clone().unwrap_or_default());
                            }
                            self.on_apply(cm);
                        }
                        Some(Ok(watcher::Event::InitDone)) => {
                            let seen = relisted.take().unwrap_or_default();
                            let gone: Vec<String> = self.slots.keys().filter(|k| !seen.contains(k)).cloned().collect();
                            for name in gone {
                                self.on_delete(&name).await;
                            }
                            self.listed = true;
                            self.sweep().await;
                        }
                        Some(Ok(watcher::Event::Apply(cm))) => self.on_apply(cm),
                        Some(Ok(watcher::Event::Delete(cm))) => {
                            self.on_delete(cm.metadata.name.as_deref().unwrap_or_default()).await;
                            self.sweep().await;
                        }
                        None => break,
                    }
                },
            }
            self.publish_status();
        }
        tracing::info!("stopping plugin controllers");
        let names: Vec<String> = self.slots.keys().cloned().collect();
        for name in names {
            self.supervisor.stop(&name).await;
        }
    }

    fn on_apply(&mut self, mut cm: ConfigMap) {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let known = self.slots.get(&name).and_then(|s| s.latest.as_ref());
        let source = source::read_stored(&cm, &self.defaults, known);
        cm.binary_data = None;
        cm.data = None;
        let slot = self.slots.entry(name.clone()).or_insert_with(|| Slot {
            configmap: cm.clone(),
            latest: None,
            released: false,
            retries: 0,
            seq: 0,
            state: State::Loading,
            running: None,
            paused: false,
            candidate: None,
            unreadable: None,
        });
        slot.configmap = cm;
        let source = match source {
            Ok(s) => s,
            Err(e) => {
                let msg = match &slot.running {
                    Some(running) => format!(
                        "{}; still running {}",
                        e.in_configmap(&self.namespace, &name),
                        running.describe()
                    ),
                    None => e.in_configmap(&self.namespace, &name),
                };
                tracing::warn!(configmap = %name, error = %e, "invalid plugin ConfigMap; the running version, if any, stays");
                count_load(&name, "failure");
                if slot.unreadable.is_none() {
                    slot.unreadable = Some(slot.state.clone());
                }
                slot.state = State::Failed(msg.clone());
                let cm = slot.configmap.clone();
                self.event(&cm, Notice::LoadFailed, &msg);
                return;
            }
        };
        let before = slot.unreadable.take();
        if slot.latest.as_ref().is_some_and(|l| l.same_as(&source)) {
            // The ConfigMap was unreadable and is repaired, back to the source it held: nothing
            // to load, and it is as it was before.
            if let Some(before) = before {
                let now = match (&before, &slot.running) {
                    (State::Running, Some(running)) => format!("{} runs", running.describe()),
                    (State::Failed(why) | State::Waiting(why), _) => format!("as before: {why}"),
                    _ => "as before".to_string(),
                };
                let msg = format!("the ConfigMap is readable again; {now}");
                tracing::info!(configmap = %name, "{msg}");
                slot.state = before;
                let cm = slot.configmap.clone();
                self.event(&cm, Notice::Recovered, &msg);
            }
            return;
        }
        tracing::info!(configmap = %name, digest = %source.digest, stored_bytes = source.parts.module.len(), "loading plugin");
        slot.state = State::Loading;
        slot.latest = Some(source.clone());
        slot.released = false;
        self.last_seq += 1;
        slot.seq = self.last_seq;
        slot.retries = 0;
        let seq = slot.seq;
        self.start_load(name, source, seq);
    }

    fn start_load(&self, configmap: String, source: PluginSource, seq: u64) {
        let loader = self.loader.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = loader.load(source).await;
            let _ = tx.send(Msg::Loaded {
                configmap,
                seq,
                result: Box::new(result),
            });
        });
    }

    async fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Retry { configmap, seq } => {
                let Some(slot) = self.slots.get(&configmap).filter(|s| s.seq == seq) else {
                    return;
                };
                if slot.released {
                    // Failed for good: the same bytes would fail again, and are gone.
                    tracing::info!(
                        configmap,
                        "not loading again a version that failed for good; waiting for a new one"
                    );
                    return;
                }
                if let Some(source) = slot.latest.clone() {
                    // The load inflates the stored form again, under the budget.
                    self.start_load(configmap, source, seq);
                }
            }
            Msg::Loaded {
                configmap,
                seq,
                result,
            } => {
                let Some(slot) = self.slots.get(&configmap) else {
                    return;
                };
                if slot.seq != seq {
                    return; // superseded by a newer source, if only its settings
                }
                match *result {
                    Ok((loaded, kinds)) => self.activate(&configmap, loaded, kinds).await,
                    Err(e) => self.on_load_error(&configmap, e),
                }
            }
        }
    }

    fn on_load_error(&mut self, configmap: &str, error: LoadError) {
        let Some(slot) = self.slots.get_mut(configmap) else {
            return;
        };
        let cm = slot.configmap.clone();
        let attempts = slot.retries;
        match error.retry_after(attempts).zip(error.retry_note(attempts)) {
            Some((retry, note)) => {
                slot.retries = attempts.saturating_add(1);
                let msg = format!("{error}; {note}");
                // One Event per distinct wait, not one per retry.
                let first = slot.state != State::Waiting(msg.clone());
                slot.state = State::Waiting(msg.clone());
                let seq = slot.seq;
                if first {
                    tracing::warn!(configmap, "{msg}");
                    self.event(&cm, error.notice(), &msg);
                }
                let tx = self.tx.clone();
                let configmap = configmap.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(retry).await;
                    let _ = tx.send(Msg::Retry { configmap, seq });
                });
            }
            None => {
                let msg = match &slot.running {
                    Some(running) => format!("{error}; still running {}", running.describe()),
                    None => error.to_string(),
                };
                tracing::error!(configmap, error = %msg, "plugin failed to load");
                count_load(configmap, "failure");
                slot.state = State::Failed(msg.clone());
                release(slot);
                self.event(&cm, error.notice(), &msg);
            }
        }
    }

    /// Records the revision that loaded and decides, as its ConfigMap's rollout asks, whether
    /// it goes live, is previewed, rolls out as a canary, or waits (an aborted revision).
    async fn activate(&mut self, configmap: &str, loaded: Loaded, kinds: Kinds) {
        let others = self
            .slots
            .iter()
            .filter(|(cm, _)| cm.as_str() != configmap)
            .filter_map(|(cm, s)| Some((cm.as_str(), s.running.as_ref()?.plugin.manifest())));
        if let Some(msg) = clash(loaded.plugin.manifest(), others, &self.chains) {
            let slot = self.slots.get_mut(configmap).expect("slot exists");
            slot.state = State::Failed(msg.clone());
            release(slot);
            let cm = slot.configmap.clone();
            tracing::error!(configmap, "{msg}");
            self.event(&cm, Notice::LoadFailed, &msg);
            return;
        }
        let slot = self.slots.get(configmap).expect("slot exists");
        let Some(source) = slot.latest.clone() else {
            return;
        };
        let rollout = source.rollout.clone();
        let manifest = loaded.plugin.manifest();
        let recorded = self
            .revisions
            .record(
                configmap,
                (&source.parts.hash(), &source.parts.to_configmap(configmap)),
                &manifest.version,
                loaded.plugin.digest(),
            )
            .await;
        let (this, all) = match recorded {
            Ok(found) => found,
            Err(e) => return self.unrecorded(configmap, loaded, kinds, &rollout, e).await,
        };
        let live = all.iter().rev().find(|r| r.phase == Phase::Live).cloned();
        match rollout::plan(&this, live.as_ref(), &rollout) {
            Plan::Run => {
                self.go_live(configmap, loaded, kinds, this, &all, &rollout, None)
                    .await
            }
            Plan::Canary { step } => {
                let Some(live) = live else { return };
                if self.ensure_live(configmap, &live).await {
                    self.canary(configmap, loaded, kinds, this, rollout, step)
                        .await;
                }
            }
            Plan::Preview => {
                let Some(live) = live else { return };
                if self.ensure_live(configmap, &live).await {
                    self.preview(configmap, loaded, kinds, this, rollout).await;
                }
            }
            Plan::Hold(why) => {
                let Some(live) = live else { return };
                self.drop_candidate(configmap, &this).await;
                if self.ensure_live(configmap, &live).await {
                    self.fail(configmap, Notice::RolloutAborted, why);
                }
            }
            Plan::Abort(why) => {
                let Some(live) = live else { return };
                self.abort(configmap, Some(&this), why).await;
                self.ensure_live(configmap, &live).await;
            }
        }
    }

    /// Sets a failed state with `msg` and says so in an Event (once per distinct message).
    fn fail(&mut self, configmap: &str, notice: Notice, msg: String) {
        let Some(slot) = self.slots.get_mut(configmap) else {
            return;
        };
        if slot.state == State::Failed(msg.clone()) {
            return;
        }
        tracing::warn!(configmap, "{msg}");
        slot.state = State::Failed(msg.clone());
        self.notify(configmap, notice, &msg);
    }

    fn notify(&self, configmap: &str, notice: Notice, msg: &str) {
        if let Some(slot) = self.slots.get(configmap) {
            self.event(&slot.configmap, notice, msg);
        }
    }

    fn retry(&self, configmap: &str, seq: u64, after: std::time::Duration) {
        let tx = self.tx.clone();
        let configmap = configmap.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(Msg::Retry { configmap, seq });
        });
    }

    /// Runs `loaded` for every parent, replacing what ran, and says so.
    async fn run_live(&mut self, configmap: &str, loaded: Loaded, kinds: Kinds) {
        let activation = self.supervisor.run(configmap, loaded.clone(), kinds).await;
        let slot = self.slots.get_mut(configmap).expect("slot exists");
        let mut previous = slot.running.replace(loaded.clone());
        slot.state = State::Running;
        let resumed = std::mem::take(&mut slot.paused)
            && previous
                .as_ref()
                .is_some_and(|p| p.plugin.digest() == loaded.plugin.digest());
        if resumed {
            previous = None;
        }
        let cm = slot.configmap.clone();
        // Any replacement is `Swapped`, naming both versions; only a first load (or a paused
        // version resuming) is `Loaded`.
        let (notice, msg) = match (&previous, activation) {
            (None, _) if resumed => (
                Notice::Loaded,
                format!("resumed {}: its kinds are served again", loaded.describe()),
            ),
            (Some(old), Activation::Restarted) => (
                Notice::Swapped,
                format!(
                    "swapped in {}, replacing {}; its kinds changed, so its controller restarted",
                    loaded.describe(),
                    old.describe()
                ),
            ),
            (Some(old), _) => (
                Notice::Swapped,
                format!(
                    "swapped in {}, replacing {}",
                    loaded.describe(),
                    old.describe()
                ),
            ),
            (None, _) => (Notice::Loaded, format!("loaded {}", loaded.describe())),
        };
        count_load(configmap, "success");
        if let Some(old) = &previous {
            metrics()
                .plugin_swaps
                .get_or_create(&ConfigMapLabels {
                    configmap: configmap.to_string(),
                })
                .inc();
            set_info(configmap, Some(old), None);
        }
        set_info(configmap, None, Some(&loaded));
        tracing::info!(configmap, "{msg}");
        self.event(&cm, notice, &msg);
        if let Some(withheld) = &loaded.withheld {
            let msg = format!(
                "{} runs, but {withheld}; until then those writes fail and its parents say Forbidden",
                loaded.describe()
            );
            tracing::warn!(configmap, "{msg}");
            self.event(&cm, Notice::Forbidden, &msg);
        }
    }

    /// Stops the controller of a plugin whose kinds are no longer served, and loads it again
    /// every [`config::KIND_RETRY`] until they are: it then resumes by itself.
    async fn pause(&mut self, configmap: &str, kinds: &[String]) {
        self.supervisor.stop(configmap).await;
        let Some(slot) = self.slots.get_mut(configmap) else {
            return;
        };
        let msg = format!(
            "{} {} no longer served (a CRD deleted?); its controller stopped until {} again",
            kinds.join(", "),
            if kinds.len() == 1 { "is" } else { "are" },
            if kinds.len() == 1 {
                "it is"
            } else {
                "they are"
            },
        );
        tracing::warn!(configmap, "{msg}");
        slot.state = State::Waiting(msg.clone());
        slot.paused = true;
        // A load in flight would resume it a second time: only the retry below counts.
        self.last_seq += 1;
        slot.seq = self.last_seq;
        slot.retries = 0;
        let (cm, seq) = (slot.configmap.clone(), slot.seq);
        self.event(&cm, Notice::WaitingForKinds, &msg);
        let tx = self.tx.clone();
        let configmap = configmap.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(config::KIND_RETRY).await;
            let _ = tx.send(Msg::Retry { configmap, seq });
        });
    }

    async fn on_delete(&mut self, configmap: &str) {
        let Some(slot) = self.slots.remove(configmap) else {
            return;
        };
        if let Some(running) = slot.running {
            set_info(configmap, Some(&running), None);
            self.supervisor.retire(configmap).await;
            tracing::info!(configmap, plugin = %running.describe(), "plugin ConfigMap deleted; controller stopped, its finalizer released, children left in place");
        }
    }

    /// Releases the finalizers of plugins on record whose ConfigMaps are not listed.
    async fn sweep(&mut self) {
        let present: Vec<String> = self.slots.keys().cloned().collect();
        self.supervisor.sweep(&present).await;
    }

    fn publish_status(&self) {
        let mut all: Vec<Status> = self
            .slots
            .iter()
            .map(|(cm, s)| Status {
                configmap: cm.clone(),
                running: s.running.as_ref().map(Loaded::describe),
                state: s.state.clone(),
            })
            .collect();
        all.sort_by(|a, b| a.configmap.cmp(&b.configmap));
        let ready = self.listed
            && self
                .slots
                .iter()
                .all(|(cm, s)| s.state != State::Loading && self.supervisor.is_synced(cm));
        self.ready
            .send_if_modified(|old| std::mem::replace(old, ready) != ready);
        self.status.send_if_modified(|old| {
            let changed = old.len() != all.len()
                || old
                    .iter()
                    .zip(&all)
                    .any(|(a, b)| a.state != b.state || a.running != b.running);
            if changed {
                *old = all;
            }
            changed
        });
    }

    /// What `kubectl get wasmopplugins` shows of each plugin: (ConfigMap, its UID, state).
    fn shown(&self) -> Vec<(String, String, shown::Shown)> {
        let mut notices = self.last_notice.lock().expect("notices lock");
        notices.retain(|name, _| self.slots.contains_key(name));
        self.slots
            .iter()
            .map(|(name, slot)| {
                let running = slot.running.as_ref();
                let (state, why) = match &slot.state {
                    State::Loading => ("Loading", None),
                    State::Running => ("Running", None),
                    State::Waiting(why) => ("Waiting", Some(why.clone())),
                    State::Failed(why) => ("Failed", Some(why.clone())),
                };
                let rollout = match &slot.candidate {
                    None => "Live".to_string(),
                    Some(c) if c.preview.is_some() => {
                        format!("previewing revision {}", c.revision.number)
                    }
                    Some(c) => format!(
                        "revision {} at {}%",
                        c.revision.number, c.rollout.steps[c.step]
                    ),
                };
                let last = notices.get(name);
                let shown = shown::Shown {
                    state: state.to_string(),
                    version: running.map(|l| {
                        let m = l.plugin.manifest();
                        format!("{} {}", m.name, m.version)
                    }),
                    digest: running.map(|l| l.plugin.digest().to_string()),
                    revision: running.and_then(|l| l.revision),
                    rollout,
                    reason: last.map(|(n, _)| n.reason().to_string()),
                    message: why.or_else(|| last.map(|(_, m)| m.clone())),
                };
                let uid = slot.configmap.metadata.uid.clone().unwrap_or_default();
                (name.clone(), uid, shown)
            })
            .collect()
    }

    /// Queues an Event on the plugin ConfigMap `cm`, written off the registry's loop.
    fn event(&self, cm: &ConfigMap, notice: Notice, message: &str) {
        if let Some(name) = &cm.metadata.name {
            let mut notices = self.last_notice.lock().expect("notices lock");
            notices.insert(name.clone(), (notice, message.to_string()));
        }
        let reference: ObjectReference = cm.object_ref(&());
        let ev = Event {
            type_: notice.event_type(),
            reason: notice.reason().into(),
            note: Some(message.to_string()),
            action: "LoadPlugin".into(),
            secondary: None,
        };
        self.notices.record(ev, reference);
    }
}

/// Drops the module of the slot's newest version, which failed for good: only its digests
/// and the reason (the slot's state) stay.
fn release(slot: &mut Slot) {
    if let Some(latest) = slot.latest.as_mut() {
        latest.release();
        slot.released = true;
    }
}

/// Why `manifest` may not run beside the plugins that do (`(configmap, manifest)` each): a
/// name must be unique (it names the field manager and the finalizer), and so must a parent
/// kind: two plugins on one parent would fight over its status and `Ready` condition. Nor may
/// one plugin's child kind be another's parent kind, unless an admin listed it in `chains`:
/// each child would become a parent, whose children may feed the first plugin again.
fn clash<'a>(
    manifest: &Manifest,
    mut running: impl Iterator<Item = (&'a str, &'a Manifest)>,
    chains: &[KindRef],
) -> Option<String> {
    let chained = |k: &KindRef| chains.iter().any(|c| c.same_resource(k));
    let feeds = |from: &Manifest, to: &Manifest| {
        from.children
            .iter()
            .find(|c| c.same_resource(&to.parent) && !chained(c))
            .cloned()
    };
    running.find_map(|(configmap, other)| {
        if other.name == manifest.name {
            Some(format!(
                "plugin name {:?} is already served by ConfigMap {configmap}; names must be unique",
                manifest.name
            ))
        } else if other.parent.same_resource(&manifest.parent) {
            Some(format!(
                "parent kind {} is already reconciled by plugin {} (ConfigMap {configmap}); one plugin per parent kind",
                manifest.parent, other.name
            ))
        } else if let Some(kind) = feeds(manifest, other) {
            Some(format!(
                "child kind {kind} is the parent kind of plugin {} (ConfigMap {configmap}): each child would become its parent; an admin may allow it with `wasmop run --allow-chain {}`",
                other.name,
                chain_name(&kind)
            ))
        } else {
            feeds(other, manifest).map(|kind| {
                format!(
                    "parent kind {kind} is a child kind of plugin {} (ConfigMap {configmap}): each of its children would become a parent; an admin may allow it with `wasmop run --allow-chain {}`",
                    other.name,
                    chain_name(&kind)
                )
            })
        }
    })
}

/// `Kind.group`, or `Kind` for the core group: how `--allow-chain` names a kind.
fn chain_name(kind: &KindRef) -> String {
    match kind.group() {
        "" => kind.kind.clone(),
        group => format!("{}.{group}", kind.kind),
    }
}

/// The kind `--allow-chain` names: `Deployment.apps`, or `Pod` for the core group.
pub fn parse_chain(name: &str) -> KindRef {
    match name.split_once('.') {
        Some((kind, group)) => KindRef::new(format!("{group}/v1"), kind),
        None => KindRef::new("v1", name),
    }
}

fn count_load(configmap: &str, result: &'static str) {
    metrics()
        .plugin_loads
        .get_or_create(&LoadLabels {
            configmap: configmap.to_string(),
            result,
        })
        .inc();
}

/// Moves the `wasmop_plugin_info` series from the `old` version to the `new` one.
fn set_info(configmap: &str, old: Option<&Loaded>, new: Option<&Loaded>) {
    let labels = |l: &Loaded| InfoLabels {
        configmap: configmap.to_string(),
        plugin: l.plugin.manifest().name.clone(),
        version: l.plugin.manifest().version.clone(),
        digest: l.plugin.digest().to_string(),
    };
    if let Some(old) = old {
        metrics().plugin_info.remove(&labels(old));
    }
    if let Some(new) = new {
        metrics().plugin_info.get_or_create(&labels(new)).set(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_parent_kinds_are_one_plugin_each() {
        let memcached = Manifest::new("memcached", "0.1.0")
            .parent_raw("cache.example.com/v1alpha1", "Memcached");
        let rival = Manifest::new("rival", "0.1.0").parent_raw("cache.example.com/v1", "Memcached");
        let web = Manifest::new("web", "0.1.0").parent_raw("example.com/v1", "WebApp");
        let running = [("memcached", &memcached), ("web", &web)];
        assert_eq!(
            clash(&rival, running.into_iter(), &[]).as_deref(),
            Some(
                "parent kind cache.example.com/v1 Memcached is already reconciled by plugin memcached (ConfigMap memcached); one plugin per parent kind"
            )
        );
        let renamed = Manifest::new("web", "0.2.0").parent_raw("example.com/v1", "Other");
        assert_eq!(
            clash(&renamed, running.into_iter(), &[]).as_deref(),
            Some("plugin name \"web\" is already served by ConfigMap web; names must be unique")
        );
        let fine = Manifest::new("gateway", "0.1.0").parent_raw("net.example.com/v1", "Gateway");
        assert_eq!(clash(&fine, running.into_iter(), &[]), None);
    }

    #[test]
    fn a_child_kind_is_no_other_plugins_parent_kind_unless_an_admin_allows_it() {
        let memcached = Manifest::new("memcached", "0.1.0")
            .parent_raw("cache.example.com/v1alpha1", "Memcached")
            .child_raw("apps/v1", "Deployment");
        let on_deployments = Manifest::new("deploys", "0.1.0").parent_raw("apps/v1", "Deployment");
        let running = [("memcached", &memcached)];
        let refused = clash(&on_deployments, running.into_iter(), &[]).expect("refused");
        assert!(
            refused.contains("is a child kind of plugin memcached")
                && refused.contains("--allow-chain Deployment.apps"),
            "{refused}"
        );
        // The other way round, and allowed by the admin.
        let running = [("deploys", &on_deployments)];
        let refused = clash(&memcached, running.into_iter(), &[]).expect("refused");
        assert!(
            refused.contains("is the parent kind of plugin deploys"),
            "{refused}"
        );
        let allowed = [parse_chain("Deployment.apps")];
        assert_eq!(clash(&memcached, running.into_iter(), &allowed), None);
        // A core kind is named without a group.
        let core = Manifest::new("a", "0.1.0")
            .parent_raw("example.com/v1", "A")
            .child_raw("v1", "ConfigMap");
        let on_configmaps = Manifest::new("b", "0.1.0").parent_raw("v1", "ConfigMap");
        assert!(
            clash(
                &on_configmaps,
                [("a", &core)].into_iter(),
                &[parse_chain("ConfigMap")]
            )
            .is_none()
        );
        assert!(clash(&on_configmaps, [("a", &core)].into_iter(), &[]).is_some());
    }
}
