//! Loading one version of a plugin: source → compiled, probed plugin → kinds resolved → its
//! [`Identity`] → permissions checked → [`Loaded`], or a typed [`LoadError`] saying why not
//! and whether to check again later.
//!
//! Nothing here keeps state or starts a controller: the registry decides what a result means
//! for the plugin's slot, and the controller stage runs what loaded.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use serde_json::Value;

use super::access::{self, AccessError, Missing};
use super::identity::{Identity, NameTooLong};
use super::notice::Notice;
use super::source::PluginSource;
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
            Self::Plugin(_) | Self::Discovery(_) | Self::Unchecked(_) | Self::Identity(_) => {
                Notice::LoadFailed
            }
            Self::WaitingForKinds(_) => Notice::WaitingForKinds,
            Self::Forbidden(_) => Notice::Forbidden,
        }
    }

    /// When to try the same version again; `None` means only a new version can help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Plugin(_) | Self::Discovery(_) | Self::Identity(_) => None,
            Self::WaitingForKinds(_) => Some(config::KIND_RETRY),
            Self::Forbidden(_) | Self::Unchecked(_) => Some(config::ACCESS_RETRY),
        }
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
}

impl Loader {
    /// A loader compiling in `sandbox` and asking the cluster behind `client`.
    pub fn new(
        client: Client,
        namespace: String,
        sandbox: Sandbox,
        watch_namespace: Option<String>,
        resync: Duration,
    ) -> Self {
        Loader {
            client,
            namespace,
            sandbox,
            watch_namespace,
            resync,
        }
    }

    /// Compiles and probes `source`, resolves its kinds and checks the host may serve them.
    pub async fn load(&self, source: PluginSource) -> Result<(Loaded, Kinds), LoadError> {
        let plugin = self
            .sandbox
            .load(source.wasm.clone(), source.limits)
            .await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waits_are_retried() {
        let waiting =
            LoadError::WaitingForKinds(vec!["cache.example.com/v1alpha1 Memcached".into()]);
        assert_eq!(waiting.notice(), Notice::WaitingForKinds);
        assert_eq!(waiting.retry_after(), Some(config::KIND_RETRY));
        assert_eq!(
            waiting.to_string(),
            "waiting for kinds to be served: cache.example.com/v1alpha1 Memcached"
        );
        let bad = LoadError::Discovery(ResolveError::Missing(Vec::new()));
        assert_eq!(bad.notice().reason(), "LoadFailed");
        assert_eq!(bad.retry_after(), None);
    }
}
