//! A plugin ConfigMap's registry reference turned into its module at load time, in two steps
//! so that the loader can reserve the module's size of its budget in between: the manifest
//! ([`Fetcher::layer`]), then the layer ([`Fetcher::module`]).
//!
//! Credentials come from the Secret the ConfigMap names in [`PULL_SECRET_ANNOTATION`], read
//! with the host's own identity in the host's namespace: it must be a
//! `kubernetes.io/dockerconfigjson` Secret with an entry for the registry, so naming any other
//! Secret (the artifact key, say) gives an error and sends nothing anywhere. The host reads
//! only the Secrets its Role names; an admin grants `get` on each pull Secret.
//!
//! Before a byte of the module is fetched, the manifest's signature is checked when the
//! admin's [`Policy`] asks for one. What is pulled is kept on disk ([`ModuleCache`]); a
//! reference pinned to a manifest kept there is loaded from it without dialling the registry.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::cache::{Entry, ModuleCache, access};
use super::{
    Credentials, Descriptor, Digest, Limits, OciClient, OciError, Policy, Reference, Requirement,
    SignatureError,
};
use super::{layer_language, plugin_kind};
use crate::sandbox::Language;

/// Annotation on a plugin ConfigMap: the pull Secret, in the host's namespace.
pub const PULL_SECRET_ANNOTATION: &str = "wasmop.io/pull-secret";
/// The Secret type a pull Secret must have.
const DOCKER_CONFIG_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Its key.
const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

/// Why a module could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The pull Secret is missing, unreadable or not a Docker config for the registry.
    #[error("pull Secret {namespace}/{name}: {reason}")]
    Secret {
        /// The host's namespace.
        namespace: String,
        /// The Secret.
        name: String,
        /// What is wrong.
        reason: String,
        /// Whether it may be fixed without a new version (created or granted later).
        transient: bool,
    },
    /// The signature policy refused it.
    #[error("signature: {0}")]
    Signature(SignatureError),
    /// The registry's answer.
    #[error(transparent)]
    Registry(#[from] OciError),
}

impl From<SignatureError> for FetchError {
    fn from(e: SignatureError) -> Self {
        match e {
            SignatureError::Registry(e) => FetchError::Registry(e),
            e => FetchError::Signature(e),
        }
    }
}

impl FetchError {
    /// Whether trying the same version again later may succeed: the registry or the network
    /// was down or slow, or the Secret may yet be created; not a manifest or module that is
    /// wrong, which only a new version mends.
    pub fn transient(&self) -> bool {
        match self {
            Self::Secret { transient, .. } => *transient,
            // A signature is pushed after its module; a new version of the ConfigMap (or of
            // the policy, by a restart) is what tries again.
            Self::Signature(_) => false,
            Self::Registry(e) => match e {
                OciError::Http { .. } | OciError::Timeout { .. } => true,
                OciError::Status { status, .. } => {
                    *status >= 500 || *status == 429 || *status == 408
                }
                _ => false,
            },
        }
    }
}

/// Where a module comes from, once its manifest is known: what the loader reserves its size
/// by before a byte of it is read.
#[derive(Debug)]
pub enum Found {
    /// The disk cache holds it.
    Cached {
        /// The manifest's digest.
        manifest: Digest,
        /// What the cache says of it.
        entry: Entry,
        /// What the registry has just said of it besides (a key verified, a login let in),
        /// to record once the module is read.
        update: Option<Box<Entry>>,
    },
    /// The registry.
    Remote(Box<Remote>),
}

/// A manifest read from its registry, its signature checked, its module not yet fetched.
#[derive(Debug)]
pub struct Remote {
    client: OciClient,
    manifest: Digest,
    layer: Descriptor,
    digest: Digest,
    verified_by: Option<String>,
    access: String,
}

impl Remote {
    /// What the cache records of this pull.
    fn entry(&self) -> Entry {
        Entry::new(
            &self.digest,
            &self.layer.media_type,
            self.layer.size,
            self.access.clone(),
            self.verified_by.clone(),
        )
    }
}

