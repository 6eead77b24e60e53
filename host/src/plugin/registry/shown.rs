//! Every plugin's state, one `kubectl get` away: the registry keeps a `WasmopPlugin` object
//! (`deploy/host/wasmopplugins.yaml`) per plugin ConfigMap, named after it and owned by it (so
//! it goes with it), whose status says what runs (version, digest, revision), the rollout
//! beside it, the newest version's state, and the last Event's reason and message.
//!
//! Events say what happened, and go after an hour; this says what is. Only the replica that
//! judges rollouts writes it (the leader, or the holder of the designated shard), and only
//! what changed. Without the CRD the host runs as before and says so once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// How long to wait before trying again once the API server said the kind is not served.
const RETRY_MISSING: Duration = Duration::from_secs(60);

/// What a `WasmopPlugin` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shown {
    /// The newest version's state: `Running`, `Loading`, `Waiting` or `Failed`.
    pub state: String,
    /// `name version` of what runs.
    pub version: Option<String>,
    /// Its digest.
    pub digest: Option<String>,
    /// Its revision.
    pub revision: Option<i64>,
    /// `Live`, or the candidate beside it.
    pub rollout: String,
    /// The last Event's reason.
    pub reason: Option<String>,
    /// Why the newest version does not run, else the last Event's message.
    pub message: Option<String>,
}

/// The `WasmopPlugin` named `configmap` with `shown` as its status, owned by the ConfigMap
/// whose UID is `uid`.
pub fn object(configmap: &str, uid: &str, shown: &Shown) -> Value {
    json!({
        "apiVersion": "wasmop.io/v1alpha1",
        "kind": "WasmopPlugin",
        "metadata": {
            "name": configmap,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": configmap, "uid": uid,
            }],
        },
        "status": {
            "state": shown.state,
            "version": shown.version,
            "digest": shown.digest,
            "revision": shown.revision,
            "rollout": shown.rollout,
            "reason": shown.reason,
            "message": shown.message.as_deref().map(|m| crate::text::truncate(m.to_string(), 1024)),
        },
    })
}

/// Writes the `WasmopPlugin`s of one namespace.
pub struct Shower {
    api: Api<DynamicObject>,
    // What was written, by ConfigMap, with the UID of the ConfigMap that owns it: one deleted
    // and made again takes its object with it, which is then written afresh.
    written: HashMap<String, (String, Shown)>,
    // Since when the kind is known not to be served.
    missing: Option<Instant>,
}

impl Shower {
    /// Writes in `namespace` through `client`.
    pub fn new(client: Client, namespace: &str) -> Self {
        let gvk = GroupVersionKind::gvk("wasmop.io", "v1alpha1", "WasmopPlugin");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "wasmopplugins");
        Shower {
            api: Api::namespaced_with(client, namespace, &resource),
            written: HashMap::new(),
            missing: None,
        }
    }

    /// Writes each of `plugins` (ConfigMap name and UID, and what to show) that changed since
    /// it was last written.
    pub async fn show(&mut self, plugins: Vec<(String, String, Shown)>) {
        if self
            .missing
            .is_some_and(|since| since.elapsed() < RETRY_MISSING)
        {
            return;
        }
        self.written
            .retain(|cm, _| plugins.iter().any(|(name, _, _)| name == cm));
        for (configmap, uid, shown) in plugins {
            let same = self
                .written
                .get(&configmap)
                .is_some_and(|(u, s)| *u == uid && *s == shown);
            if same || uid.is_empty() {
                continue;
            }
            let obj = object(&configmap, &uid, &shown);
            let params = PatchParams::apply("wasmop").force();
            match self
                .api
                .patch(&configmap, &params, &Patch::Apply(&obj))
                .await
            {
                Ok(_) => {
                    self.missing = None;
                    self.written.insert(configmap, (uid, shown));
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    if self.missing.is_none() {
                        tracing::warn!(
                            "the WasmopPlugin kind is not served (deploy/host/wasmopplugins.yaml): plugin states show in Events and the log only"
                        );
                    }
                    self.missing = Some(Instant::now());
                    return;
                }
                Err(e) => {
                    let error = crate::text::chain(&e);
                    tracing::warn!(
                        configmap,
                        error,
                        "could not write the plugin's WasmopPlugin"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_owned_by_its_configmap_and_bounded() {
        let shown = Shown {
            state: "Failed".into(),
            version: Some("memcached 0.1.0".into()),
            revision: Some(3),
            rollout: "Live".into(),
            reason: Some("LoadFailed".into()),
            message: Some("x".repeat(5000)),
            ..Shown::default()
        };
        let obj = object("memcached", "u-1", &shown);
        assert_eq!(obj["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(obj["metadata"]["ownerReferences"][0]["kind"], "ConfigMap");
        assert_eq!(obj["status"]["revision"], 3);
        assert!(obj["status"]["message"].as_str().unwrap().len() <= 1024 + 8);
        assert_eq!(obj["status"]["digest"], Value::Null);
    }
}
