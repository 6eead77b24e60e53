//! An in-memory copy of one resource type, indexed for the questions the controller asks.
//!
//! Objects are kept once, behind `Arc`, by namespace and name. Indexes answer the hot
//! questions without scanning: which objects a given owner UID *controls*, which live in a
//! namespace, and which carry a label (so a selector with `matchLabels` looks only at those).
//! Objects are [`Object`]s: JSON text plus the metadata the indexes need, never a tree.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use super::Object;

/// Where an object is: its namespace (`None` for cluster-scoped objects) and name. Shown as
/// `namespace/name`, or `name` alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjKey {
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

impl ObjKey {
    /// The object `name` in `namespace`.
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjKey {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        }
    }

    /// Its namespace, if it has one.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}

impl std::fmt::Display for ObjKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The UID in the object's controller owner reference, if any.
pub fn controller_uid(obj: &Object) -> Option<&str> {
    obj.controller().map(|o| o.uid.as_str())
}

/// One resource type's objects.
#[derive(Default)]
pub struct Cache {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    by_namespace: HashMap<Option<String>, HashMap<String, Arc<Object>>>,
    by_controller: HashMap<String, HashSet<ObjKey>>,
    by_label: HashMap<LabelKey, HashSet<String>>,
    len: usize,
    bytes: usize,
}

/// Namespace, label key and value.
type LabelKey = (Option<String>, String, String);

fn label_keys(obj: &Object) -> impl Iterator<Item = LabelKey> + '_ {
    obj.labels().iter().map(|(k, v)| {
        (
            obj.namespace().map(str::to_owned),
            k.to_owned(),
            v.to_owned(),
        )
    })
}

impl State {
    fn insert(&mut self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let key = obj.key();
        self.bytes += obj.heap_bytes();
        if let Some(uid) = controller_uid(&obj) {
            self.by_controller
                .entry(uid.to_string())
                .or_default()
                .insert(key.clone());
        }
        let ObjKey {
            namespace: ns,
            name,
        } = key;
        // Most updates (a pod's status) keep the labels: then the index is already right.
        let old = self
            .by_namespace
            .get(&ns)
            .and_then(|m| m.get(&name))
            .cloned();
        let relabelled = old.as_ref().is_none_or(|old| old.labels() != obj.labels());
        if relabelled {
            if let Some(old) = &old {
                self.unindex_labels(old);
            }
            for label in label_keys(&obj) {
                self.by_label.entry(label).or_default().insert(name.clone());
            }
        }
        let prev = self.by_namespace.entry(ns).or_default().insert(name, obj);
        match &prev {
            Some(old) => {
                self.bytes -= old.heap_bytes();
                self.unindex_owner_if_changed(old);
            }
            None => self.len += 1,
        }
        prev
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Arc<Object>> {
        let names = self.by_namespace.get_mut(&key.namespace)?;
        let old = names.remove(&key.name)?;
        if names.is_empty() {
            self.by_namespace.remove(&key.namespace);
        }
        self.len -= 1;
        self.bytes -= old.heap_bytes();
        if let Some(uid) = controller_uid(&old) {
            self.unindex(uid, key);
        }
        self.unindex_labels(&old);
        Some(old)
    }

    fn unindex_labels(&mut self, old: &Object) {
        let name = old.name();
        for label in label_keys(old) {
            if let Some(names) = self.by_label.get_mut(&label) {
                names.remove(name);
                if names.is_empty() {
                    self.by_label.remove(&label);
                }
            }
        }
    }

    // An update can change or drop the controller reference: clear the stale index entry.
    fn unindex_owner_if_changed(&mut self, old: &Object) {
        let key = old.key();
        let Some(old_uid) = controller_uid(old) else {
            return;
        };
        let current = self
            .by_namespace
            .get(&key.namespace)
            .and_then(|m| m.get(&key.name))
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
    pub fn apply(&self, obj: Arc<Object>) -> Option<Arc<Object>> {
        self.state.write().expect("cache lock").insert(obj)
    }

    /// Forgets an object; returns what was stored.
    pub fn delete(&self, key: &ObjKey) -> Option<Arc<Object>> {
        self.state.write().expect("cache lock").remove(key)
    }

    /// Replaces everything after a (re)list. Returns the objects that vanished.
    pub fn replace(&self, objects: Vec<Arc<Object>>) -> Vec<Arc<Object>> {
        let mut fresh = State::default();
        for obj in objects {
            fresh.insert(obj);
        }
        let mut state = self.state.write().expect("cache lock");
        let old = std::mem::replace(&mut *state, fresh);
        old.by_namespace
            .into_iter()
            .flat_map(|(ns, names)| names.into_iter().map(move |(n, o)| ((ns.clone(), n), o)))
            .filter(|((ns, name), _)| {
                !state
                    .by_namespace
                    .get(ns)
                    .is_some_and(|m| m.contains_key(name))
            })
            .map(|(_, o)| o)
            .collect()
    }

    /// One object by namespace and name.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<Object>> {
        let state = self.state.read().expect("cache lock");
        state
            .by_namespace
            .get(&namespace.map(str::to_string))
            .and_then(|m| m.get(name))
            .cloned()
    }

    /// The objects whose controller owner reference has this UID.
    pub fn controlled_by(&self, uid: &str) -> Vec<Arc<Object>> {
        let state = self.state.read().expect("cache lock");
        let Some(keys) = state.by_controller.get(uid) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| state.by_namespace.get(&k.namespace)?.get(&k.name).cloned())
            .collect()
    }

