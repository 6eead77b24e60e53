//! Runs one controller per plugin the registry hands over: starts it, swaps a new version in
//! when the kinds are the same, restarts it when they differ (still pruning children of the
//! kinds the new version dropped), and stops it.

use std::collections::HashMap;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use kube::runtime::events::Reporter;

use super::{Config, ControllerHandle, release, spawn};
use crate::kinds::Kinds;
use crate::plugin::{Activation, Loaded, Supervise};
use crate::watch::Hub;

/// The controllers of one host, by plugin ConfigMap.
pub struct Supervisor {
    hub: Hub,
    // Names the host in Events on parents (each plugin's identity writes them).
    reporter: Reporter,
    config: Config,
    running: HashMap<String, ControllerHandle>,
}

impl Supervisor {
    /// Controllers over shared watches (in `watch_namespace` only, when set).
    pub fn new(
        client: Client,
        watch_namespace: Option<String>,
        reporter: Reporter,
        config: Config,
    ) -> Self {
        Supervisor {
            hub: Hub::new(client, watch_namespace),
            reporter,
            config,
            running: HashMap::new(),
        }
    }

    fn spawn(&self, kinds: Kinds, loaded: Loaded) -> ControllerHandle {
        spawn(
            &self.hub,
            self.reporter.clone(),
            kinds,
            loaded,
            self.config.clone(),
        )
    }

    async fn activate(&mut self, configmap: &str, loaded: Loaded, mut kinds: Kinds) -> Activation {
        let activation = match self.running.remove(configmap) {
            Some(mut handle) if handle.kinds().same_watches(&kinds) => {
                handle.swap(loaded);
                self.running.insert(configmap.to_string(), handle);
                return Activation::Swapped;
            }
            Some(handle) => {
                kinds.retire_from(handle.kinds());
                let same_parent = handle.kinds().parent.resource == kinds.parent.resource;
                let orphaned =
                    release::orphaned(handle.manifest(), loaded.plugin.manifest(), same_parent);
                handle.stop(orphaned.is_some()).await;
                Activation::Restarted
            }
            None => Activation::Started,
        };
        let handle = self.spawn(kinds, loaded);
        self.running.insert(configmap.to_string(), handle);
        activation
    }
}

impl Supervise for Supervisor {
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
        }
        .boxed()
    }

    fn is_synced(&self, configmap: &str) -> bool {
        self.running
            .get(configmap)
            .is_none_or(ControllerHandle::is_synced)
    }
}
