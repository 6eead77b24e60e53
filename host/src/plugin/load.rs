//! Loading one version of a plugin: source → compiled, probed plugin → kinds resolved → its
//! [`Identity`] → permissions checked → [`Loaded`], or a typed [`LoadError`] saying why not
//! and whether to check again later.
//!
//! Nothing here keeps state or starts a controller: the registry decides what a result means
//! for the plugin's slot, and the controller stage runs what loaded.
//!
//! The module is inflated here, from its stored form, only once the load holds its size of the
//! [`ModuleBudget`] ([`config::MODULE_BUDGET_MIB`]): a load that would pass it waits its turn,
//! so loads in flight or waiting for a compile slot never hold more inflated bytes than that,
//! however many plugin ConfigMaps arrive at once. The bytes and the reservation go when the
//! compile ends, whatever its result.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::access::{self, AccessError, Missing};
use super::identity::{Identity, NameTooLong};
use super::notice::Notice;
use super::oci::{self, FetchError, Fetcher, PULL_SECRET_ANNOTATION};
use super::source::{PluginSource, SourceError};
use crate::config;
use crate::kinds::{self, Kinds, ResolveError};
use crate::sandbox::{Plugin, PluginError, Sandbox};

/// One version of a plugin, loaded and checked, with the configuration it runs with.
#[derive(Clone)]
pub struct Loaded {
    /// The compiled plugin.
    pub plugin: Plugin,
    /// Its settings.
    pub settings: Arc<Value>,
    /// Its resync period.
    pub resync: Duration,
    /// Who its writes are made as.
    pub identity: Identity,
    /// Rights the identity lacks that the plugin can run without (a child kind, Events):
    /// those writes fail on the parents with `Forbidden`.
    pub withheld: Option<Missing>,
    /// The number of its revision, once recorded (see [`super::revision`]).
    pub revision: Option<i64>,
}

impl Loaded {
    /// `name version (sha256:abcdef012345)` for logs, Events and conditions, with `, revision
    /// N` once it has one.
    pub fn describe(&self) -> String {
        let m = self.plugin.manifest();
        let digest = self.plugin.digest();
        let short = &digest[..digest.len().min(19)];
        match self.revision {
            Some(n) => format!("{} {} ({short}), revision {n}", m.name, m.version),
            None => format!("{} {} ({short})", m.name, m.version),
        }
    }

    /// True when both are the same version with the same settings and limits: swapping one
    /// for the other would change nothing.
    pub fn same_as(&self, other: &Loaded) -> bool {
        self.plugin.digest() == other.plugin.digest()
            && self.settings == other.settings
            && self.resync == other.resync
            && self.plugin.limits() == other.plugin.limits()
            && self.revision == other.revision
    }
}

/// Why a version did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The module could not be taken out of its stored form.
    #[error(transparent)]
    Source(SourceError),
    /// The module could not be fetched from its registry.
    #[error("ConfigMap {configmap}: fetching {reference}: {source}")]
    Registry {
        /// The ConfigMap.
        configmap: String,
        /// The reference.
        reference: String,
        /// Why.
        #[source]
        source: FetchError,
    },
    /// The module is bad: not a component, the wrong interface, a bad manifest.
    #[error(transparent)]
    Plugin(PluginError),
    /// Discovery of its kinds failed.
    #[error(transparent)]
    Discovery(ResolveError),
    /// Some of its kinds are not served yet (a CRD to install).
    #[error("waiting for kinds to be served: {}", .0.join(", "))]
    WaitingForKinds(Vec<String>),
    /// The host or the plugin's identity may not do what the plugin needs (RBAC to grant).
    #[error(transparent)]
    Forbidden(Missing),
    /// The permissions could not be checked (the API server did not answer a review).
    #[error(transparent)]
    Unchecked(AccessError),
    /// The ConfigMap's name cannot name a ServiceAccount.
    #[error(transparent)]
    Identity(NameTooLong),
}

impl LoadError {
    /// The Event it gives on the plugin's ConfigMap.
    pub fn notice(&self) -> Notice {
        match self {
            Self::Source(_)
            | Self::Plugin(_)
            | Self::Discovery(_)
            | Self::Unchecked(_)
            | Self::Identity(_)
            | Self::Registry { .. } => Notice::LoadFailed,
            Self::WaitingForKinds(_) => Notice::WaitingForKinds,
            Self::Forbidden(_) => Notice::Forbidden,
        }
    }

    /// When to try the same version again after `attempts` tries that failed this way before;
    /// `None` means only a new version can help.
    pub fn retry_after(&self, attempts: u32) -> Option<Duration> {
        match self {
            Self::Source(_) | Self::Plugin(_) | Self::Discovery(_) | Self::Identity(_) => None,
            // The running version stays; the same one is fetched again once the registry is
            // back (or the Secret is there), less often the longer it is not.
            Self::Registry { source, .. } => source.transient().then(|| {
                config::REGISTRY_RETRY
                    .saturating_mul(1 << attempts.min(16))
                    .min(config::REGISTRY_RETRY_MAX)
            }),
            Self::WaitingForKinds(_) => Some(config::KIND_RETRY),
            Self::Forbidden(_) | Self::Unchecked(_) => Some(config::ACCESS_RETRY),
        }
    }