    /// The objects in one namespace, or in all of them for `None`, that pass `filter`.
    pub fn list(
        &self,
        namespace: Option<&str>,
        mut filter: impl FnMut(&Object) -> bool,
    ) -> Vec<Arc<Object>> {
        let state = self.state.read().expect("cache lock");
        let mut out = Vec::new();
        let mut scan = |names: &HashMap<String, Arc<Object>>| {
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

    /// The objects in one namespace (all of them for `None`) whose labels match `selector`.
    /// In a namespace, only the objects carrying the rarest of its `matchLabels` are tested.
    pub fn select(&self, namespace: Option<&str>, selector: &LabelSelector) -> Vec<Arc<Object>> {
        let Ok(parsed) = Selector::try_from(selector.clone()) else {
            return Vec::new();
        };
        let matches = |o: &Object| parsed.matches(&o.labels().to_map());
        let Some(ns) = namespace else {
            return self.list(None, matches);
        };
        let ns = Some(ns.to_owned());
        let state = self.state.read().expect("cache lock");
        let candidates = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| state.by_label.get(&(ns.clone(), k.clone(), v.clone())))
            .min_by_key(|names| names.map_or(0, HashSet::len));
        let Some(objects) = state.by_namespace.get(&ns) else {
            return Vec::new();
        };
        match candidates {
            // Some required label is on no object at all.
            Some(None) => Vec::new(),
            Some(Some(names)) => names
                .iter()
                .filter_map(|n| objects.get(n))
                .filter(|o| matches(o))
                .cloned()
                .collect(),
            None => objects.values().filter(|o| matches(o)).cloned().collect(),
        }
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.state.read().expect("cache lock").len
    }

    /// The heap bytes its objects take, roughly ([`Object::heap_bytes`] summed; the indexes
    /// are not counted).
    pub fn bytes(&self) -> usize {
        self.state.read().expect("cache lock").bytes
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(ns: &str, name: &str, owner: Option<&str>, labels: &[(&str, &str)]) -> Arc<Object> {
        let owners: Vec<_> = owner
            .map(|uid| json!({"apiVersion": "v1", "kind": "K", "name": "o", "uid": uid, "controller": true}))
            .into_iter()
            .collect();
        let labels: serde_json::Map<_, _> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        Arc::new(
            Object::from_value(&json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"namespace": ns, "name": name, "ownerReferences": owners, "labels": labels},
            }))
            .unwrap(),
        )
    }

    fn obj(ns: &str, name: &str, owner: Option<&str>) -> Arc<Object> {
        object(ns, name, owner, &[])
    }

    fn names(objs: Vec<Arc<Object>>) -> Vec<String> {
        let mut n: Vec<String> = objs.iter().map(|o| o.name().to_owned()).collect();
        n.sort();
        n
    }

    fn labelled(ns: &str, name: &str, labels: &[(&str, &str)]) -> Arc<Object> {
        object(ns, name, None, labels)
    }

    fn selector(match_labels: &[(&str, &str)], expr: Option<(&str, &str)>) -> LabelSelector {
        serde_json::from_value(json!({
            "matchLabels": match_labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "matchExpressions": expr.map(|(k, v)| vec![json!({"key": k, "operator": "In", "values": [v]})]).unwrap_or_default(),
        }))
        .unwrap()
    }

    #[test]
    fn select_uses_the_label_index_and_follows_changes() {
        let cache = Cache::default();
        cache.apply(labelled("a", "p1", &[("app", "mc"), ("cr", "x")]));
        cache.apply(labelled("a", "p2", &[("app", "mc"), ("cr", "y")]));
        cache.apply(labelled("b", "p3", &[("app", "mc"), ("cr", "x")]));
        cache.apply(labelled("a", "p4", &[("tier", "web")]));
        let x = selector(&[("app", "mc"), ("cr", "x")], None);
        assert_eq!(names(cache.select(Some("a"), &x)), ["p1"]);
        assert_eq!(names(cache.select(None, &x)), ["p1", "p3"]);
        assert!(
            cache
                .select(Some("a"), &selector(&[("cr", "z")], None))
                .is_empty()
        );
        // Expressions are still checked on the indexed candidates; no matchLabels scans.
        let mc_y = selector(&[("app", "mc")], Some(("cr", "y")));
        assert_eq!(names(cache.select(Some("a"), &mc_y)), ["p2"]);
        let web = selector(&[], Some(("tier", "web")));
        assert_eq!(names(cache.select(Some("a"), &web)), ["p4"]);
        // A relabelled object moves in the index; a deleted one leaves it.
        cache.apply(labelled("a", "p2", &[("app", "mc"), ("cr", "x")]));
        assert_eq!(names(cache.select(Some("a"), &x)), ["p1", "p2"]);
        assert!(cache.select(Some("a"), &mc_y).is_empty());
        // An update that keeps the labels keeps the object findable.
        cache.apply(labelled("a", "p1", &[("app", "mc"), ("cr", "x")]));
        assert_eq!(names(cache.select(Some("a"), &x)), ["p1", "p2"]);
        cache.delete(&ObjKey::new(Some("a"), "p1"));
        assert_eq!(names(cache.select(Some("a"), &x)), ["p2"]);
        let state = cache.state.read().unwrap();
        assert!(
            !state
                .by_label
                .contains_key(&(Some("a".into()), "cr".into(), "y".into()))
        );
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
        cache.delete(&ObjKey::new(Some("a"), "d1"));
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
        let expected: usize = ["p2", "p3"]
            .iter()
            .map(|n| cache.get(Some("b"), n).unwrap().heap_bytes())
            .sum();
        assert_eq!(cache.bytes(), expected);
        cache.apply(obj("b", "p2", Some("u")));
        cache.delete(&ObjKey::new(Some("b"), "p3"));
        assert_eq!(
            cache.bytes(),
            cache.get(Some("b"), "p2").unwrap().heap_bytes()
        );
    }
}
