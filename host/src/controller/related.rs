//! Which parents a related object concerns: the selectors each parent's last `related` call
//! returned, indexed by a label each requires.
//!
//! A pod changes several times on its way up, and each change must find the parents whose
//! selectors match it. Testing every parent of its namespace made that linear in the parents
//! per namespace (a thousand pods of a thousand parents: a million matches). Most selectors
//! require labels (`matchLabels`); each is filed under one of them, so an object is tested
//! only against the selectors filed under one of its own labels, and the few without
//! `matchLabels` (expressions only).

use std::collections::{BTreeSet, HashMap};

use kube::core::{Selector, SelectorExt};
use wasmop_contract::RelatedSelector;

use crate::watch::{ObjKey, Object};

/// What `related(parent)` returned for one parent, and for which version of both.
pub struct Related {
    /// The plugin's digest.
    pub digest: String,
    /// [`super::fingerprint`] of the parent.
    pub fingerprint: u64,
    /// The selectors as the plugin returned them.
    pub selectors: Vec<RelatedSelector>,
    /// The same, parsed, in the same order, with the index of their kind in `kinds.related`.
    pub parsed: Vec<(usize, Selector)>,
}

/// Where a selector is filed: the related kind's index, the namespace its objects are looked
/// for in (`None` for a cluster-scoped parent, whose selectors span every namespace), and one
/// label it requires.
type LabelKey = (usize, Option<String>, String, String);

/// Every parent's related selectors.
pub struct RelatedIndex {
    parent_namespaced: bool,
    by_parent: HashMap<ObjKey, Related>,
    by_label: HashMap<LabelKey, BTreeSet<ObjKey>>,
    // Selectors that require no label, by kind and namespace.
    unlabelled: HashMap<(usize, Option<String>), BTreeSet<ObjKey>>,
}

impl RelatedIndex {
    /// An empty index for parents of a namespaced kind (their selectors see their own
    /// namespace) or a cluster-scoped one (every namespace).
    pub fn new(parent_namespaced: bool) -> Self {
        RelatedIndex {
            parent_namespaced,
            by_parent: HashMap::new(),
            by_label: HashMap::new(),
            unlabelled: HashMap::new(),
        }
    }

    /// The selectors kept for `parent`.
    pub fn get(&self, parent: &ObjKey) -> Option<&Related> {
        self.by_parent.get(parent)
    }

    /// Keeps `related` for `parent`, replacing what was kept.
    pub fn insert(&mut self, parent: ObjKey, related: Related) {
        self.remove(&parent);
        let ns = file_ns(&parent, self.parent_namespaced);
        for (kind, label) in filing(&related) {
            let filed = match label {
                Some((k, v)) => self.by_label.entry((kind, ns.clone(), k, v)).or_default(),
                None => self.unlabelled.entry((kind, ns.clone())).or_default(),
            };
            filed.insert(parent.clone());
        }
        self.by_parent.insert(parent, related);
    }

    /// Forgets `parent`'s selectors.
    pub fn remove(&mut self, parent: &ObjKey) -> Option<Related> {
        let related = self.by_parent.remove(parent)?;
        let ns = file_ns(parent, self.parent_namespaced);
        for (kind, file) in filing(&related) {
            match file {
                Some((k, v)) => {
                    let key = (kind, ns.clone(), k, v);
                    if let Some(set) = self.by_label.get_mut(&key) {
                        set.remove(parent);
                        if set.is_empty() {
                            self.by_label.remove(&key);
                        }
                    }
                }
                None => {
                    let key = (kind, ns.clone());
                    if let Some(set) = self.unlabelled.get_mut(&key) {
                        set.remove(parent);
                        if set.is_empty() {
                            self.unlabelled.remove(&key);
                        }
                    }
                }
            }
        }
        Some(related)
    }

    /// The parents whose selectors for related kind `kind` match `obj`, in key order: only
    /// those of its namespace, for a namespaced parent kind.
    pub fn parents_of(&self, kind: usize, obj: &Object) -> Vec<ObjKey> {
        let ns = self
            .parent_namespaced
            .then(|| obj.namespace().map(str::to_owned))
            .flatten();
        let mut candidates: BTreeSet<&ObjKey> = obj
            .labels()
            .iter()
            .filter_map(|(k, v)| {
                self.by_label
                    .get(&(kind, ns.clone(), k.to_owned(), v.to_owned()))
            })
            .flatten()
            .collect();
        candidates.extend(self.unlabelled.get(&(kind, ns)).into_iter().flatten());
        if candidates.is_empty() {
            return Vec::new();
        }
        let labels = obj.labels().to_map();
        candidates
            .into_iter()
            .filter(|parent| {
                self.by_parent.get(*parent).is_some_and(|r| {
                    r.parsed
                        .iter()
                        .any(|(k, s)| *k == kind && s.matches(&labels))
                })
            })
            .cloned()
            .collect()
    }
}

