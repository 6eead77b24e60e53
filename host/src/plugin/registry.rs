//! The registry of loaded plugins: it follows the plugin ConfigMaps and keeps one controller
//! per good plugin.
//!
//! Every ConfigMap change is loaded in the background: read, compile (cached by digest), probe
//! the manifest, resolve its kinds, check the host may do what the plugin needs on them. Only
//! a plugin that passes all of it replaces the running version, atomically; a bad one leaves
//! the last good version running and says why in a Warning Event on its ConfigMap and in the
//! log. Plugin states are visible with `kubectl describe configmap <plugin>` (Events `Loaded`
//! for a first load, `Swapped` for any replacement, `LoadFailed`, `WaitingForKinds`,
//! `Forbidden`). Each state change is an Event of its own whose note names the version now
//! running and the one it replaced; none is folded into an earlier one.
//!
//! Deleting a ConfigMap stops its controller and leaves the children in place: they belong to
//! their parents, not to the plugin.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::mpsc;

use super::source::{self, PLUGIN_LABEL, PluginSource};
use crate::config;
use crate::controller::{self, ControllerHandle, Loaded};
use crate::kinds::{self, ResolveError};
use crate::sandbox::{Limits, Sandbox};
use crate::telemetry::events::Events;
use crate::telemetry::metrics;
use crate::telemetry::metrics::{ConfigMapLabels, InfoLabels, LoadLabels};
use crate::watch::Hub;

/// What the registry knows about one plugin ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Being read or compiled.
    Loading,
    /// Loaded, but some of its kinds are not served yet (a CRD is missing).
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

/// Shared by the registry's tasks.
struct Env {
    client: Client,
    namespace: String,
    hub: Hub,
    // Permissions are checked in this namespace only when the host watches only it.
    watch_namespace: Option<String>,
    sandbox: Sandbox,
    defaults: Limits,
    config: controller::Config,
    // Events on parents, folded into series by kube-runtime.
    recorder: Recorder,
    // Events on plugin ConfigMaps: one per state change, never folded.
    notices: Events,
}

struct Slot {
    // The newest source seen; load results for older ones are dropped.
    latest: Option<PluginSource>,
    running: Option<(Loaded, PluginSource, ControllerHandle)>,
    state: State,
    configmap: ConfigMap,
}

enum Msg {
    Loaded {
        configmap: String,
        digest: String,
        result: Box<Result<(Loaded, kinds::Kinds), LoadError>>,
    },
    Retry(String),
}

#[derive(Debug)]
enum LoadError {
    Bad(String),
    // Not loadable yet; checked again after `retry` (a CRD to install, RBAC to grant).
    Waiting {
        reason: &'static str,
        message: String,
        retry: Duration,
    },
}

/// Follows the plugin ConfigMaps of one namespace.
pub struct Registry {
    env: Arc<Env>,
    slots: HashMap<String, Slot>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    status: tokio::sync::watch::Sender<Vec<Status>>,
    ready: tokio::sync::watch::Sender<bool>,
    // The first list of plugin ConfigMaps has been seen.
    listed: bool,
}