impl Found {
    /// The module's size, as the manifest says it.
    pub fn size(&self) -> u64 {
        match self {
            Found::Cached { entry, .. } => entry.size,
            Found::Remote(remote) => remote.layer.size,
        }
    }
}

/// Fetches plugin modules from registries for the loader.
#[derive(Clone)]
pub struct Fetcher {
    client: kube::Client,
    namespace: String,
    limits: Limits,
    policy: Arc<Policy>,
    cache: ModuleCache,
}

impl Fetcher {
    /// A fetcher reading pull Secrets in `namespace`, checking signatures as `policy` says,
    /// keeping what it pulls in `cache`.
    pub fn new(
        client: kube::Client,
        namespace: String,
        limits: Limits,
        policy: Arc<Policy>,
        cache: ModuleCache,
    ) -> Fetcher {
        Fetcher {
            client,
            namespace,
            limits,
            policy,
            cache,
        }
    }

    /// Where the plugin of `reference` is, which must be in `language` (a module for `None`):
    /// the disk cache, without dialling the registry, when the reference is pinned to a
    /// manifest it holds that the same registry, repository and login pulled (and a key the
    /// policy trusts verified, if it asks for one); else the registry, the manifest's
    /// signature checked first when the policy wants one, and the module taken from the cache
    /// if it holds it by then. The pull Secret is read either way.
    pub async fn layer(
        &self,
        reference: &Reference,
        pull_secret: Option<&str>,
        language: Option<Language>,
    ) -> Result<Found, FetchError> {
        // A reference the policy refuses outright is not even dialled.
        let requirement = self.policy.requirement(reference);
        if let Requirement::Refused = requirement {
            return Err(SignatureError::Refused.into());
        }
        let (credentials, access) = self.login(reference, pull_secret).await?;
        if let Some(pin) = &reference.digest
            && let Some(entry) = self.cache.entry(pin, &requirement, Some(&access))
        {
            same_kind(reference, &entry.media_type, language)?;
            return Ok(Found::Cached {
                manifest: pin.clone(),
                entry,
                update: None,
            });
        }
        let remote = self
            .remote(reference, credentials, requirement, access)
            .await?;
        same_kind(reference, &remote.layer.media_type, language)?;
        // Kept before, for another login or key: the registry has just let this one have
        // the manifest (and the policy's key verified it), so only the download is saved.
        let update = remote.entry();
        match self.cache.entry(&remote.manifest, &Requirement::None, None) {
            Some(entry) if entry.layer == update.layer && entry.media_type == update.media_type => {
                Ok(Found::Cached {
                    manifest: remote.manifest,
                    entry,
                    update: Some(Box::new(update)),
                })
            }
            _ => Ok(Found::Remote(Box::new(remote))),
        }
    }

    /// The credentials of the pull Secret, if the ConfigMap names one, and who they make the
    /// puller ([`access`]).
    async fn login(
        &self,
        reference: &Reference,
        pull_secret: Option<&str>,
    ) -> Result<(Option<Credentials>, String), FetchError> {
        let credentials = match pull_secret {
            Some(name) => Some(self.credentials(name, &reference.registry).await?),
            None => None,
        };
        let access = access(
            &reference.registry,
            &reference.repository,
            credentials.as_ref(),
        );
        Ok((credentials, access))
    }

    /// The manifest from the registry, its signature checked as `requirement` says.
    async fn remote(
        &self,
        reference: &Reference,
        credentials: Option<Credentials>,
        requirement: Requirement<'_>,
        access: String,
    ) -> Result<Remote, FetchError> {
        let client = OciClient::new(reference, credentials, self.limits)?;
        let (manifest, layer, digest) = client.module_layer(reference).await?;
        let mut verified_by = None;
        if let Requirement::Signed(keys) = requirement {
            let by = client.verify(reference, &manifest, keys).await?;
            tracing::info!(%reference, key = %by, "signature verified");
            verified_by = Some(by);
        }
        Ok(Remote {
            client,
            manifest,
            layer,
            digest,
            verified_by,
            access,
        })
    }

