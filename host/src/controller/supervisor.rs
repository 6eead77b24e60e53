//! Runs one controller per plugin the registry hands over: starts it, swaps a new version in
//! when the kinds are the same, restarts it when they differ (still pruning children of the
//! kinds the new version dropped, as recorded in the [`Ledger`]), and stops it. It also keeps
//! the record of each plugin's finalizer, and releases the finalizers of plugins whose
//! ConfigMaps are gone ([`Supervise::sweep`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use kube::runtime::events::Reporter;
use wasmop_contract::KindRef;

use super::ledger::{self, Ledger};
use super::{Config, ControllerHandle, Slots, Wiring, finalizers, spawn};
use crate::client::Fence;
use crate::kinds::{Kinds, ResolvedKind, resolve_one};
use crate::plugin::rollout::Board;
use crate::plugin::{Activation, Canary, Loaded, Supervise};
use crate::plugin::{Identity, access};
use crate::watch::Hub;

/// Records of deleted plugins handled per sweep; the rest wait for the next.
const SWEEP_RECORDS: usize = 16;

/// A controller that ran this long since its last restart starts counting its deaths afresh.
const REVIVE_RESET: Duration = Duration::from_secs(300);

/// What the supervisors of a host are made of.
#[derive(Clone)]
pub struct Setup {
    /// The host's client.
    pub client: Client,
    /// The host's namespace: plugin identities live there.
    pub namespace: String,
    /// The shared watches.
    pub hub: Hub,
    /// Names the host in Events on parents (each plugin's identity writes them).
    pub reporter: Reporter,
    /// How controllers schedule their work.
    pub config: Config,
    /// Where controllers post what candidates show.
    pub board: Board,
}

/// The controllers of one host, by plugin ConfigMap.
pub struct Supervisor {
    client: Client,
    // The host's namespace: plugin identities live there.
    namespace: String,
    hub: Hub,
    ledger: Ledger,
    finalizers: Ledger,
    // Retired kinds are kept only if the host may watch them here.
    watch_namespace: Option<String>,
    // Names the host in Events on parents (each plugin's identity writes them).
    reporter: Reporter,
    config: Config,
    fence: Fence,
    slots: Slots,
    board: Board,
    // The shard its controllers post as (0 on a host that is not sharded).
    shard: u32,
    running: HashMap<String, ControllerHandle>,
    // Controllers restarted after dying: how often in a row, and when last.
    revived: HashMap<String, (u32, Instant)>,
}

impl Supervisor {
    /// Controllers over `setup`'s shared watches, writing through its client, whose
    /// reconciles start only while `fence` is open.
    pub fn new(setup: Setup, fence: Fence) -> Self {
        let Setup {
            client,
            namespace,
            hub,
            reporter,
            config,
            board,
        } = setup;
        Supervisor {
            ledger: Ledger::new(client.clone(), &namespace),
            finalizers: Ledger::finalizers(client.clone(), &namespace),
            namespace,
            watch_namespace: hub.namespace().map(str::to_string),
            hub,
            client,
            reporter,
            slots: Slots::new(config.concurrency),
            config,
            fence,
            board,
            shard: 0,
            running: HashMap::new(),
            revived: HashMap::new(),
        }
    }

    /// These controllers, posting as shard `index` on the board.
    pub fn on_shard(mut self, index: u32) -> Self {
        self.shard = index;
        self
    }

    /// These controllers, drawing on `slots` for how many parents each plugin reconciles at
    /// once, shared with other supervisors (those of the other shards a host holds).
    pub fn with_slots(mut self, slots: Slots) -> Self {
        self.slots = slots;
        self
    }

    /// Whether a controller runs for `configmap`.
    pub fn runs(&self, configmap: &str) -> bool {
        self.running.contains_key(configmap)
    }

    fn spawn(&self, configmap: &str, kinds: Kinds, loaded: Loaded) -> ControllerHandle {
        let wiring = Wiring {
            reporter: self.reporter.clone(),
            config: self.config.clone(),
            fence: self.fence.clone(),
            slots: self.slots.of(configmap),
            post: self.board.post(configmap, self.shard),
        };
        spawn(&self.hub, kinds, loaded, wiring)
    }

    /// Runs `loaded`, then records its finalizer (or that it has none).
    async fn activate(&mut self, configmap: &str, loaded: Loaded, kinds: Kinds) -> Activation {
        let manifest = loaded.plugin.manifest();
        let finalizer = manifest.finalizer.then(|| ledger::Finalizer {
            parent: kinds.parent.kind.clone(),
            name: manifest.finalizer_name(),
        });
        let activation = self.start_or_swap(configmap, loaded, kinds).await;
        self.finalizers
            .write_finalizer(configmap, finalizer.as_ref())
            .await;
        activation
    }

