//! The Kubernetes identity a plugin writes with: its own ServiceAccount, impersonated.
//!
//! Every write the host makes for a plugin — children, prune, status, finalizers, Events on
//! parents — carries `Impersonate-User: system:serviceaccount:<host namespace>:wasmop-plugin-<configmap>`,
//! so the API server checks it against that ServiceAccount's RBAC, not the host's. The host
//! reads (watches) with its own identity and writes nothing of a plugin's with it.
//!
//! The ServiceAccount follows from the plugin ConfigMap's name and nothing else: no annotation
//! can choose it. Holding an identity therefore takes the right to update that one ConfigMap
//! (creating a ConfigMap of a taken name fails), and an identity has power only once an admin
//! has run `wasmop rbac` for it, which also grants the host `impersonate` on that
//! ServiceAccount alone.

use http::HeaderValue;
use kube::Client;
use kube::client::Body;

/// What every plugin ServiceAccount's name starts with.
pub const SERVICE_ACCOUNT_PREFIX: &str = "wasmop-plugin-";

/// The longest ServiceAccount name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// A plugin's ServiceAccount, and a client that acts as it.
#[derive(Clone)]
pub struct Identity {
    namespace: String,
    service_account: String,
    client: Client,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.username())
    }
}

/// The ServiceAccount name would be longer than Kubernetes allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the plugin ConfigMap's name is {len} characters long; its ServiceAccount {SERVICE_ACCOUNT_PREFIX}<name> \
     must fit in {MAX_NAME}, so the name may have at most {} characters",
    MAX_NAME - SERVICE_ACCOUNT_PREFIX.len()
)]
pub struct NameTooLong {
    /// The ConfigMap name's length.
    pub len: usize,
}

/// `wasmop-plugin-<configmap>`: the ServiceAccount of the plugin in that ConfigMap.
pub fn service_account(configmap: &str) -> Result<String, NameTooLong> {
    let name = format!("{SERVICE_ACCOUNT_PREFIX}{configmap}");
    if name.len() > MAX_NAME {
        return Err(NameTooLong {
            len: configmap.len(),
        });
    }
    Ok(name)
}

/// The user name the API server gives a ServiceAccount.
pub fn username(namespace: &str, service_account: &str) -> String {
    format!("system:serviceaccount:{namespace}:{service_account}")
}

impl Identity {
    /// The identity of the plugin in ConfigMap `configmap` of `namespace`, sending through
    /// `host`'s connections with the impersonation header added.
    pub fn new(host: &Client, namespace: &str, configmap: &str) -> Result<Identity, NameTooLong> {
        let service_account = service_account(configmap)?;
        let user = HeaderValue::from_str(&username(namespace, &service_account))
            .expect("namespace and DNS names are valid header values");
        let inner = host.clone();
        let impersonating = tower::service_fn(move |mut request: http::Request<Body>| {
            let (inner, user) = (inner.clone(), user.clone());
            async move {
                let headers = request.headers_mut();
                // Groups are left to the API server, which adds the ServiceAccount's own.
                headers.remove("impersonate-group");
                headers.insert("impersonate-user", user);
                inner.send(request).await
            }
        });
        Ok(Identity {
            namespace: namespace.to_string(),
            service_account,
            client: Client::new(impersonating, host.default_namespace()),
        })
    }

    /// The ServiceAccount's name.
    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// Its namespace (the host's).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `system:serviceaccount:<namespace>:<name>`.
    pub fn username(&self) -> String {
        username(&self.namespace, &self.service_account)
    }

    /// A client whose every request acts as the ServiceAccount.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_follows_from_the_configmap_name() {
        assert_eq!(
            service_account("memcached").unwrap(),
            "wasmop-plugin-memcached"
        );
        assert_eq!(
            username("wasmop-system", "wasmop-plugin-memcached"),
            "system:serviceaccount:wasmop-system:wasmop-plugin-memcached"
        );
        let longest = "a".repeat(MAX_NAME - SERVICE_ACCOUNT_PREFIX.len());
        assert!(service_account(&longest).is_ok());
        let err = service_account(&format!("{longest}a")).unwrap_err();
        assert_eq!(err.len, 240);
        assert!(err.to_string().contains("at most 239 characters"), "{err}");
    }
}
