//! An in-memory copy of one resource type, indexed for the questions the controller asks.
//!
//! Objects are kept once, behind `Arc`, by namespace and name. Two indexes answer the hot
//! questions without scanning: which objects a given owner UID *controls*, and which objects
//! live in a namespace. `managedFields` never reach the cache.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use kube::api::DynamicObject;

/// Namespace (`None` for cluster-scoped objects) and name.
pub type ObjKey = (Option<String>, String);

/// The key of an object.
pub fn key_of(obj: &DynamicObject) -> ObjKey {
    (
        obj.metadata.namespace.clone(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// The UID in the object's controller owner reference, if any.
pub fn controller_uid(obj: &DynamicObject) -> Option<&str> {
    obj.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// One resource type's objects.
#[derive(Default)]
pub struct Cache {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    by_namespace: HashMap<Option<String>, HashMap<String, Arc<DynamicObject>>>,
    by_controller: HashMap<String, HashSet<ObjKey>>,
    len: usize,
}

impl State {
    fn insert(&mut self, obj: Arc<DynamicObject>) -> Option<Arc<DynamicObject>> {
        let (ns, name) = key_of(&obj);
        if let Some(uid) = controller_uid(&obj) {
            self.by_controller
                .entry(uid.to_string())
                .or_default()
                .insert((ns.clone(), name.clone()));
        }
        let prev = self.by_namespace.entry(ns).or_default().insert(name, obj);
        match &prev {
            Some(old) => self.unindex_owner_if_changed(old),
            None => self.len += 1,
        }
        prev
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Arc<DynamicObject>> {
        let names = self.by_namespace.get_mut(&key.0)?;
        let old = names.remove(&key.1)?;
        if names.is_empty() {
            self.by_namespace.remove(&key.0);
        }
        self.len -= 1;
        if let Some(uid) = controller_uid(&old) {
            self.unindex(uid, key);
        }
        Some(old)
    }

    // An update can change or drop the controller reference: clear the stale index entry.
    fn unindex_owner_if_changed(&mut self, old: &DynamicObject) {
        let key = key_of(old);
        let Some(old_uid) = controller_uid(old) else {
            return;
        };
        let current = self
            .by_namespace
            .get(&key.0)
            .and_then(|m| m.get(&key.1))
            .and_then(|o| controller_uid(o));
        if current != Some(old_uid) {
            let uid = old_uid.to_string();
            self.unindex(&uid, &key);
        }
    }

    fn unindex(&mut self, uid: &str, key: &ObjKey) {
        if let Some(keys) = self.by_controller.get_mut(uid) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_controller.remove(uid);
            }
        }
    }
}

impl Cache {
    /// Stores or replaces an object; returns the previous version.
    pub fn apply(&self, obj: Arc<DynamicObject>) -> Option<Arc<DynamicObject>> {
        self.state.write().expect("cache lock").insert(obj)
    }

    /// Forgets an object; returns what was stored.
    pub fn delete(&self, key: &ObjKey) -> Option<Arc<DynamicObject>> {
        self.state.write().expect("cache lock").remove(key)
    }

    /// Replaces everything after a (re)list. Returns the objects that vanished.
    pub fn replace(&self, objects: Vec<Arc<DynamicObject>>) -> Vec<Arc<DynamicObject>> {
        let mut fresh = State::default();
        for obj in objects {
            fresh.insert(obj);
        }
        let mut state = self.state.write().expect("cache lock");
        let old = std::mem::replace(&mut *state, fresh);
        old.by_namespace
            .into_iter()
            .flat_map(|(ns, names)| names.into_iter().map(move |(n, o)| ((ns.clone(), n), o)))
            .filter(|(key, _)| {
                !state
                    .by_namespace
                    .get(&key.0)
                    .is_some_and(|m| m.contains_key(&key.1))
            })
            .map(|(_, o)| o)
            .collect()
    }

    /// One object by namespace and name.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>> {
        let state = self.state.read().expect("cache lock");
        state
            .by_namespace
            .get(&namespace.map(str::to_string))
            .and_then(|m| m.get(name))
            .cloned()
    }

    /// The objects whose controller owner reference has this UID.
    pub fn controlled_by(&self, uid: &str) -> Vec<Arc<DynamicObject>> {
        let state = self.state.read().expect("cache lock");
        let Some(keys) = state.by_controller.get(uid) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|(ns, name)| state.by_namespace.get(ns)?.get(name).cloned())
            .collect()
    }

    /// The objects in one namespace, or in all of them for `None`, that pass `filter`.
    pub fn list(
        &self,
        namespace: Option<&str>,
        mut filter: impl FnMut(&DynamicObject) -> bool,
    ) -> Vec<Arc<DynamicObject>> {
        let state = self.state.read().expect("cache lock");
        let mut out = Vec::new();
        let mut scan = |names: &HashMap<String, Arc<DynamicObject>>| {
            out.extend(names.values().filter(|o| filter(o)).cloned());
        };
        match namespace {
            Some(ns) => {
                if let Some(names) = state.by_namespace.get(&Some(ns.to_string())) {
                    scan(names);
                }
            }
            None => state.by_namespace.values().for_each(scan),
        }
        out
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.state.read().expect("cache lock").len
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use serde_json::json;

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn obj(ns: &str, name: &str, owner: Option<&str>) -> Arc<DynamicObject> {
        Arc::new(DynamicObject {
            types: None,
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                owner_references: owner.map(|uid| {
                    vec![OwnerReference {
                        uid: uid.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            data: json!({}),
        })
    }

    fn names(objs: Vec<Arc<DynamicObject>>) -> Vec<String> {
        let mut n: Vec<String> = objs
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn owner_index_follows_updates_and_deletes() {
        let cache = Cache::default();
        cache.apply(obj("a", "d1", Some("u1")));
        cache.apply(obj("a", "d2", Some("u1")));
        cache.apply(obj("b", "d3", Some("u2")));
        assert_eq!(names(cache.controlled_by("u1")), ["d1", "d2"]);
        // d2 changes hands, d1 is deleted.
        cache.apply(obj("a", "d2", Some("u2")));
        cache.delete(&(Some("a".into()), "d1".into()));
        assert!(cache.controlled_by("u1").is_empty());
        assert_eq!(names(cache.controlled_by("u2")), ["d2", "d3"]);
        // Losing the controller reference drops it from the index.
        cache.apply(obj("a", "d2", None));
        assert_eq!(names(cache.controlled_by("u2")), ["d3"]);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn namespaces_and_relist() {
        let cache = Cache::default();
        cache.apply(obj("a", "p1", None));
        cache.apply(obj("b", "p2", None));
        assert_eq!(names(cache.list(Some("a"), |_| true)), ["p1"]);
        assert_eq!(names(cache.list(None, |_| true)), ["p1", "p2"]);
        let gone = cache.replace(vec![obj("b", "p2", None), obj("b", "p3", Some("u"))]);
        assert_eq!(names(gone), ["p1"]);
        assert!(cache.get(Some("a"), "p1").is_none());
        assert_eq!(names(cache.controlled_by("u")), ["p3"]);
        assert_eq!(cache.len(), 2);
    }
}