    async fn start_or_swap(
        &mut self,
        configmap: &str,
        loaded: Loaded,
        mut kinds: Kinds,
    ) -> Activation {
        let activation = match self.running.remove(configmap) {
            Some(mut handle) if handle.kinds().same_watches(&kinds) => {
                handle.swap(loaded);
                self.running.insert(configmap.to_string(), handle);
                return Activation::Swapped;
            }
            Some(handle) => {
                kinds.retire_from(handle.kinds());
                self.retire_recorded(configmap, &mut kinds).await;
                let same_parent = handle.kinds().parent.resource == kinds.parent.resource;
                let orphaned =
                    finalizers::orphaned(handle.manifest(), loaded.plugin.manifest(), same_parent);
                handle.stop(orphaned.is_some()).await;
                Activation::Restarted
            }
            None => {
                self.retire_recorded(configmap, &mut kinds).await;
                Activation::Started
            }
        };
        let handle = self.spawn(configmap, kinds, loaded);
        self.running.insert(configmap.to_string(), handle);
        activation
    }
}

impl Supervisor {
    /// Adds the child kinds on record for `configmap` that this version no longer declares to
    /// its retired kinds, then records what it has now. A recorded kind no longer served, or
    /// one the host may not watch (its controller would never sync), is dropped with a warning.
    async fn retire_recorded(&self, configmap: &str, kinds: &mut Kinds) {
        let Some(recorded) = self.ledger.read(configmap).await else {
            return;
        };
        for kind in &recorded {
            let known = |k: &&ResolvedKind| &k.kind == kind;
            if kinds.children.iter().any(|k| known(&k)) || kinds.retired.iter().any(|k| known(&k)) {
                continue;
            }
            let resolved = match resolve_one(&self.client, kind).await {
                Ok(Some(resolved)) => resolved,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(configmap, %kind, error = %e, "a retired child kind could not be resolved; its children stay");
                    continue;
                }
            };
            let ns = self.watch_namespace.as_deref();
            match (
                access::may(&self.client, &resolved, "list", ns).await,
                access::may(&self.client, &resolved, "watch", ns).await,
            ) {
                (Ok(true), Ok(true)) => kinds.retired.push(resolved),
                _ => {
                    tracing::warn!(configmap, %kind, "the host may no longer watch a retired child kind; its children stay")
                }
            }
        }
        // Declared kinds first, then retired ones, cut at what the record holds.
        let now: Vec<KindRef> = kinds
            .all_children()
            .into_iter()
            .map(|k| k.kind)
            .take(ledger::MAX_KINDS)
            .collect();
        if now != recorded {
            self.ledger.write(configmap, Some(&now)).await;
        }
    }
}

impl Supervisor {
    /// Releases the finalizer of every plugin on record whose ConfigMap is not in `present`,
    /// then forgets it; one that could not be released everywhere stays on record for the
    /// next sweep. Only while this host may write (it leads, or holds its shard).
    async fn sweep_finalizers(&mut self, present: &[String]) {
        if !self.fence.is_open() {
            return;
        }
        let Some(records) = self.finalizers.read_finalizers().await else {
            return;
        };
        // What runs here is present whatever `present` says (a sharded host's is from its
        // last sweep when it takes the shard that sweeps). Each record costs a list of its
        // parent kind: it is input, so bound what it can ask.
        let absent: Vec<_> = records
            .into_iter()
            .filter(|(cm, _)| !present.contains(cm) && !self.running.contains_key(cm))
            .take(SWEEP_RECORDS)
            .collect();
        for (configmap, record) in absent {
            let name = &record.name;
            // The plugin now runs from another ConfigMap: its finalizer is in use.
            let in_use = self.running.values().any(|h| {
                let m = h.manifest();
                m.finalizer && m.finalizer_name() == *name
            });
            if in_use {
                self.finalizers.write_finalizer(&configmap, None).await;
                continue;
            }
            let kind = match resolve_one(&self.client, &record.parent).await {
                Ok(Some(kind)) => kind,
                // No longer served: its parents went with it.
                Ok(None) => {
                    self.finalizers.write_finalizer(&configmap, None).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(configmap, finalizer = %name, error = %e, "the parent kind of a deleted plugin could not be resolved; its finalizer stays for now");
                    continue;
                }
            };
            let identity = match Identity::new(&self.client, &self.namespace, &configmap) {
                Ok(identity) => identity,
                Err(e) => {
                    tracing::warn!(configmap, error = %e, "a finalizer record names no possible plugin; forgotten");
                    self.finalizers.write_finalizer(&configmap, None).await;
                    continue;
                }
            };
            let ns = self.watch_namespace.as_deref();
            match finalizers::release_listed(&kind, &self.client, identity.client(), ns, name).await
            {
                Ok(released) => {
                    tracing::info!(configmap, finalizer = %name, released, "released the finalizer of a plugin whose ConfigMap is gone");
                    self.finalizers.write_finalizer(&configmap, None).await;
                }
                Err(e) => {
                    let error = crate::text::chain(&e);
                    tracing::warn!(configmap, finalizer = %name, account = %identity.username(), error, "could not release the finalizer of a plugin whose ConfigMap is gone; trying again later");
                }
            }
        }
    }
}

