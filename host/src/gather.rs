//! Sorts observed objects into a plugin's request: the children the parent controls and the
//! related objects its selectors match, per declared kind. The controller (over its watch
//! caches) and `wasmop render` (over files, with [`ObjectList`]) build requests with the same
//! [`request`].
//!
//! Shape of the maps: every declared child and related kind is present, keyed by
//! [`kind_key`] (`Deployment.apps/v1`), empty when nothing matched. Objects are keyed by name;
//! for a cluster-scoped parent by `namespace/name` (just `name` for cluster-scoped objects).
//! Related kinds declared metadata-only are cut to `apiVersion`, `kind` and `metadata`, and
//! `metadata.managedFields` is dropped from every object, the parent included.
//!
//! Objects come as whatever the caller holds ([`WireObject`]): the controller's cached
//! [`Object`]s, which the request then serialises as the texts they are, or `render`'s JSON
//! values. The request's JSON is the same either way.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use serde::Serialize;
use serde_json::{Map, Value};
use wasmop_contract::wire::{ByName, WireRequest, key_of, kind_key};
use wasmop_contract::{KindRef, Manifest, RelatedSelector};

use crate::kinds::Scope;
use crate::watch::Object;

/// What gathering needs of an observed object.
pub trait WireObject: Serialize + Sized {
    /// `metadata.name`.
    fn name(&self) -> &str;
    /// `metadata.namespace`.
    fn namespace(&self) -> Option<&str>;
    /// `metadata.uid`.
    fn uid(&self) -> Option<&str>;
    /// The keys of `metadata.labels`.
    fn label_keys(&self) -> Vec<&str>;
    /// The object as a plugin gets it: without `managedFields`; with `metadata_only`, only
    /// `apiVersion`, `kind` and `metadata`.
    fn cleaned(self, metadata_only: bool) -> Self;
}

impl WireObject for Value {
    fn name(&self) -> &str {
        str_at(self, "/metadata/name").unwrap_or_default()
    }
    fn namespace(&self) -> Option<&str> {
        str_at(self, "/metadata/namespace")
    }
    fn uid(&self) -> Option<&str> {
        str_at(self, "/metadata/uid")
    }
    fn label_keys(&self) -> Vec<&str> {
        self.pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|l| l.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }
    fn cleaned(self, metadata_only: bool) -> Self {
        clean(self, metadata_only)
    }
}

impl WireObject for Arc<Object> {
    fn name(&self) -> &str {
        Object::name(self)
    }
    fn namespace(&self) -> Option<&str> {
        Object::namespace(self)
    }
    fn uid(&self) -> Option<&str> {
        Object::uid(self)
    }
    fn label_keys(&self) -> Vec<&str> {
        self.labels().iter().map(|(k, _)| k).collect()
    }
    // Cached objects never hold managedFields; a metadata-only watch's are already cut.
    fn cleaned(self, metadata_only: bool) -> Self {
        if metadata_only && !self.is_metadata_only() {
            Arc::new(self.to_metadata_only())
        } else {
            self
        }
    }
}

/// Where a request's objects come from.
pub trait Observed<O> {
    /// Objects of `kind` whose *controller* ownerReference points at the parent UID.
    fn controlled(&self, kind: &KindRef, parent_uid: &str) -> Vec<O>;
    /// Objects of `kind` in `namespace` (None = all namespaces) whose labels match `selector`.
    fn selected(&self, kind: &KindRef, namespace: Option<&str>, selector: &LabelSelector)
    -> Vec<O>;
}

/// Builds the request for one reconcile of `parent`.
///
/// `selectors` are what the plugin's `related` returned for this parent; several selectors for
/// one kind are combined (union). Related objects are looked up in the parent's namespace, or
/// in all namespaces for a cluster-scoped parent.
pub fn request<O: WireObject + Clone>(
    manifest: &Manifest,
    parent: &O,
    parent_scope: Scope,
    selectors: &[RelatedSelector],
    observed: &dyn Observed<O>,
    settings: &Value,
    finalizing: bool,
) -> WireRequest<O> {
    let uid = parent.uid().unwrap_or_default();
    let namespace = match parent_scope {
        Scope::Namespaced => parent.namespace(),
        Scope::Cluster => None,
    };
    let key = |obj: &O| key_of(obj.name(), obj.namespace(), parent_scope);

    let mut children = BTreeMap::new();
    for kind in &manifest.children {
        let objects: ByName<O> = observed
            .controlled(kind, uid)
            .into_iter()
            // Owner references cannot cross namespaces, but a cache could still hold strays.
            .filter(|obj| namespace.is_none() || obj.namespace() == namespace)
            .map(|obj| (key(&obj), obj.cleaned(false)))
            .collect();
        children.insert(kind.key(), objects);
    }

    let mut related: BTreeMap<String, ByName<O>> = manifest
        .related
        .iter()
        .map(|r| (kind_key(&r.api_version, &r.kind), ByName::new()))
        .collect();
    for selector in selectors {
        let Some(declared) = manifest.related_kind(&selector.kind) else {
            continue;
        };
        let objects = observed.selected(&selector.kind, namespace, &selector.label_selector);
        let entry = related.entry(selector.kind.key()).or_default();
        for obj in objects {
            entry.insert(key(&obj), obj.cleaned(declared.metadata_only));
        }
    }

    WireRequest {
        parent: parent.clone().cleaned(false),
        children,
        related,
        finalizing,
        settings: settings.clone(),
        // Set by `stamp`, only for plugins that asked for the time.
        now: None,
    }
}