    /// The module, checked against its descriptor (or its cache entry), and kept in the cache.
    /// A cached module that fails its check is pulled again.
    pub async fn module(
        &self,
        found: Found,
        reference: &Reference,
        pull_secret: Option<&str>,
    ) -> Result<Vec<u8>, FetchError> {
        let remote = match found {
            Found::Remote(remote) => *remote,
            Found::Cached {
                manifest,
                entry,
                update,
            } => {
                let cache = self.cache.clone();
                let read = tokio::task::spawn_blocking(move || {
                    let module = cache.read(&manifest, &entry)?;
                    if let Some(update) = update {
                        cache.record(&manifest, &update);
                    }
                    Some(module)
                })
                .await
                .ok()
                .flatten();
                if let Some(module) = read {
                    tracing::info!(%reference, "module taken from the disk cache");
                    return Ok(module);
                }
                let (credentials, access) = self.login(reference, pull_secret).await?;
                let requirement = self.policy.requirement(reference);
                self.remote(reference, credentials, requirement, access)
                    .await?
            }
        };
        let entry = remote.entry();
        let Remote {
            client,
            manifest,
            layer,
            digest,
            ..
        } = remote;
        let module = client.blob(reference, &digest, layer.size).await?;
        let cache = self.cache.clone();
        Ok(tokio::task::spawn_blocking(move || {
            cache.store(&manifest, &module, entry);
            module
        })
        .await
        .map_err(|e| OciError::Protocol {
            url: reference.to_string(),
            reason: format!("keeping the module: {e}"),
        })?)
    }

    async fn credentials(&self, name: &str, registry: &str) -> Result<Credentials, FetchError> {
        let fail = |reason: String, transient: bool| FetchError::Secret {
            namespace: self.namespace.clone(),
            name: name.to_string(),
            reason,
            transient,
        };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = match secrets.get_opt(name).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err(fail("not found".into(), true)),
            Err(kube::Error::Api(e)) if e.code == 403 => {
                return Err(fail(
                    format!(
                        "the host may not read it (grant its Role get on secrets/{name}): {}",
                        e.message
                    ),
                    true,
                ));
            }
            Err(e) => return Err(fail(e.to_string(), true)),
        };
        if secret.type_.as_deref() != Some(DOCKER_CONFIG_TYPE) {
            return Err(fail(
                format!(
                    "type {:?}, not {DOCKER_CONFIG_TYPE}",
                    secret.type_.as_deref().unwrap_or("")
                ),
                false,
            ));
        }
        let json = secret
            .data
            .as_ref()
            .and_then(|d| d.get(DOCKER_CONFIG_KEY))
            .ok_or_else(|| fail(format!("no {DOCKER_CONFIG_KEY} key"), false))?;
        Credentials::from_docker_config(&json.0, registry)
            .map_err(|e| fail(e, false))?
            .ok_or_else(|| fail(format!("no entry for {registry}"), false))
    }
}

/// Refuses a layer that holds another kind of plugin than the ConfigMap's key names: a module
/// handed to the script interpreter, or a script to the compiler, would fail with a message
/// about the wrong thing.
fn same_kind(
    reference: &Reference,
    media_type: &str,
    language: Option<Language>,
) -> Result<(), FetchError> {
    let held = layer_language(media_type).flatten();
    if held == language {
        return Ok(());
    }
    Err(FetchError::Registry(OciError::Manifest {
        reference: reference.to_string(),
        reason: format!(
            "it holds {}, and the ConfigMap's key names {}: a module goes under a key like plugin.oci, a Starlark script under one like plugin.star.oci",
            plugin_kind(held),
            plugin_kind(language)
        ),
    }))
}