impl Supervise for Supervisor {
    fn sweep<'a>(&'a mut self, present: &'a [String]) -> BoxFuture<'a, ()> {
        async move { self.sweep_finalizers(present).await }.boxed()
    }

    fn run(&mut self, configmap: &str, loaded: Loaded, kinds: Kinds) -> BoxFuture<'_, Activation> {
        let configmap = configmap.to_string();
        async move { self.activate(&configmap, loaded, kinds).await }.boxed()
    }

    fn stop<'a>(&'a mut self, configmap: &'a str) -> BoxFuture<'a, ()> {
        async move {
            if let Some(handle) = self.running.remove(configmap) {
                handle.stop(false).await;
            }
        }
        .boxed()
    }

    fn retire<'a>(&'a mut self, configmap: &'a str) -> BoxFuture<'a, ()> {
        async move {
            if let Some(handle) = self.running.remove(configmap) {
                handle.stop(true).await;
            }
            self.ledger.write(configmap, None).await;
        }
        .boxed()
    }

    fn vanished(&self) -> Vec<(String, Vec<String>)> {
        self.running
            .iter()
            .map(|(cm, h)| (cm.clone(), h.missing_kinds()))
            .filter(|(_, kinds)| !kinds.is_empty())
            .collect()
    }

    fn revive(&mut self) -> Vec<(String, String)> {
        let mut revived = Vec::new();
        let names: Vec<String> = self.running.keys().cloned().collect();
        for configmap in names {
            let handle = self.running.get_mut(&configmap).expect("listed above");
            let Some(how) = handle.death() else {
                continue;
            };
            // One that dies again at once waits 1, 2, 4 … 64 s before the next restart.
            let (times, since) = match self.revived.get(&configmap) {
                Some((times, last)) if last.elapsed() < REVIVE_RESET => (*times, last.elapsed()),
                _ => (0, REVIVE_RESET),
            };
            if times > 0 && since < Duration::from_secs(1 << times.min(6)) {
                continue;
            }
            let handle = self.running.remove(&configmap).expect("listed above");
            // What the dead one posted is not the new one's.
            self.board.post(&configmap, self.shard).clear();
            let (kinds, loaded) = (handle.kinds().clone(), handle.loaded().clone());
            let fresh = self.spawn(&configmap, kinds, loaded);
            self.running.insert(configmap.clone(), fresh);
            self.revived
                .insert(configmap.clone(), (times + 1, Instant::now()));
            revived.push((configmap, how));
        }
        revived
    }

    fn route<'a>(&'a mut self, configmap: &'a str, canary: Option<Canary>) -> BoxFuture<'a, ()> {
        async move {
            let Some(handle) = self.running.get_mut(configmap) else {
                return;
            };
            let Some(canary) = canary else {
                handle.route(None);
                handle.preview(None);
                return;
            };
            if handle.kinds().covers(&canary.kinds) {
                set_route(handle, canary);
                return;
            }
            // The candidate needs kinds the live version does not watch: one controller over
            // both, the candidate's first, so that promoting it is a swap.
            let handle = self.running.remove(configmap).expect("found above");
            let mut kinds = canary.kinds.union(handle.kinds());
            self.retire_recorded(configmap, &mut kinds).await;
            let live = handle.loaded().clone();
            handle.stop(false).await;
            let mut fresh = self.spawn(configmap, kinds, live);
            set_route(&mut fresh, canary);
            self.running.insert(configmap.to_string(), fresh);
        }
        .boxed()
    }

    fn is_synced(&self, configmap: &str) -> bool {
        self.running
            .get(configmap)
            .is_none_or(ControllerHandle::is_synced)
    }
}

/// Runs `canary` as a preview or at its weight, and not the other way.
fn set_route(handle: &mut ControllerHandle, canary: Canary) {
    if canary.preview {
        handle.route(None);
        handle.preview(Some(canary.loaded));
    } else {
        handle.preview(None);
        handle.route(Some((canary.loaded, canary.weight)));
    }
}
