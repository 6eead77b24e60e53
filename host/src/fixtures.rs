//! Objects the unit tests share: the Memcached kinds and manifest, pods and Deployments.

use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use wasmop_contract::{KindRef, Manifest, RelatedKind};

use crate::kinds::ResolvedKind;
use crate::watch::Object;

/// Bytes gzip cannot shrink.
pub use test_artifacts::noise;

/// The Memcached parent kind, resolved, namespaced or not.
pub fn memcached_kind(namespaced: bool) -> ResolvedKind {
    let gvk = GroupVersionKind::gvk("cache.example.com", "v1alpha1", "Memcached");
    ResolvedKind {
        kind: KindRef::new("cache.example.com/v1alpha1", "Memcached"),
        resource: ApiResource::from_gvk_with_plural(&gvk, "memcacheds"),
        namespaced,
    }
}

/// A Memcached-shaped manifest: Deployments and Services as children, Pods (metadata only)
/// and ConfigMaps as related kinds.
pub fn memcached_manifest() -> Manifest {
    Manifest {
        name: "memcached".into(),
        version: "1".into(),
        parent: KindRef::new("cache.example.com/v1alpha1", "Memcached"),
        children: vec![
            KindRef::new("apps/v1", "Deployment"),
            KindRef::new("v1", "Service"),
        ],
        related: vec![
            RelatedKind {
                api_version: "v1".into(),
                kind: "Pod".into(),
                metadata_only: true,
            },
            RelatedKind {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                metadata_only: false,
            },
        ],
        finalizer: false,
        clock_seconds: None,
    }
}

/// A manifest named `name` over a parent kind `Thing` and nothing else.
pub fn bare_manifest(name: &str, finalizer: bool) -> Manifest {
    Manifest {
        name: name.into(),
        version: "1".into(),
        parent: KindRef::new("x.io/v1", "Thing"),
        children: Vec::new(),
        related: Vec::new(),
        finalizer,
        clock_seconds: None,
    }
}

/// How `wasmop rbac` names and binds by default: the host in `wasmop-system` as `wasmop`,
/// every namespace.
pub fn rbac_options() -> crate::plugin::rbac::Options {
    crate::plugin::rbac::Options {
        configmap: None,
        name: None,
        namespace: "wasmop-system".into(),
        service_account: "wasmop".into(),
        watch_namespace: None,
        plurals: Vec::new(),
    }
}

/// A pod named `name` in `ns` (none: cluster-scoped, for tests of keys) with `meta` as the
/// rest of its metadata.
pub fn pod(ns: Option<&str>, name: &str, meta: Value) -> Object {
    let mut value = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta});
    value["metadata"]["name"] = name.into();
    if let Some(ns) = ns {
        value["metadata"]["namespace"] = ns.into();
    }
    Object::from_value(&value).expect("a pod parses")
}
