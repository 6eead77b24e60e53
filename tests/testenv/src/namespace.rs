//! A namespace per test: [`namespace`] and [`TestNamespace`].
//!
//! Tests share a cluster, so each one works in a namespace of its own, named
//! `<prefix>-<random suffix>` so that reruns and parallel tests never collide.
//!
//! Namespaces are **left in place** when a `TestNamespace` is dropped: a drop cannot await
//! the deletion, and a request spawned from it would die with the test's runtime. A plane
//! started for the test binary goes away with it anyway. Call [`TestNamespace::delete`] to
//! delete one explicitly (e.g. against an existing cluster, or before measuring load);
//! every test namespace carries the label `wasmop.io/testenv=true` for bulk clean-up.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Client, Resource};

use crate::error::{Error, Result};

/// The label on every namespace made by [`namespace`].
pub const TEST_NAMESPACE_LABEL: &str = "wasmop.io/testenv";

/// How long [`namespace`] waits for the `default` ServiceAccount.
const SERVICE_ACCOUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// A namespace created for one test.
#[derive(Clone)]
pub struct TestNamespace {
    name: String,
    client: Client,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish()
    }
}

impl TestNamespace {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An [`Api`] for namespaced resources of kind `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace with background propagation, without waiting for its contents
    /// to be removed.
    pub async fn delete(self) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client);
        match namespaces
            .delete(&self.name, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(Error::kube(format!("deleting namespace {}", self.name), e)),
        }
    }
}

/// Creates a namespace named `<prefix>-<random suffix>` and waits for its `default`
/// ServiceAccount, without which the apiserver refuses pods.
///
/// `prefix` is lower-cased, and characters a namespace name cannot hold become `-`.
pub async fn namespace(client: &Client, prefix: &str) -> Result<TestNamespace> {
    let name = unique_name(prefix);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(
                TEST_NAMESPACE_LABEL.to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| Error::kube(format!("creating namespace {name}"), e))?;

    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    crate::wait_for(
        &format!("the default ServiceAccount in namespace {name}"),
        SERVICE_ACCOUNT_TIMEOUT,
        || async { accounts.get_opt("default").await.map(|a| a.map(drop)) },
    )
    .await?;
    Ok(TestNamespace {
        name,
        client: client.clone(),
    })
}

/// `<prefix>-<suffix>`: a valid DNS label (at most 63 characters), random per call.
fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut clean: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    clean.truncate(50);
    let clean = clean.trim_matches('-');
    let clean = if clean.is_empty() { "test" } else { clean };
    // RandomState is seeded randomly per process; the counter separates calls within one.
    let random = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{clean}-{}", base36(random, 8))
}

fn base36(mut n: u64, digits: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    (0..digits)
        .map(|_| {
            let digit = ALPHABET[(n % 36) as usize] as char;
            n /= 36;
            digit
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_unique() {
        let a = unique_name("My_Test");
        let b = unique_name("My_Test");
        assert!(a.starts_with("my-test-"), "{a}");
        assert_ne!(a, b);
        assert_eq!(a.len(), "my-test-".len() + 8);
        let long = unique_name(&"x".repeat(200));
        assert!(long.len() <= 63);
        assert!(unique_name("--").starts_with("test-"));
    }
}
