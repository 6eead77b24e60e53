//! One [`Supervisor`] per shard this replica holds, each over a hub of that shard's objects
//! and writing through that shard's fence.
//!
//! The registry sees one [`Supervise`]: what it asks is done on every shard held, and
//! remembered, so that a shard taken later starts every plugin (and canary route) at once.
//! A shard lost is stopped after its reconciles in flight, which its fence, already shut,
//! keeps from writing.
//!
//! A plugin whose parents are cluster-scoped runs on the shard of cluster-scoped objects
//! only ([`runs_on`]): it has no parents elsewhere, and there it watches its children across
//! every shard. Its other shards report an empty share to a canary or preview.

use std::collections::{BTreeMap, HashMap};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::watch;

use super::Slots;
use super::Supervisor;
use super::supervisor::Setup;
use crate::client::Fence;
use crate::kinds::Kinds;
use crate::plugin::rollout::{PreviewReport, Progress, Report};
use crate::plugin::{Activation, Canary, Loaded, Supervise};
use crate::shard::Shard;
use crate::shard::keeper::Held;

/// The controllers of a sharded host.
pub struct ShardedSupervisor {
    setup: Setup,
    // One budget per plugin over every shard held: see [`Slots`].
    slots: Slots,
    // Shards the parents are split into.
    count: u32,
    held: watch::Receiver<Held>,
    active: BTreeMap<Shard, (Fence, Supervisor)>,
    // What the registry runs, to start on shards taken later.
    plugins: BTreeMap<String, (Loaded, Kinds)>,
    routes: HashMap<String, Canary>,
    // The plugin ConfigMaps of the last sweep: taking the designated shard sweeps again.
    present: Option<Vec<String>>,
}

impl ShardedSupervisor {
    /// Controllers for the shards in `held` (of `count`) as it changes, each over `setup`'s
    /// hub narrowed to its shard.
    pub fn new(setup: Setup, count: u32, held: watch::Receiver<Held>) -> Self {
        ShardedSupervisor {
            count,
            slots: Slots::new(setup.config.concurrency),
            setup,
            held,
            active: BTreeMap::new(),
            plugins: BTreeMap::new(),
            routes: HashMap::new(),
            present: None,
        }
    }

    /// What runs for `configmap` no longer starts on shards taken later.
    fn forget(&mut self, configmap: &str) {
        self.plugins.remove(configmap);
        self.routes.remove(configmap);
        self.post_idle(configmap);
    }

    /// Posts, for each shard held where `configmap` runs no controller (see [`runs_on`]), an
    /// empty share of its candidate, so that rollout hears from every shard; or takes the
    /// post down where no candidate runs.
    fn post_idle(&self, configmap: &str) {
        let kinds = self.plugins.get(configmap).map(|(_, kinds)| kinds);
        let idle = self.routes.get(configmap).map(|c| Progress {
            digest: c.loaded.plugin.digest().to_owned(),
            canary: (!c.preview).then(|| Report {
                weight: c.weight,
                ..Report::default()
            }),
            preview: c.preview.then(PreviewReport::default),
        });
        for shard in self.active.keys() {
            if kinds.is_none_or(|k| !runs_on(shard, k)) {
                let post = self.setup.board.post(configmap, shard.index());
                post.publish(idle.clone().filter(|_| kinds.is_some()));
            }
        }
    }

    fn each(&mut self) -> impl Iterator<Item = &mut Supervisor> {
        self.active.values_mut().map(|(_, s)| s)
    }

    /// The supervisor of the shard of cluster-scoped objects, if this replica holds it: the
    /// one that sweeps.
    fn designated(&mut self) -> Option<&mut Supervisor> {
        self.active
            .iter_mut()
            .find(|(shard, _)| shard.holds(""))
            .map(|(_, (_, s))| s)
    }
}