    /// How the wait is described: the same words on every retry, so one Event tells it.
    pub fn retry_note(&self, attempts: u32) -> Option<String> {
        let first = self.retry_after(attempts)?;
        Some(match self {
            Self::Registry { .. } => format!(
                "trying again after {}s, doubling to at most {}s",
                config::REGISTRY_RETRY.as_secs(),
                config::REGISTRY_RETRY_MAX.as_secs()
            ),
            _ => format!("checking again every {}s", first.as_secs()),
        })
    }
}

/// Inflated module bytes that loads may hold at once: each reserves its module's size before
/// inflating it, and waits, first come first served, while that would pass the total.
#[derive(Clone)]
pub struct ModuleBudget {
    permits: Arc<Semaphore>,
    total: u32,
}

impl ModuleBudget {
    /// A budget of `bytes` (at most 4 GiB - 1).
    pub fn new(bytes: u64) -> Self {
        let total = u32::try_from(bytes).unwrap_or(u32::MAX);
        ModuleBudget {
            permits: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// The budget of `wasmop run`: [`config::MODULE_BUDGET_MIB`].
    pub fn host() -> Self {
        Self::new(config::MODULE_BUDGET_MIB << 20)
    }

    /// Waits until `bytes` fit beside what other loads hold, and holds them until dropped. More
    /// than the whole budget (a module the source checks would have refused) waits for all of
    /// it rather than forever.
    pub async fn reserve(&self, bytes: u64) -> OwnedSemaphorePermit {
        let n = u32::try_from(bytes).unwrap_or(u32::MAX).min(self.total);
        self.permits
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the budget's semaphore is never closed")
    }

    /// Bytes free now.
    pub fn available(&self) -> u64 {
        self.permits.available_permits() as u64
    }
}

/// What loading needs from the host.
pub struct Loader {
    client: Client,
    // The host's namespace, where plugin ServiceAccounts live.
    namespace: String,
    sandbox: Sandbox,
    // Permissions are checked in this namespace only when the host watches only it.
    watch_namespace: Option<String>,
    // The resync of plugins whose ConfigMap sets none.
    resync: Duration,
    // What inflated modules may take at once.
    budget: ModuleBudget,
    // Modules kept in registries.
    fetcher: Fetcher,
}

impl Loader {
    /// A loader compiling in `sandbox` and asking the cluster behind `client`, taking registry
    /// plugins as the signature policy `signatures` says and keeping them in `modules`.
    pub fn new(
        client: Client,
        namespace: String,
        sandbox: Sandbox,
        watch_namespace: Option<String>,
        resync: Duration,
        signatures: Arc<oci::Policy>,
        modules: oci::ModuleCache,
    ) -> Self {
        Loader {
            fetcher: Fetcher::new(
                client.clone(),
                namespace.clone(),
                oci::Limits::default(),
                signatures,
                modules,
            ),
            client,
            namespace,
            sandbox,
            watch_namespace,
            resync,
            budget: ModuleBudget::host(),
        }
    }

    /// Compiles and probes `source`, resolves its kinds and checks the host may serve them.
    /// The module is inflated from its stored form (unless `source` holds it already) once its
    /// size fits the budget, and dropped with its reservation when the compile ends.
    pub async fn load(&self, mut source: PluginSource) -> Result<(Loaded, Kinds), LoadError> {
        let plugin = {
            let (module, _held) = self.module(&mut source).await?;
            match source.parts.language() {
                Some(language) => {
                    let file = source.parts.file().to_string();
                    self.sandbox
                        .load_script(language, file, module, source.limits)
                        .await
                }
                None => self.sandbox.load(module, source.limits).await,
            }
        }
        .map_err(LoadError::Plugin)?;
        let kinds = kinds::resolve(&self.client, plugin.manifest())
            .await
            .map_err(|e| match e {
                ResolveError::Missing(kinds) => LoadError::WaitingForKinds(kinds),
                e => LoadError::Discovery(e),
            })?;
        let identity = Identity::new(&self.client, &self.namespace, &source.configmap)
            .map_err(LoadError::Identity)?;
        // Refused here, one clear message, rather than Forbidden on every watch and write.
        let withheld = access::check(
            &self.client,
            &identity,
            &kinds,
            self.watch_namespace.as_deref(),
        )
        .await
        .map_err(|e| match e {
            AccessError::Missing(m) => LoadError::Forbidden(m),
            e => LoadError::Unchecked(e),
        })?;
        let loaded = Loaded {
            plugin,
            settings: Arc::new(source.settings.clone()),
            resync: source.resync.unwrap_or(self.resync),
            identity,
            withheld,
            revision: None,
        };
        Ok((loaded, kinds))
    }
}

impl Loader {
    /// The inflated module of `source` and its reservation of the budget, taken first.
    async fn module(
        &self,
        source: &mut PluginSource,
    ) -> Result<(Vec<u8>, OwnedSemaphorePermit), LoadError> {
        if let Some(reference) = source.parts.reference(&source.configmap) {
            return self
                .fetch(source, reference.map_err(LoadError::Source)?)
                .await;
        }
        let held = std::mem::take(&mut source.wasm);
        let size = if held.is_empty() {
            source
                .parts
                .size(&source.configmap)
                .map_err(LoadError::Source)?
        } else {
            held.len() as u64
        };
        if self.budget.available() < size {
            tracing::info!(
                configmap = %source.configmap,
                bytes = size,
                "waiting for other loads to release module bytes (at most {} MiB at once)",
                config::MODULE_BUDGET_MIB
            );
        }
        let permit = self.budget.reserve(size).await;
        if !held.is_empty() {
            return Ok((held, permit));
        }
        // Inflating 64 MiB takes a CPU for a while: not on the runtime's threads.
        let (parts, configmap) = (source.parts.clone(), source.configmap.clone());
        let wasm = tokio::task::spawn_blocking(move || parts.wasm(&configmap))
            .await
            .map_err(|e| {
                LoadError::Plugin(PluginError::new(
                    crate::sandbox::UNKNOWN_PLUGIN,
                    &source.digest,
                    crate::sandbox::PluginErrorKind::Internal(format!("inflating thread: {e}")),
                ))
            })?
            .map_err(LoadError::Source)?;
        Ok((wasm, permit))
    }
}

impl Loader {
    /// The module a registry holds for `source`, its size reserved once the manifest says it.
    async fn fetch(
        &self,
        source: &PluginSource,
        reference: oci::Reference,
    ) -> Result<(Vec<u8>, OwnedSemaphorePermit), LoadError> {
        let failed = |e: FetchError| LoadError::Registry {
            configmap: source.configmap.clone(),
            reference: reference.to_string(),
            source: e,
        };
        let secret = source
            .parts
            .annotations
            .get(PULL_SECRET_ANNOTATION)
            .map(String::as_str);
        let found = self
            .fetcher
            .layer(&reference, secret, source.parts.language())
            .await
            .map_err(failed)?;
        let permit = self.budget.reserve(found.size()).await;
        let module = self
            .fetcher
            .module(found, &reference, secret)
            .await
            .map_err(failed)?;
        Ok((module, permit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_load_past_the_budget_waits_for_the_bytes_earlier_loads_hold() {
        let budget = ModuleBudget::new(100);
        let first = budget.reserve(60).await;
        assert_eq!(budget.available(), 40);
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.reserve(60).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "60 + 60 bytes do not fit in 100");
        // One that fits beside the first waits too: first come, first served.
        let small = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.reserve(10).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!small.is_finished(), "it queues behind the waiting load");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("it fits once the first is done")
            .unwrap();
        let small = small.await.unwrap();
        assert_eq!(budget.available(), 30);
        drop((second, small));
        // More than the whole budget takes all of it rather than waiting forever.
        let all = tokio::time::timeout(Duration::from_secs(5), budget.reserve(1 << 40))
            .await
            .expect("clamped to the budget");
        assert_eq!(budget.available(), 0);
        drop(all);
        assert_eq!(budget.available(), 100);
    }

    #[test]
    fn only_waits_are_retried() {
        let waiting =
            LoadError::WaitingForKinds(vec!["cache.example.com/v1alpha1 Memcached".into()]);
        assert_eq!(waiting.notice(), Notice::WaitingForKinds);
        assert_eq!(waiting.retry_after(0), Some(config::KIND_RETRY));
        assert_eq!(waiting.retry_after(5), Some(config::KIND_RETRY));
        assert_eq!(
            waiting.to_string(),
            "waiting for kinds to be served: cache.example.com/v1alpha1 Memcached"
        );
        let bad = LoadError::Discovery(ResolveError::Missing(Vec::new()));
        assert_eq!(bad.notice().reason(), "LoadFailed");
        assert_eq!(bad.retry_after(0), None);
        assert_eq!(bad.retry_note(0), None);
    }

    #[test]
    fn a_registry_that_is_down_is_asked_less_and_less_often() {
        let down = LoadError::Registry {
            configmap: "memcached".into(),
            reference: "oci://127.0.0.1:5000/team/memcached@sha256:00".into(),
            source: FetchError::Registry(oci::OciError::Timeout {
                url: "http://127.0.0.1:5000/v2/team/memcached".into(),
                after: Duration::from_secs(60),
            }),
        };
        let delays: Vec<u64> = (0..8)
            .map(|n| down.retry_after(n).unwrap().as_secs())
            .collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(down.retry_after(u32::MAX), Some(config::REGISTRY_RETRY_MAX));
        assert_eq!(
            down.retry_note(0),
            down.retry_note(3),
            "one wording for every retry"
        );
        // A module that is wrong is not fetched again.
        let wrong = LoadError::Registry {
            configmap: "memcached".into(),
            reference: "oci://127.0.0.1:5000/team/memcached@sha256:00".into(),
            source: FetchError::Registry(oci::OciError::Manifest {
                reference: "oci://127.0.0.1:5000/team/memcached@sha256:00".into(),
                reason: "two module layers".into(),
            }),
        };
        assert_eq!(wrong.retry_after(0), None);
    }
}
