//! The runner: one task per controller that turns watch events into reconciles.
//!
//! [`Runner::run`] is a loop of named handlers: a change ([`Runner::on_change`], mapped to
//! parents by [`super::triggers`]), a command from the handle ([`Runner::on_command`]), a
//! reconcile that ended ([`Runner::on_joined`]), a slot freed, and, while a candidate runs, the
//! tick that publishes what it has shown ([`Runner::publish`]). When each parent runs is the
//! [`Schedule`]'s answer; the runner starts what is due as the plugin's slots allow.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use super::candidate::{self, Candidate};
use super::error::{self, Error};
use super::queue::Reason;
use super::reconcile::{self, Outcome};
use super::schedule::{Due, Schedule};
use super::triggers::{self, Role, Trigger};
use super::{Command, Shared, finalizers};
use crate::client::Fence;
use crate::plugin::Loaded;
use crate::plugin::rollout::Post;
use crate::watch::{Change, ObjKey, Subscription};

/// How often a candidate's progress is published while one runs.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// How a reconcile task ended: its parent, whether the canary ran it (its digest), and how.
type Ended = (ObjKey, Option<String>, Result<Outcome, Error>);

pub(super) struct Runner {
    pub shared: Arc<Shared>,
    pub loaded: Loaded,
    pub schedule: Schedule,
    // Reconciles start only while it is open: see [`crate::client::Fence`].
    pub fence: Fence,
    // The plugin's reconcile slots on this host, shared with its other controllers (one per
    // shard held), and one taken while waiting, for the next dispatch.
    pub slots: Arc<Semaphore>,
    pub spare: Option<OwnedSemaphorePermit>,
    pub in_flight: Gauge,
    pub running: JoinSet<Ended>,
    // Which parent each running task reconciles, for a task that panics.
    pub tasks: HashMap<tokio::task::Id, (ObjKey, Option<String>)>,
    pub candidate: Candidate,
    // Where the candidate's progress goes, for rollout to read, and what it was made from
    // last (the candidate's changes, the parents): a tick with neither moved posts nothing.
    pub post: Post,
    pub published: Option<(u64, usize)>,
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

impl Runner {
    pub(super) async fn run(
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
                        // Nothing to reschedule yet.
                        Some(Command::Route(route)) => { self.candidate.set_canary(route.map(|(l, w)| (*l, w))); }
                        Some(Command::Preview(p)) => { self.candidate.set_preview(p.map(|p| *p)); }
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
        let mut publish = tokio::time::interval(PUBLISH_EVERY);
        publish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Once asked to stop, only the reconciles in flight are waited for.
            if stop.is_none() {
                self.dispatch();
            }
            let len = self.schedule.len() as i64;
            depth.inc_by(len - queued);
            queued = len;
            let due = self.schedule.next_due();
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
                Some((role, change)) = changes.next() => self.on_change(role, &change),
                cmd = commands.recv(), if stop.is_none() => match cmd {
                    Some(Command::Stop { release, ack }) => stop = Some((release, ack)),
                    Some(cmd) => self.on_command(cmd),
                    None => break,
                },
                Some(joined) = self.running.join_next_with_id(), if !self.running.is_empty() => {
                    self.on_joined(joined);
                },
                slot = slot, if due.is_some() && stop.is_none() && self.fence.is_open() => {
                    self.spare = slot.ok();
                },
                _ = publish.tick(), if self.candidate.is_set() => self.publish_if_moved(),
            }
            if stop.is_some() && self.running.is_empty() {
                break;
            }
        }
        depth.dec_by(queued);
        self.post.clear();
        if let Some((true, _)) = &stop {
            let manifest = self.loaded.plugin.manifest();
            if manifest.finalizer {
                finalizers::release_all(&self.shared, &manifest.finalizer_name()).await;
            }
        }
        drop(subs);
        if let Some((_, ack)) = stop {
            let _ = ack.send(());
        }
    }

    /// Starts every due parent a slot is free for.
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
            let Some(due) = self.schedule.start_next(now) else {
                break;
            };
            let running = Running::start(slot, self.in_flight.clone());
            self.start(due, running);
        }
    }

    /// Reconciles `due.parent` with the version that serves it, then previews the candidate
    /// for it, if one is previewed.
    fn start(&mut self, due: Due, running: Running) {
        let Due {
            parent,
            reason,
            may_defer_status,
        } = due;
        let shared = self.shared.clone();
        let canary = self.candidate.serving(&parent);
        let by_canary = canary.map(|l| l.plugin.digest().to_owned());
        let loaded = canary.unwrap_or(&self.loaded).clone();
        let preview = self.candidate.previewed().cloned();
        let seen = self.candidate.seen();
        let key = parent.clone();
        let digest = by_canary.clone();
        let task = self.running.spawn(async move {
            let _running = running;
            let result = reconcile::run(&shared, &loaded, &key, &reason, may_defer_status).await;
            // After the live version, so the preview sees what it left.
            if let Some(candidate) = preview {
                let answer = reconcile::preview(&shared, &candidate, &key).await;
                let digest = candidate.plugin.digest();
                seen.lock()
                    .expect("candidate lock")
                    .previewed(digest, &key, answer);
            }
            (key, digest, result)
        });
        self.tasks.insert(task.id(), (parent, by_canary));
    }

    fn on_change(&mut self, role: Role, change: &Change) {
        let now = Instant::now();
        match triggers::triggered(&self.shared, role, change) {
            Trigger::Parent(parent, fingerprint) => {
                self.schedule.parent_seen(parent, fingerprint, now)
            }
            Trigger::ParentGone(parent) => self.forget(&parent),
            Trigger::Touched(parents, reason) => {
                for parent in parents {
                    self.schedule.touched(parent, now, reason.clone());
                }
            }
        }
    }

    /// Drops all that is kept of a deleted parent.
    fn forget(&mut self, parent: &ObjKey) {
        self.schedule.forget(parent);
        self.shared.forget(parent);
        self.candidate.forget(parent);
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Swap(loaded) => self.on_swap(*loaded),
            Command::Route(route) => self.on_route(route.map(|(l, w)| (*l, w))),
            Command::Preview(p) => self.on_preview(p.map(|p| *p)),
            Command::Stop { .. } => unreachable!("the loop takes it"),
        }
    }

    fn on_swap(&mut self, loaded: Loaded) {
        tracing::info!(from = %self.loaded.describe(), to = %loaded.describe(), "plugin swapped; reconciling every parent");
        let old = std::mem::replace(&mut self.loaded, loaded);
        if let Some(finalizer) =
            finalizers::orphaned(old.plugin.manifest(), self.loaded.plugin.manifest(), true)
        {
            let shared = self.shared.clone();
            tokio::spawn(async move { finalizers::release_all(&shared, &finalizer).await });
        }
        self.reconcile_all(|_| true);
    }

    /// Previews a candidate (every parent is reconciled again at once, and previewed after),
    /// or stops.
    fn on_preview(&mut self, candidate: Option<Loaded>) {
        if let Some(c) = &candidate {
            tracing::info!(candidate = %c.describe(), "previewing a candidate for every parent");
        }
        if self.candidate.set_preview(candidate) {
            self.reconcile_all(|_| true);
        }
        self.publish();
    }

    /// Changes the candidate or its weight, and reconciles every parent whose version changes
    /// at once.
    fn on_route(&mut self, route: Option<(Loaded, u8)>) {
        match &route {
            Some((l, w)) => {
                tracing::info!(weight = w, candidate = %l.describe(), "canary weight set")
            }
            None => tracing::info!("candidate dropped; the live version reconciles every parent"),
        }
        let before = self.candidate.set_canary(route);
        let after = self.candidate.route();
        self.reconcile_all(|parent| candidate::moved(&before, &after, parent));
        self.publish();
    }

    /// Reconciles at once every parent `which` picks.
    fn reconcile_all(&mut self, which: impl Fn(&ObjKey) -> bool) {
        let now = Instant::now();
        for parent in self.shared.parents.list(None, |_| true) {
            let key = parent.key();
            if which(&key) {
                self.schedule.schedule(key, now, Reason::PluginSwapped);
            }
        }
    }

    fn on_joined(&mut self, joined: Result<(tokio::task::Id, Ended), JoinError>) {
        let (parent, by_canary, result) = match joined {
            Ok((id, ended)) => {
                self.tasks.remove(&id);
                ended
            }
            // The parent must not stay in flight for good: it is retried.
            Err(e) => {
                let Some((parent, by_canary)) = self.tasks.remove(&e.id()) else {
                    tracing::error!(error = %e, "reconcile task panicked");
                    return;
                };
                tracing::error!(%parent, error = %e, "reconcile task panicked; retrying with backoff");
                let error = error::ReconcileError::Panicked(e.to_string());
                let failed = Err(Error {
                    parent: parent.clone(),
                    error: Box::new(error),
                });
                (parent, by_canary, failed)
            }
        };
        if let Some(digest) = &by_canary {
            let seen = self.candidate.seen();
            seen.lock()
                .expect("candidate lock")
                .count(digest, &parent, &result);
        }
        if let Err(e) = &result
            && e.error.is_guest_fault()
        {
            tracing::info!(%parent, reason = e.error.reason(), "guest fault; not retried until its input or the plugin changes");
        }
        let now = Instant::now();
        self.schedule
            .ended(parent, &result, self.loaded.resync, now);
    }

    /// Posts what the candidate has shown, for rollout.
    fn publish(&mut self) {
        self.published = Some((self.candidate.changes(), self.shared.parents.len()));
        let kind = &self.shared.kinds.parent.kind.kind;
        let progress = self.candidate.progress(&self.shared.parents, kind);
        self.post.publish(progress);
    }

    /// Posts again if the candidate recorded something or the parents changed since the last
    /// post: a preview renders every parent's diff, which is not done for nothing.
    fn publish_if_moved(&mut self) {
        let now = (self.candidate.changes(), self.shared.parents.len());
        if self.published != Some(now) {
            self.publish();
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