impl Registry {
    /// A registry for the plugin ConfigMaps in `namespace`.
    pub fn new(
        client: Client,
        namespace: String,
        watch_namespace: Option<String>,
        sandbox: Sandbox,
        defaults: Limits,
        config: controller::Config,
        reporter: Reporter,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Registry {
            env: Arc::new(Env {
                hub: Hub::new(client.clone(), watch_namespace.clone()),
                recorder: Recorder::new(client.clone(), reporter.clone()),
                notices: Events::distinct(client.clone(), reporter),
                watch_namespace,
                client,
                namespace,
                sandbox,
                defaults,
                config,
            }),
            slots: HashMap::new(),
            tx,
            rx,
            status: tokio::sync::watch::channel(Vec::new()).0,
            ready: tokio::sync::watch::channel(false).0,
            listed: false,
        }
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
        let api: Api<ConfigMap> = Api::namespaced(self.env.client.clone(), &self.env.namespace);
        let config = watcher::Config::default().labels(PLUGIN_LABEL);
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        let mut shutdown = std::pin::pin!(shutdown);
        let mut relisted: Option<Vec<String>> = None;
        // Controllers sync on their own time: look again now and then.
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tracing::info!(namespace = %self.env.namespace, "watching plugin ConfigMaps labelled {PLUGIN_LABEL}");
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => {},
                Some(msg) = self.rx.recv() => self.on_msg(msg).await,
                ev = events.next() => match ev {
                    Some(Ok(watcher::Event::Init)) => relisted = Some(Vec::new()),
                    Some(Ok(watcher::Event::InitApply(cm))) => {
                        if let Some(seen) = relisted.as_mut() {
                            seen.push(cm.metadata.name.clone().unwrap_or_default());
                        }
                        self.on_apply(cm).await;
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        let seen = relisted.take().unwrap_or_default();
                        let gone: Vec<String> = self.slots.keys().filter(|k| !seen.contains(k)).cloned().collect();
                        for name in gone {
                            self.on_delete(&name).await;
                        }
                        self.listed = true;
                    }
                    Some(Ok(watcher::Event::Apply(cm))) => self.on_apply(cm).await,
                    Some(Ok(watcher::Event::Delete(cm))) => {
                        self.on_delete(cm.metadata.name.as_deref().unwrap_or_default()).await
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "plugin ConfigMap watch failed; retrying"),
                    None => break,
                },
            }
            self.publish_status();
        }
        tracing::info!("stopping plugin controllers");
        for (_, slot) in self.slots.drain() {
            if let Some((_, _, handle)) = slot.running {
                handle.stop().await;
            }
        }
    }

    async fn on_apply(&mut self, cm: ConfigMap) {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let source = source::read(&cm, &self.env.defaults);
        let slot = self.slots.entry(name.clone()).or_insert_with(|| Slot {
            latest: None,
            running: None,
            state: State::Loading,
            configmap: cm.clone(),
        });
        slot.configmap = cm;
        let source = match source {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("ConfigMap {}/{name}: {e}", self.env.namespace);
                tracing::warn!(configmap = %name, error = %e, "invalid plugin ConfigMap; the running version, if any, stays");
                count_load(&name, "failure");
                slot.state = State::Failed(msg.clone());
                let cm = slot.configmap.clone();
                self.event(&cm, EventType::Warning, "LoadFailed", &msg);
                return;
            }
        };
        let unchanged = |s: &Option<PluginSource>| s.as_ref().is_some_and(|l| l.same_as(&source));
        if unchanged(&slot.latest) {
            return;
        }
        tracing::info!(configmap = %name, digest = %source.digest, bytes = source.wasm.len(), "loading plugin");
        slot.state = State::Loading;
        slot.latest = Some(source.clone());
        self.start_load(name, source);
    }

    fn start_load(&self, configmap: String, source: PluginSource) {
        let env = self.env.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let digest = source.digest.clone();
            let result = load(&env, source).await;
            let _ = tx.send(Msg::Loaded {
                configmap,
                digest,
                result: Box::new(result),
            });
        });
    }

    async fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Retry(name) => {
                if let Some(source) = self.slots.get(&name).and_then(|s| s.latest.clone()) {
                    self.start_load(name, source);
                }
            }
            Msg::Loaded {
                configmap,
                digest,
                result,
            } => {
                let Some(slot) = self.slots.get(&configmap) else {
                    return;
                };
                if slot.latest.as_ref().map(|s| &s.digest) != Some(&digest) {
                    return; // superseded by a newer version
                }
                match *result {
                    Ok((loaded, kinds)) => self.activate(&configmap, loaded, kinds).await,
                    Err(LoadError::Waiting {
                        reason,
                        message,
                        retry,
                    }) => {
                        let cm = slot.configmap.clone();
                        let msg = format!("{message}; checking again every {}s", retry.as_secs());
                        // One Event per distinct wait, not one per retry.
                        let first = slot.state != State::Waiting(msg.clone());
                        if let Some(slot) = self.slots.get_mut(&configmap) {
                            slot.state = State::Waiting(msg.clone());
                        }
                        if first {
                            tracing::warn!(configmap = %configmap, "{msg}");
                            self.event(&cm, EventType::Warning, reason, &msg);
                        }
                        let tx = self.tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(retry).await;
                            let _ = tx.send(Msg::Retry(configmap));
                        });
                    }
                    Err(LoadError::Bad(why)) => {
                        let cm = slot.configmap.clone();
                        let keeps = slot.running.as_ref().map(|(l, _, _)| l.describe());
                        let msg = match &keeps {
                            Some(old) => format!("{why}; still running {old}"),
                            None => why.clone(),
                        };
                        tracing::error!(configmap = %configmap, error = %msg, "plugin failed to load");
                        count_load(&configmap, "failure");
                        if let Some(slot) = self.slots.get_mut(&configmap) {
                            slot.state = State::Failed(msg.clone());
                        }
                        self.event(&cm, EventType::Warning, "LoadFailed", &msg);
                    }
                }
            }
        }
    }

    async fn activate(&mut self, configmap: &str, loaded: Loaded, mut kinds: kinds::Kinds) {
        let name = loaded.plugin.manifest().name.clone();
        let clash = self.slots.iter().find(|(cm, s)| {
            cm.as_str() != configmap
                && s.running
                    .as_ref()
                    .is_some_and(|(l, _, _)| l.plugin.manifest().name == name)
        });
        if let Some((other, _)) = clash {
            let msg = format!(
                "plugin name {name:?} is already served by ConfigMap {other}; names must be unique"
            );
            let slot = self.slots.get_mut(configmap).expect("slot exists");
            slot.state = State::Failed(msg.clone());
            let cm = slot.configmap.clone();
            tracing::error!(configmap, "{msg}");
            self.event(&cm, EventType::Warning, "LoadFailed", &msg);
            return;
        }

        let env = self.env.clone();
        let slot = self.slots.get_mut(configmap).expect("slot exists");
        let source = slot.latest.clone().expect("a loaded plugin has a source");
        let cm = slot.configmap.clone();
        // Any replacement is `Swapped`, naming both versions; only a first load is `Loaded`.
        let (reason, msg) = match slot.running.take() {
            Some((old, _, handle)) if handle.kinds().same_watches(&kinds) => {
                let msg = format!(
                    "swapped in {}, replacing {}",
                    loaded.describe(),
                    old.describe()
                );
                set_info(configmap, Some(&old), None);
                handle.swap(loaded.clone());
                slot.running = Some((loaded, source, handle));
                ("Swapped", msg)
            }
            Some((old, _, handle)) => {
                // Different kinds: a clean restart of the controller, which still prunes
                // children of the kinds this version dropped.
                kinds.retire_from(handle.kinds());
                handle.stop().await;
                let msg = format!(
                    "swapped in {}, replacing {}; its kinds changed, so its controller restarted",
                    loaded.describe(),
                    old.describe()
                );
                set_info(configmap, Some(&old), None);
                let handle = env.spawn_controller(kinds, loaded.clone());
                slot.running = Some((loaded, source, handle));
                ("Swapped", msg)
            }
            None => {
                let msg = format!("loaded {}", loaded.describe());
                let handle = env.spawn_controller(kinds, loaded.clone());
                slot.running = Some((loaded, source, handle));
                ("Loaded", msg)
            }
        };
        count_load(configmap, "success");
        if reason == "Swapped" {
            metrics()
                .plugin_swaps
                .get_or_create(&ConfigMapLabels {
                    configmap: configmap.to_string(),
                })
                .inc();
        }
        slot.state = State::Running;
        if let Some((loaded, _, _)) = &slot.running {
            set_info(configmap, None, Some(loaded));
        }
        tracing::info!(configmap, "{msg}");
        self.event(&cm, EventType::Normal, reason, &msg);
    }

    async fn on_delete(&mut self, configmap: &str) {
        let Some(slot) = self.slots.remove(configmap) else {
            return;
        };
        if let Some((loaded, _, handle)) = slot.running {
            set_info(configmap, Some(&loaded), None);
            handle.stop().await;
            tracing::info!(configmap, plugin = %loaded.describe(), "plugin ConfigMap deleted; controller stopped, children left in place");
        }
    }

    fn publish_status(&self) {
        let mut all: Vec<Status> = self
            .slots
            .iter()
            .map(|(cm, s)| Status {
                configmap: cm.clone(),
                running: s.running.as_ref().map(|(l, _, _)| l.describe()),
                state: s.state.clone(),
            })
            .collect();
        all.sort_by(|a, b| a.configmap.cmp(&b.configmap));
        let ready = self.listed
            && self.slots.values().all(|s| {
                s.state != State::Loading
                    && s.running
                        .as_ref()
                        .is_none_or(|(_, _, handle)| handle.is_synced())
            });
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

    /// Queues an Event on the plugin ConfigMap `cm`, written off the registry's loop.
    fn event(&self, cm: &ConfigMap, type_: EventType, reason: &str, message: &str) {
        let reference: ObjectReference = cm.object_ref(&());
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(message.to_string()),
            action: "LoadPlugin".into(),
            secondary: None,
        };
        self.env.notices.record(ev, reference);
    }
}

