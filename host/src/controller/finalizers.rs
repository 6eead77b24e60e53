//! A plugin's finalizer on its parents: put on and taken off by a reconcile ([`set`]), and taken off every parent once nothing will ever remove it otherwise: the
//! plugin's ConfigMap is gone, or its new version no longer asks for that finalizer.
//! [`release_all`] works from the controller's cache while the plugin still runs;
//! [`release_listed`] lists the parents itself, for a plugin whose ConfigMap was deleted while
//! no host ran it (see `ledger::FINALIZERS`).
//!
//! Left in place, `wasmop.io/<plugin>` would hang the deletion of every parent that carries
//! it. Released, a parent being deleted goes at once, and its children go with it by garbage
//! collection, as they would for any parent without a finalizer.

use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams};
use serde_json::json;
use wasmop_contract::Manifest;

use super::Shared;
use super::error::ReconcileError;
use crate::kinds::ResolvedKind;
use crate::watch::Object;

/// Tries per parent: a conflict means the parent changed since the cache saw it, and the
/// cache catches up within moments.
const ATTEMPTS: usize = 5;
const PAUSE: Duration = Duration::from_millis(200);

/// Whether a version with `old`'s finalizer replaced by `new` leaves that finalizer without
/// anyone to remove it. `same_parent` says whether both serve the same parent kind.
pub fn orphaned(old: &Manifest, new: &Manifest, same_parent: bool) -> Option<String> {
    if !old.finalizer {
        return None;
    }
    let kept = new.finalizer && new.finalizer_name() == old.finalizer_name() && same_parent;
    (!kept).then(|| old.finalizer_name())
}

/// Removes `finalizer` from every cached parent that has it; returns how many were released.
/// A parent that cannot be patched is logged and left as it is.
pub async fn release_all(shared: &Shared, finalizer: &str) -> usize {
    let has = |p: &crate::watch::Object| p.finalizers().iter().any(|f| f == finalizer);
    let mut released = 0;
    for parent in shared.parents.list(None, has) {
        let key = parent.key();
        let api = shared.kinds.parent.api(&shared.writer, key.namespace());
        for attempt in 1..=ATTEMPTS {
            // The newest copy the cache has: it may have caught up after a conflict.
            let Some(current) = shared
                .parents
                .get(key.namespace(), &key.name)
                .filter(|p| has(p))
            else {
                break;
            };
            match set(&api, &current, finalizer, false).await {
                Ok(()) => {
                    released += 1;
                    break;
                }
                Err(e) if attempt < ATTEMPTS && e.is_conflict() => tokio::time::sleep(PAUSE).await,
                Err(error) => {
                    tracing::warn!(parent = %key, %error, "could not release the finalizer");
                    break;
                }
            }
        }
    }
    if released > 0 {
        tracing::info!(
            finalizer,
            released,
            "released the finalizer of a plugin that no longer removes it"
        );
    }
    released
}

/// Parents listed per page by [`release_listed`].
const PAGE: u32 = 500;

/// Why [`release_listed`] left the finalizer somewhere.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The parents could not be listed.
    #[error("could not list the parents")]
    List(#[source] kube::Error),
    /// Some parents could not be patched; the first is named.
    #[error("{failed} parent(s) kept the finalizer, among them {namespace}/{name}")]
    Patch {
        /// How many.
        failed: usize,
        /// The first one's namespace (empty when cluster-scoped).
        namespace: String,
        /// The first one's name.
        name: String,
        /// Why it could not be patched.
        #[source]
        source: ReconcileError,
    },
}

