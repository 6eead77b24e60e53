//! The request the host would build for one Memcached, for the per-call benchmarks: this
//! crate's `plugin_call` and the bench runner (`tests/bench`) include this file.

use serde_json::{Value, json};
use wasmop::contract::wire::WireRequest;
use wasmop::gather::{self, ObjectList};
use wasmop::kinds::Scope;
use wasmop::sandbox::{Plugin, PluginError};

/// A 3-replica Memcached with its Deployment and `pods` matching pods.
pub fn request(plugin: &Plugin, pods: usize) -> Result<WireRequest, PluginError> {
    let cr = json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "mc", "namespace": "bench", "uid": "u-mc", "generation": 1},
        "spec": {"size": 3}
    });
    let selectors = plugin.related_blocking(&cr)?;
    let labels = selectors
        .first()
        .and_then(|s| s.label_selector.match_labels.clone())
        .unwrap_or_default();
    let mut observed: Vec<Value> = (0..pods)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": format!("mc-{i:03}"), "namespace": "bench", "labels": labels,
                    "uid": format!("pod-uid-{i}"), "resourceVersion": "12345",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "mc-5d4f8", "uid": "rs-uid", "controller": true}]
                },
                "spec": {"containers": [{"name": "memcached", "image": "memcached:1.4.36-alpine"}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1"}
            })
        })
        .collect();
    observed.push(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "mc", "namespace": "bench",
            "ownerReferences": [{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "name": "mc", "uid": "u-mc", "controller": true}]},
        "spec": {"replicas": 3},
        "status": {"availableReplicas": 3}
    }));
    Ok(gather::request(
        plugin.manifest(),
        &cr,
        Scope::Namespaced,
        &selectors,
        &ObjectList::new(observed),
        &Value::Null,
        false,
    ))
}
