//! Triggers: which parents a watch event concerns, and why.
//!
//! A parent's own change concerns it (unless only its status moved: see [`fingerprint`]); a
//! child's concerns its controller owner of the parent kind ([`child_owner`]); a related
//! object's concerns the parents whose last reconcile asked for a selector it matches
//! ([`super::related::RelatedIndex`]).

use super::Shared;
use super::queue::Reason;
use crate::kinds::{self, ResolvedKind};
use crate::watch::{Change, ObjKey, Object};

/// What a watched kind is to the controller.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    /// The parent kind.
    Parent,
    /// The child kind at this index of `kinds.all_children()`.
    Child(usize),
    /// The related kind at this index of `kinds.related`.
    Related(usize),
}

/// What a change asks of the controller.
#[derive(Debug, PartialEq, Eq)]
pub enum Trigger {
    /// A parent is as this fingerprint says.
    Parent(ObjKey, u64),
    /// A parent was deleted.
    ParentGone(ObjKey),
    /// These parents' world moved (after the debounce).
    Touched(Vec<ObjKey>, Reason),
}

/// What `change`, of an object of the kind in `role`, asks of the controller of `shared`.
pub fn triggered(shared: &Shared, role: Role, change: &Change) -> Trigger {
    let obj = change.object();
    match (role, change) {
        (Role::Parent, Change::Applied(o)) => Trigger::Parent(o.key(), fingerprint(o)),
        (Role::Parent, Change::Deleted(o)) => Trigger::ParentGone(o.key()),
        (Role::Child(i), _) => {
            let parents = child_owner(&shared.kinds.parent, obj).into_iter().collect();
            let what = describe(&shared.child_kinds[i].kind.kind, obj);
            Trigger::Touched(parents, Reason::ChildChanged(what))
        }
        (Role::Related(i), _) => {
            let parents = shared.related_parents(i, obj);
            let what = describe(&shared.kinds.related[i].0.kind.kind, obj);
            Trigger::Touched(parents, Reason::RelatedChanged(what))
        }
    }
}

/// The parent a child belongs to: the namespace and name of its controller owner of the
/// parent kind (same group and kind, any version).
pub fn child_owner(parent: &ResolvedKind, obj: &Object) -> Option<ObjKey> {
    let (group, _) = kinds::split_api_version(&parent.kind.api_version);
    let owner = obj.controller().filter(|o| {
        o.kind == parent.kind.kind && kinds::split_api_version(&o.api_version).0 == group
    })?;
    let ns = obj.namespace().filter(|_| parent.namespaced);
    Some(ObjKey::new(ns, &owner.name))
}

fn describe(kind: &str, obj: &Object) -> String {
    format!("{kind} {}", obj.key())
}

/// Everything of a parent that a reconcile depends on, except its status.
pub fn fingerprint(obj: &Object) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    obj.uid().hash(&mut h);
    obj.generation().hash(&mut h);
    obj.labels().hash(&mut h);
    obj.metadata().annotations.hash(&mut h);
    obj.finalizers().hash(&mut h);
    obj.is_deleting().hash(&mut h);
    // Kinds without a status subresource bump no generation on spec changes.
    if obj.generation().is_none() {
        let mut body = obj.value();
        if let Some(map) = body.as_object_mut() {
            map.remove("metadata");
        }
        body.to_string().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;
    use crate::fixtures;

    fn owned_by(obj: &Object, api_version: &str, kind: &str, controller: bool) -> Object {
        let owner = OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "cache".into(),
            uid: "u1".into(),
            controller: Some(controller),
            ..Default::default()
        };
        fixtures::pod(
            obj.namespace(),
            obj.name(),
            serde_json::json!({"ownerReferences": [owner]}),
        )
    }

    #[test]
    fn a_child_maps_to_its_controller_owner_of_the_parent_kind() {
        let parent = fixtures::memcached_kind(true);
        let child = fixtures::pod(Some("ns"), "cache-abc", serde_json::json!({}));
        let key = ObjKey::new(Some("ns"), "cache");
        let any_version = owned_by(&child, "cache.example.com/v1", "Memcached", true);
        assert_eq!(child_owner(&parent, &any_version), Some(key));
        let not_controller = owned_by(&child, "cache.example.com/v1alpha1", "Memcached", false);
        assert_eq!(child_owner(&parent, &not_controller), None);
        let other_group = owned_by(&child, "other.example.com/v1alpha1", "Memcached", true);
        assert_eq!(child_owner(&parent, &other_group), None);
        assert_eq!(child_owner(&parent, &child), None, "no owner");
        // A cluster-scoped parent is keyed without a namespace.
        let cluster = owned_by(&child, "cache.example.com/v1alpha1", "Memcached", true);
        assert_eq!(
            child_owner(&fixtures::memcached_kind(false), &cluster),
            Some(ObjKey::new(None, "cache"))
        );
    }

    #[test]
    fn only_what_a_reconcile_reads_changes_the_fingerprint() {
        let meta = |labels: serde_json::Value, status: &str| {
            let mut value = serde_json::json!({
                "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 2, "labels": labels},
                "spec": {"size": 3}, "status": {"nodes": [status]},
            });
            value["metadata"]["resourceVersion"] = status.into();
            Object::from_value(&value).unwrap()
        };
        let base = fingerprint(&meta(serde_json::json!({}), "a"));
        assert_eq!(
            base,
            fingerprint(&meta(serde_json::json!({}), "b")),
            "status only"
        );
        assert_ne!(
            base,
            fingerprint(&meta(serde_json::json!({"x": "y"}), "a")),
            "a label"
        );
    }
}