/// Takes `finalizer` off every parent of `kind` (in `namespace`, or everywhere) that carries
/// it: lists them as `reader`, patches them as `writer`. Returns how many were released; an
/// error when any kept it (the others are still released).
pub async fn release_listed(
    kind: &ResolvedKind,
    reader: &Client,
    writer: &Client,
    namespace: Option<&str>,
    finalizer: &str,
) -> Result<usize, SweepError> {
    let has = |m: &ObjectMeta| carries(m, finalizer);
    let (mut released, mut failed, mut first) = (0, 0, None);
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = kind
            .api(reader, namespace)
            .list_metadata(&params)
            .await
            .map_err(SweepError::List)?;
        for meta in page.items.into_iter().map(|p| p.metadata).filter(has) {
            let (ns, name) = (
                meta.namespace.clone(),
                meta.name.clone().unwrap_or_default(),
            );
            let (reads, writes) = (
                kind.api(reader, ns.as_deref()),
                kind.api(writer, ns.as_deref()),
            );
            match release_one(&reads, &writes, meta, finalizer).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(error) => {
                    failed += 1;
                    first.get_or_insert((ns.unwrap_or_default(), name, error));
                }
            }
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    match first {
        None => Ok(released),
        Some((namespace, name, source)) => Err(SweepError::Patch {
            failed,
            namespace,
            name,
            source,
        }),
    }
}

/// Takes `finalizer` off the parent `meta` lists, reading it again after a conflict; whether
/// this call released it (not when it went or lost the finalizer meanwhile).
async fn release_one(
    reads: &Api<DynamicObject>,
    writes: &Api<DynamicObject>,
    mut meta: ObjectMeta,
    finalizer: &str,
) -> Result<bool, ReconcileError> {
    let name = meta.name.clone().unwrap_or_default();
    let mut attempt = 1;
    loop {
        let list = meta
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect();
        let version = meta.resource_version.as_deref();
        match set_finalizers(writes, &name, version, list, finalizer).await {
            Ok(()) => return Ok(true),
            Err(e) if attempt < ATTEMPTS && e.is_conflict() => attempt += 1,
            Err(e) => return Err(e),
        }
        tokio::time::sleep(PAUSE).await;
        let fresh = reads.get_metadata_opt(&name).await;
        match fresh.map_err(|source| ReconcileError::Finalizer {
            finalizer: finalizer.to_owned(),
            source,
        })? {
            Some(fresh) if carries(&fresh.metadata, finalizer) => meta = fresh.metadata,
            _ => return Ok(false),
        }
    }
}

/// Whether `meta` lists `finalizer`.
fn carries(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Puts `finalizer` on `parent` (`on`) or takes it off, as of the version the cache holds.
pub(super) async fn set(
    api: &Api<DynamicObject>,
    parent: &Object,
    finalizer: &str,
    on: bool,
) -> Result<(), ReconcileError> {
    let mut list: Vec<String> = parent.finalizers().to_vec();
    list.retain(|f| f != finalizer);
    if on {
        list.push(finalizer.to_string());
    }
    let (name, version) = (parent.name(), parent.resource_version());
    set_finalizers(api, name, version, list, finalizer).await
}

// A merge patch carrying the resourceVersion we read is a compare-and-swap: other
// controllers' finalizers added meanwhile make it fail with a conflict, not vanish.
async fn set_finalizers(
    api: &Api<DynamicObject>,
    name: &str,
    resource_version: Option<&str>,
    list: Vec<String>,
    finalizer: &str,
) -> Result<(), ReconcileError> {
    let patch = json!({"metadata": {
        "resourceVersion": resource_version,
        "finalizers": list,
    }});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| ReconcileError::Finalizer {
            finalizer: finalizer.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixtures::bare_manifest as manifest;

    #[test]
    fn a_finalizer_is_orphaned_unless_the_new_version_keeps_it_on_the_same_kind() {
        let on = manifest("a", true);
        assert_eq!(orphaned(&on, &on, true), None);
        assert_eq!(
            orphaned(&on, &manifest("a", false), true).as_deref(),
            Some("wasmop.io/a")
        );
        assert_eq!(
            orphaned(&on, &manifest("b", true), true).as_deref(),
            Some("wasmop.io/a")
        );
        assert_eq!(orphaned(&on, &on, false).as_deref(), Some("wasmop.io/a"));
        assert_eq!(orphaned(&manifest("a", false), &on, true), None);
    }
}