/// Puts the time into `request` if `manifest` asked for a clock: `now` rounded down to the
/// plugin's granularity, so the request stays the same until the next step.
pub fn stamp<O>(request: &mut WireRequest<O>, manifest: &Manifest, now: Timestamp) {
    request.now = manifest.clock_granularity().map(|step| {
        let step = i64::from(step);
        let seconds = now.as_second().div_euclid(step) * step;
        Timestamp::from_second(seconds)
            .expect("a time rounded down stays in range")
            .to_string()
    });
}

/// Whether `selector` matches `labels`. An invalid selector (an unknown operator, `In`
/// without values) matches nothing.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// The labels of a JSON object (string values only).
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Drops `managedFields`; with `metadata_only`, everything but apiVersion, kind and metadata.
fn clean(mut obj: Value, metadata_only: bool) -> Value {
    if metadata_only && let Value::Object(map) = &mut obj {
        let kept: Map<String, Value> = ["apiVersion", "kind", "metadata"]
            .into_iter()
            .filter_map(|k| Some((k.to_owned(), map.remove(k)?)))
            .collect();
        *map = kept;
    }
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    obj
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

/// Observed objects held in a list: what `wasmop render` reads from files.
///
/// Objects are matched by group and kind (any version, so hand-written files need not use
/// the served version). A child is controlled when one of its ownerReferences has
/// `controller: true` and the parent's UID. Files written by hand rarely carry UIDs, so
/// [`ObjectList::with_owner_fallback`] also accepts a controller reference naming the parent's
/// kind and name (render gives a parent without a UID a deterministic made-up one).
#[derive(Debug, Clone, Default)]
pub struct ObjectList {
    objects: Vec<Value>,
    fallback: Option<(KindRef, String)>,
}

impl ObjectList {
    /// A list of observed objects.
    pub fn new(objects: Vec<Value>) -> Self {
        Self {
            objects,
            fallback: None,
        }
    }

    /// Also treat controller references to this kind and name as pointing at the parent.
    #[must_use]
    pub fn with_owner_fallback(mut self, parent_kind: KindRef, parent_name: &str) -> Self {
        self.fallback = Some((parent_kind, parent_name.to_owned()));
        self
    }

    /// The objects.
    pub fn objects(&self) -> &[Value] {
        &self.objects
    }

    fn of_kind<'a>(&'a self, kind: &'a KindRef) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(move |obj| KindRef::of_object(obj).is_some_and(|k| k.same_resource(kind)))
    }

    fn is_controller_ref(&self, owner: &Value, parent_uid: &str) -> bool {
        if owner.get("controller").and_then(Value::as_bool) != Some(true) {
            return false;
        }
        if !parent_uid.is_empty() && str_at(owner, "/uid") == Some(parent_uid) {
            return true;
        }
        self.fallback.as_ref().is_some_and(|(kind, name)| {
            KindRef::of_object(owner).is_some_and(|k| k.same_resource(kind))
                && str_at(owner, "/name") == Some(name.as_str())
        })
    }
}