impl Env {
    fn spawn_controller(&self, kinds: kinds::Kinds, loaded: Loaded) -> ControllerHandle {
        controller::spawn(
            self.client.clone(),
            &self.hub,
            self.recorder.clone(),
            kinds,
            loaded,
            self.config.clone(),
        )
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

async fn load(env: &Env, source: PluginSource) -> Result<(Loaded, kinds::Kinds), LoadError> {
    let plugin = env
        .sandbox
        .load(source.wasm.clone(), source.limits)
        .await
        .map_err(|e| LoadError::Bad(e.to_string()))?;
    let kinds = match kinds::resolve(&env.client, plugin.manifest()).await {
        Ok(k) => k,
        Err(ResolveError::Missing(m)) => {
            return Err(LoadError::Waiting {
                reason: "WaitingForKinds",
                message: format!("waiting for kinds to be served: {}", m.join(", ")),
                retry: config::KIND_RETRY,
            });
        }
        Err(e) => return Err(LoadError::Bad(e.to_string())),
    };
    // Refused here, one clear message, rather than Forbidden on every watch and write.
    super::access::check(&env.client, &kinds, env.watch_namespace.as_deref())
        .await
        .map_err(|message| LoadError::Waiting {
            reason: "Forbidden",
            message,
            retry: config::ACCESS_RETRY,
        })?;
    let loaded = Loaded {
        plugin,
        settings: Arc::new(source.settings.clone()),
        resync: source.resync.unwrap_or(env.config.resync),
    };
    Ok((loaded, kinds))
}