/// Where each of `related`'s selectors is filed: its kind, and the first label its
/// `matchLabels` requires, if any.
fn filing(related: &Related) -> Vec<(usize, Option<(String, String)>)> {
    related
        .parsed
        .iter()
        .zip(&related.selectors)
        .map(|((kind, _), selector)| {
            let label = selector
                .label_selector
                .match_labels
                .as_ref()
                .and_then(|m| m.iter().next())
                .map(|(k, v)| (k.clone(), v.clone()));
            (*kind, label)
        })
        .collect()
}

fn file_ns(parent: &ObjKey, parent_namespaced: bool) -> Option<String> {
    if parent_namespaced {
        parent.namespace.clone()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use serde_json::json;
    use wasmop_contract::KindRef;

    use super::*;

    fn selector(app: Option<&str>, expression: Option<&str>) -> RelatedSelector {
        RelatedSelector {
            kind: KindRef::new("v1", "Pod"),
            label_selector: serde_json::from_value(json!({
                "matchLabels": app.map(|a| json!({"app": a})).unwrap_or(json!({})),
                "matchExpressions": expression
                    .map(|t| json!([{"key": "tier", "operator": "In", "values": [t]}]))
                    .unwrap_or(json!([])),
            }))
            .unwrap(),
        }
    }

    fn related(selectors: Vec<(usize, RelatedSelector)>) -> Related {
        Related {
            digest: "sha256:00".into(),
            fingerprint: 0,
            parsed: selectors
                .iter()
                .map(|(k, s)| {
                    let parsed: Selector =
                        LabelSelector::clone(&s.label_selector).try_into().unwrap();
                    (*k, parsed)
                })
                .collect(),
            selectors: selectors.into_iter().map(|(_, s)| s).collect(),
        }
    }

    fn pod(ns: &str, labels: serde_json::Value) -> Object {
        Object::from_value(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": ns, "labels": labels}}))
        .unwrap()
    }

    fn key(ns: &str, name: &str) -> ObjKey {
        ObjKey::new(Some(ns), name)
    }

    fn four_parents(namespaced: bool) -> RelatedIndex {
        let mut index = RelatedIndex::new(namespaced);
        index.insert(
            key("a", "one"),
            related(vec![(0, selector(Some("web"), None))]),
        );
        index.insert(
            key("a", "two"),
            related(vec![(0, selector(Some("db"), None))]),
        );
        index.insert(
            key("a", "three"),
            related(vec![(1, selector(Some("web"), None))]),
        );
        index.insert(
            key("b", "four"),
            related(vec![(0, selector(Some("web"), None))]),
        );
        // Expressions only: no label to file it under.
        index.insert(
            key("a", "five"),
            related(vec![(0, selector(None, Some("cache")))]),
        );
        index
    }

    #[test]
    fn a_related_change_reaches_only_the_parents_whose_selectors_match_in_its_namespace() {
        let index = four_parents(true);
        let web = pod("a", json!({"app": "web"}));
        assert_eq!(index.parents_of(0, &web), vec![key("a", "one")]);
        assert_eq!(index.parents_of(1, &web), vec![key("a", "three")]);
        let cache = pod("a", json!({"app": "web", "tier": "cache"}));
        assert_eq!(
            index.parents_of(0, &cache),
            vec![key("a", "five"), key("a", "one")]
        );
        assert!(index.parents_of(0, &pod("a", json!({}))).is_empty());
        assert_eq!(
            index.parents_of(0, &pod("b", json!({"app": "web"}))),
            vec![key("b", "four")]
        );
        // Cluster-scoped parents see every namespace.
        let index = four_parents(false);
        assert_eq!(
            index.parents_of(0, &pod("a", json!({"app": "web"}))),
            vec![key("a", "one"), key("b", "four")]
        );
    }

    #[test]
    fn a_replaced_or_removed_selector_no_longer_reaches_its_parent() {
        let mut index = four_parents(true);
        let web = pod("a", json!({"app": "web"}));
        index.insert(
            key("a", "one"),
            related(vec![(0, selector(Some("db"), None))]),
        );
        assert!(index.parents_of(0, &web).is_empty());
        assert_eq!(
            index.parents_of(0, &pod("a", json!({"app": "db"}))),
            vec![key("a", "one"), key("a", "two")]
        );
        index.remove(&key("a", "five"));
        assert!(
            index
                .parents_of(0, &pod("a", json!({"tier": "cache"})))
                .is_empty()
        );
        index.remove(&key("a", "one"));
        index.remove(&key("a", "two"));
        index.remove(&key("a", "three"));
        index.remove(&key("b", "four"));
        assert!(index.by_label.is_empty() && index.unlabelled.is_empty());
        assert!(index.get(&key("a", "one")).is_none());
    }
}