impl Supervise for ShardedSupervisor {
    fn rebalance(&mut self) -> BoxFuture<'_, ()> {
        async move {
            let want = self.held.borrow_and_update().clone();
            let lost: Vec<Shard> = self
                .active
                .iter()
                .filter(|(s, (f, _))| !want.get(s).is_some_and(|w| w.same(f)))
                .map(|(s, _)| *s)
                .collect();
            for shard in lost {
                let (_, mut supervisor) = self.active.remove(&shard).expect("listed above");
                for configmap in self.plugins.keys() {
                    supervisor.stop(configmap).await;
                    self.setup.board.post(configmap, shard.index()).clear();
                }
                tracing::info!(shard = %shard, "stopped reconciling the shard");
            }
            for (shard, fence) in want {
                if self.active.contains_key(&shard) {
                    continue;
                }
                let setup = Setup {
                    client: fence.guard(&self.setup.client),
                    hub: self.setup.hub.clone().sharded(shard),
                    ..self.setup.clone()
                };
                let mut supervisor = Supervisor::new(setup, fence.clone())
                    .with_slots(self.slots.clone())
                    .on_shard(shard.index());
                for (configmap, (loaded, kinds)) in &self.plugins {
                    if !runs_on(&shard, kinds) {
                        continue;
                    }
                    supervisor
                        .run(configmap, loaded.clone(), kinds.clone())
                        .await;
                    if let Some(canary) = self.routes.get(configmap) {
                        supervisor.route(configmap, Some(canary.clone())).await;
                    }
                }
                tracing::info!(shard = %shard, plugins = self.plugins.len(), "reconciling the shard");
                // Taken from a replica that died: a plugin deleted meanwhile is swept now.
                if let (true, Some(present)) = (shard.holds(""), &self.present) {
                    supervisor.sweep(present).await;
                }
                self.active.insert(shard, (fence, supervisor));
            }
            let names: Vec<String> = self.plugins.keys().cloned().collect();
            for configmap in names {
                self.post_idle(&configmap);
            }
        }
        .boxed()
    }

    fn sweep<'a>(&'a mut self, present: &'a [String]) -> BoxFuture<'a, ()> {
        // One replica sweeps, whatever namespaces the parents are in: the holder of the
        // shard of cluster-scoped objects. The finalizers it releases belong to plugins no
        // replica runs any more, so no other replica writes them.
        async move {
            self.present = Some(present.to_vec());
            if let Some(supervisor) = self.designated() {
                supervisor.sweep(present).await;
            }
        }
        .boxed()
    }

    fn run(&mut self, configmap: &str, loaded: Loaded, kinds: Kinds) -> BoxFuture<'_, Activation> {
        let configmap = configmap.to_string();
        async move {
            let activation = match self.plugins.get(&configmap) {
                None => Activation::Started,
                Some((_, was)) if was.same_watches(&kinds) => Activation::Swapped,
                Some(_) => Activation::Restarted,
            };
            self.plugins
                .insert(configmap.clone(), (loaded.clone(), kinds.clone()));
            for (shard, (_, supervisor)) in &mut self.active {
                if runs_on(shard, &kinds) {
                    supervisor
                        .run(&configmap, loaded.clone(), kinds.clone())
                        .await;
                } else if supervisor.runs(&configmap) {
                    // The version before had parents here (its parent kind was namespaced):
                    // a restart stops it as a change of parent kind must, releasing their
                    // finalizer, and the new one, with none here, stops too.
                    supervisor
                        .run(&configmap, loaded.clone(), kinds.clone())
                        .await;
                    supervisor.stop(&configmap).await;
                }
            }
            self.post_idle(&configmap);
            activation
        }
        .boxed()
    }

    fn stop<'a>(&'a mut self, configmap: &'a str) -> BoxFuture<'a, ()> {
        async move {
            self.forget(configmap);
            for supervisor in self.each() {
                supervisor.stop(configmap).await;
            }
        }
        .boxed()
    }

    fn retire<'a>(&'a mut self, configmap: &'a str) -> BoxFuture<'a, ()> {
        async move {
            self.forget(configmap);
            for supervisor in self.each() {
                supervisor.retire(configmap).await;
            }
        }
        .boxed()
    }

    fn vanished(&self) -> Vec<(String, Vec<String>)> {
        let mut all: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (_, supervisor) in self.active.values() {
            for (configmap, kinds) in supervisor.vanished() {
                let entry = all.entry(configmap).or_default();
                entry.extend(kinds);
                entry.sort();
                entry.dedup();
            }
        }
        all.into_iter().collect()
    }

    fn revive(&mut self) -> Vec<(String, String)> {
        self.each().flat_map(|s| s.revive()).collect()
    }

    fn is_synced(&self, configmap: &str) -> bool {
        self.active.values().all(|(_, s)| s.is_synced(configmap))
    }

    fn route<'a>(&'a mut self, configmap: &'a str, canary: Option<Canary>) -> BoxFuture<'a, ()> {
        async move {
            match &canary {
                Some(c) => self.routes.insert(configmap.to_string(), c.clone()),
                None => self.routes.remove(configmap),
            };
            for supervisor in self.each() {
                supervisor.route(configmap, canary.clone()).await;
            }
            self.post_idle(configmap);
        }
        .boxed()
    }

    fn shards(&self) -> Option<u32> {
        Some(self.count)
    }

    fn judges(&self) -> bool {
        self.active.keys().any(|shard| shard.holds(""))
    }
}

/// Whether a plugin over `kinds` has a controller on `shard`: everywhere, unless its parents
/// are cluster-scoped. Those all sit on the shard of the empty namespace, whose controller
/// watches their children and related objects across every shard ([`Hub::whole`]); on the
/// others it would hold watches of their kinds and never use them.
fn runs_on(shard: &Shard, kinds: &Kinds) -> bool {
    kinds.parent.namespaced || shard.holds("")
}
