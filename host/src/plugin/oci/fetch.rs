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
//! admin's [`Policy`] asks for one.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::{
    Credentials, Descriptor, Digest, Limits, OciClient, OciError, Policy, Reference, Requirement,
    SignatureError,
};

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

/// Fetches plugin modules from registries for the loader.
#[derive(Clone)]
pub struct Fetcher {
    client: kube::Client,
    namespace: String,
    limits: Limits,
    policy: Arc<Policy>,
}

impl Fetcher {
    /// A fetcher reading pull Secrets in `namespace`, checking signatures as `policy` says.
    pub fn new(
        client: kube::Client,
        namespace: String,
        limits: Limits,
        policy: Arc<Policy>,
    ) -> Fetcher {
        Fetcher {
            client,
            namespace,
            limits,
            policy,
        }
    }

    /// A client for the reference's registry and the module layer its manifest names, the
    /// manifest's signature checked first when the policy wants one.
    pub async fn layer(
        &self,
        reference: &Reference,
        pull_secret: Option<&str>,
    ) -> Result<(OciClient, Descriptor, Digest), FetchError> {
        // A reference the policy refuses outright is not even dialled.
        let requirement = self.policy.requirement(reference);
        if let Requirement::Refused = requirement {
            return Err(SignatureError::Refused.into());
        }
        let credentials = match pull_secret {
            Some(name) => Some(self.credentials(name, &reference.registry).await?),
            None => None,
        };
        let client = OciClient::new(reference, credentials, self.limits)?;
        let (manifest, layer, digest) = client.module_layer(reference).await?;
        if let Requirement::Signed(keys) = requirement {
            let by = client.verify(reference, &manifest, keys).await?;
            tracing::info!(%reference, key = %by, "signature verified");
        }
        Ok((client, layer, digest))
    }

    /// The module layer, checked against its descriptor.
    pub async fn module(
        &self,
        client: &OciClient,
        reference: &Reference,
        layer: &Descriptor,
        digest: &Digest,
    ) -> Result<Vec<u8>, FetchError> {
        Ok(client.blob(reference, digest, layer.size).await?)
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
