//! The JSON shapes that cross the plugin boundary, shared by the guest SDK and the host.
//!
//! Objects stay `serde_json::Value` here: the host never needs to understand a child's schema,
//! and the SDK offers typed views on top (`wasmop_guest::Request`). A request is generic over
//! how it holds objects ([`WireRequest<O>`], `Value` by default) so that the host can assemble
//! one from the JSON texts its caches keep and serialise it without building a tree; the JSON
//! is the same either way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Scope;

/// Objects of one kind, by name (by `namespace/name` when the parent is cluster-scoped).
pub type ByName<O = Value> = BTreeMap<String, O>;

/// The key of a kind in [`WireRequest::children`] and [`WireRequest::related`]:
/// `Kind.apiVersion`, e.g. `Deployment.apps/v1` or `Pod.v1` (Metacontroller's convention).
pub fn kind_key(api_version: &str, kind: &str) -> String {
    format!("{kind}.{api_version}")
}

/// The key of an object within its kind's [`ByName`] map: its name, or `namespace/name` for a
/// namespaced object under a cluster-scoped parent.
pub fn object_key(obj: &Value, parent_scope: Scope) -> String {
    let field = |ptr| obj.pointer(ptr).and_then(Value::as_str);
    key_of(
        field("/metadata/name").unwrap_or_default(),
        field("/metadata/namespace"),
        parent_scope,
    )
}

/// [`object_key`] from an object's name and namespace.
pub fn key_of(name: &str, namespace: Option<&str>, parent_scope: Scope) -> String {
    match (parent_scope, namespace) {
        (Scope::Cluster, Some(ns)) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// What the host sends to `reconcile`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireRequest<O = Value> {
    /// The parent object, as the API server returned it (without `managedFields`).
    pub parent: O,
    /// The children the parent controls, per declared child kind. Every declared kind is
    /// present, empty when nothing exists yet.
    #[serde(default = "BTreeMap::new")]
    pub children: BTreeMap<String, ByName<O>>,
    /// The related objects the plugin's selectors matched, per declared related kind.
    #[serde(default = "BTreeMap::new")]
    pub related: BTreeMap<String, ByName<O>>,
    /// True while the parent is being deleted and the plugin's finalizer is still on it.
    #[serde(default)]
    pub finalizing: bool,
    /// The plugin's settings (the `settings.yaml` beside its module), `null` when absent.
    #[serde(default)]
    pub settings: Value,
    /// The time in UTC (RFC 3339), rounded down to the plugin's clock granularity; only for a
    /// plugin whose manifest declares `clock-seconds`, absent for every other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<String>,
}

/// What `reconcile` returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireResponse {
    /// Every child the parent should have. Controlled children missing here are deleted.
    #[serde(default)]
    pub children: Vec<Value>,
    /// The parent's new `.status`; `None` leaves it untouched. The host adds
    /// `observedGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Reconcile again after this many seconds even if nothing changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_after_seconds: Option<u64>,
    /// Kubernetes Events to record on the parent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<WireEvent>,
    /// While finalizing: true once cleanup is complete and the finalizer may be removed.
    #[serde(default)]
    pub finalized: bool,
}

/// A Kubernetes Event to record on the parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEvent {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: EventType,
    /// A short UpperCamelCase reason, e.g. `Scaled`.
    pub reason: String,
    /// A human-readable message.
    pub message: String,
}

/// The type of a Kubernetes Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_are_keyed_by_name_or_namespace_and_name_under_a_cluster_parent() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}});
        let node = json!({"metadata": {"name": "n"}});
        assert_eq!(object_key(&pod, Scope::Namespaced), "p");
        assert_eq!(object_key(&pod, Scope::Cluster), "ns/p");
        assert_eq!(object_key(&node, Scope::Cluster), "n");
        assert_eq!(kind_key("apps/v1", "Deployment"), "Deployment.apps/v1");
    }

    #[test]
    fn a_parent_is_namespaced_when_it_has_a_namespace() {
        let scope = |v| Scope::of_object(&v);
        assert_eq!(
            scope(json!({"metadata": {"namespace": "a"}})),
            Scope::Namespaced
        );
        assert_eq!(
            scope(json!({"metadata": {"namespace": ""}})),
            Scope::Cluster
        );
        assert_eq!(scope(json!({"metadata": {}})), Scope::Cluster);
    }
}