impl Observed<Value> for ObjectList {
    fn controlled(&self, kind: &KindRef, parent_uid: &str) -> Vec<Value> {
        self.of_kind(kind)
            .filter(|obj| {
                obj.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| self.is_controller_ref(r, parent_uid)))
            })
            .cloned()
            .collect()
    }

    fn selected(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Vec<Value> {
        let Ok(selector) = Selector::try_from(selector.clone()) else {
            return Vec::new();
        };
        self.of_kind(kind)
            .filter(|obj| namespace.is_none() || str_at(obj, "/metadata/namespace") == namespace)
            .filter(|obj| selector.matches(&labels_of(obj)))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn manifest() -> Manifest {
        crate::fixtures::memcached_manifest()
    }

    #[test]
    fn only_a_plugin_with_a_clock_gets_the_time_rounded_down_to_its_step() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let mut request = WireRequest::<Value>::default();
        stamp(&mut request, &manifest(), at("2026-12-01T12:48:31Z"));
        assert_eq!(request.now, None);
        assert!(
            !serde_json::to_string(&request).unwrap().contains("now"),
            "absent from the wire, so other plugins' requests are unchanged"
        );

        let hourly = Manifest {
            clock_seconds: Some(3600),
            ..manifest()
        };
        stamp(&mut request, &hourly, at("2026-12-01T12:48:31Z"));
        assert_eq!(request.now.as_deref(), Some("2026-12-01T12:00:00Z"));
        let mut later = WireRequest::<Value>::default();
        stamp(&mut later, &hourly, at("2026-12-01T12:59:59Z"));
        assert_eq!(later, request, "the same request within a step");

        // Finer than a minute is not given.
        let eager = Manifest {
            clock_seconds: Some(1),
            ..manifest()
        };
        stamp(&mut request, &eager, at("2026-12-01T12:48:31Z"));
        assert_eq!(request.now.as_deref(), Some("2026-12-01T12:48:00Z"));
    }

    fn parent() -> Value {
        json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {"name": "mc", "namespace": "ns", "uid": "u-1", "managedFields": [{}]},
            "spec": {"size": 3}
        })
    }

    fn owned(name: &str, uid: &str, controller: bool) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ns", "managedFields": [{}],
                "ownerReferences": [{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                    "name": "mc", "uid": uid, "controller": controller}]},
            "spec": {"replicas": 3}
        })
    }

    fn pod(name: &str, ns: &str, app: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"containers": []}, "status": {"phase": "Running"}
        })
    }

    fn app_selector(app: &str) -> RelatedSelector {
        RelatedSelector {
            kind: KindRef::new("v1", "Pod"),
            label_selector: LabelSelector {
                match_labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..LabelSelector::default()
            },
        }
    }

    #[test]
    fn children_related_and_empty_kinds() {
        let observed = ObjectList::new(vec![
            owned("mc", "u-1", true),
            owned("not-controller", "u-1", false),
            owned("other-parent", "u-2", true),
            pod("p1", "ns", "mc"),
            pod("p2", "ns", "other"),
            pod("p3", "elsewhere", "mc"),
        ]);
        let req = request(
            &manifest(),
            &parent(),
            Scope::Namespaced,
            &[app_selector("mc")],
            &observed,
            &json!({"x": 1}),
            true,
        );
        assert!(req.parent["metadata"].get("managedFields").is_none());
        let deployments = &req.children["Deployment.apps/v1"];
        assert_eq!(deployments.keys().collect::<Vec<_>>(), ["mc"]);
        assert!(deployments["mc"]["metadata"].get("managedFields").is_none());
        assert!(req.children["Service.v1"].is_empty());
        let pods = &req.related["Pod.v1"];
        assert_eq!(pods.keys().collect::<Vec<_>>(), ["p1"]);
        assert!(
            pods["p1"].get("spec").is_none(),
            "metadata-only kinds are trimmed"
        );
        assert_eq!(pods["p1"]["kind"], "Pod");
        assert!(req.related["ConfigMap.v1"].is_empty());
        assert!(req.finalizing);
        assert_eq!(req.settings, json!({"x": 1}));
    }

    #[test]
    fn cluster_scoped_parent_keys_by_namespace() {
        let observed = ObjectList::new(vec![pod("p1", "a", "mc"), pod("p1", "b", "mc")]);
        let mut parent = parent();
        parent["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("namespace");
        let req = request(
            &manifest(),
            &parent,
            Scope::Cluster,
            &[app_selector("mc")],
            &observed,
            &Value::Null,
            false,
        );
        assert_eq!(
            req.related["Pod.v1"].keys().collect::<Vec<_>>(),
            ["a/p1", "b/p1"]
        );
    }

    #[test]
    fn owner_fallback_by_kind_and_name() {
        let list = ObjectList::new(vec![owned("mc", "", true)]);
        let kind = KindRef::new("apps/v1", "Deployment");
        assert!(list.controlled(&kind, "fake-uid").is_empty());
        let list = list.with_owner_fallback(
            KindRef::new("cache.example.com/v1alpha1", "Memcached"),
            "mc",
        );
        assert_eq!(list.controlled(&kind, "fake-uid").len(), 1);
    }

    #[test]
    fn selectors() {
        let labels: BTreeMap<String, String> = [
            ("app".to_owned(), "mc".to_owned()),
            ("tier".to_owned(), "cache".to_owned()),
        ]
        .into();
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "mc"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["cache", "db"]},
                                 {"key": "legacy", "operator": "DoesNotExist"}]
        }))
        .unwrap();
        assert!(selector_matches(&sel, &labels));
        assert!(
            selector_matches(&LabelSelector::default(), &labels),
            "empty selects all"
        );
        let bad: LabelSelector = serde_json::from_value(json!({
            "matchExpressions": [{"key": "tier", "operator": "Near"}]
        }))
        .unwrap();
        assert!(!selector_matches(&bad, &labels));
        let other: LabelSelector =
            serde_json::from_value(json!({"matchLabels": {"app": "db"}})).unwrap();
        assert!(!selector_matches(&other, &labels));
    }
}
