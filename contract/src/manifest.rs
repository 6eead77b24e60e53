//! What a plugin declares about itself ([`Manifest`]), and which related objects it wants for
//! one parent ([`RelatedSelector`]).
//!
//! These mirror the `plugin-manifest`, `kind-ref`, `related-kind` and `related-selector`
//! records of `wit/plugin.wit`; each side converts at its edge, so plugins, their native tests
//! and the host's stages never touch generated bindings.
//!
//! A manifest is read once at load. Its name becomes the field manager `wasmop/<name>` and the
//! finalizer `wasmop.io/<name>`, hence the DNS-1123 label rule; kinds are compared by group and
//! kind (two versions of one kind are one resource).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::Resource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use crate::names::{is_api_version, is_dns1123_label, is_kind_name};
use crate::wire::kind_key;

/// A Kubernetes kind: `apiVersion` (`group/version`, or `version` for the core group) and `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindRef {
    /// E.g. `apps/v1`.
    pub api_version: String,
    /// E.g. `Deployment`.
    pub kind: String,
}

impl KindRef {
    /// A kind by name, for types without a Rust definition.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// The kind of a k8s-openapi type (or any type implementing [`Resource`]).
    pub fn of<K: Resource>() -> Self {
        Self::new(K::API_VERSION, K::KIND)
    }

    /// The kind of a JSON object (`apiVersion` and `kind`), if both are strings.
    pub fn of_object(obj: &serde_json::Value) -> Option<Self> {
        Some(Self::new(
            obj.get("apiVersion")?.as_str()?,
            obj.get("kind")?.as_str()?,
        ))
    }

    /// The key of this kind in request maps: `Deployment.apps/v1`.
    pub fn key(&self) -> String {
        kind_key(&self.api_version, &self.kind)
    }

    /// The API group; empty for the core group.
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or("", |(group, _)| group)
    }

    /// The version, e.g. `v1`.
    pub fn version(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or(self.api_version.as_str(), |(_, version)| version)
    }

    /// Whether `other` is the same resource (same group and kind, any version). A kind that
    /// Kubernetes serves under two groups is one resource: `v1 Event` and
    /// `events.k8s.io/v1 Event` are the same objects.
    pub fn same_resource(&self, other: &KindRef) -> bool {
        self.stored_group() == other.stored_group() && self.kind == other.kind
    }

    /// The group the API server stores this kind under, aliases folded.
    fn stored_group(&self) -> &str {
        match (self.group(), self.kind.as_str()) {
            ("events.k8s.io", "Event") => "",
            (group, _) => group,
        }
    }

    /// Whether this is an Event, of either group: never a parent kind, since the host writes
    /// Events about every reconcile and a plugin would be fed its own output.
    pub fn is_event(&self) -> bool {
        self.stored_group().is_empty() && self.kind == "Event"
    }
}

impl fmt::Display for KindRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)
    }
}

/// A kind the plugin reads but does not own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelatedKind {
    /// `group/version`.
    pub api_version: String,
    /// The kind.
    pub kind: String,
    /// Whether the host watches and hands over only `apiVersion`, `kind` and `metadata`.
    #[serde(default)]
    pub metadata_only: bool,
}

impl RelatedKind {
    /// The kind without the metadata-only flag.
    pub fn kind_ref(&self) -> KindRef {
        KindRef::new(&self.api_version, &self.kind)
    }
}

/// Who the plugin is and what it works on; read once when the host loads the plugin.
///
/// ```
/// use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
/// use wasmop_contract::Manifest;
///
/// let m = Manifest::new("memcached", "0.1.0")
///     .parent_raw("cache.example.com/v1alpha1", "Memcached")
///     .child::<Deployment>()
///     .related_meta::<Pod>();
/// assert_eq!(m.children[0].kind, "Deployment");
/// assert!(m.related[0].metadata_only);
/// assert!(!m.finalizer);
/// m.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Unique per host: it names the field manager (`wasmop/<name>`) and the finalizer. Keep it
    /// stable across versions, or the host treats the new build as a different plugin.
    pub name: String,
    /// The plugin's own version, shown in logs, Events and metrics.
    pub version: String,
    /// The kind the plugin reconciles.
    pub parent: KindRef,
    /// The kinds the plugin creates; the host owns, applies and prunes them.
    #[serde(default)]
    pub children: Vec<KindRef>,
    /// The kinds the plugin reads, gathered by `related`.
    #[serde(default)]
    pub related: Vec<RelatedKind>,
    /// Whether parents get the finalizer `wasmop.io/<name>` so the plugin runs on deletion.
    #[serde(default)]
    pub finalizer: bool,
    /// For a plugin that needs the time: its requests carry `now`, rounded down to a multiple
    /// of this many seconds (at least [`MIN_CLOCK_SECONDS`]). `None` gives no time at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_seconds: Option<u32>,
}

/// The finest clock a plugin gets: a request that changes more often than this would defeat
/// the host's skipping of calls at rest.
pub const MIN_CLOCK_SECONDS: u32 = 60;
/// The coarsest clock a manifest may ask for: a day.
pub const MAX_CLOCK_SECONDS: u32 = 86_400;

/// Everything wrong with a manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct ManifestError {
    /// One sentence per broken rule.
    pub problems: Vec<String>,
}

impl Manifest {
    /// A manifest with no parent, children, related kinds or finalizer yet.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            parent: KindRef::new("", ""),
            children: Vec::new(),
            related: Vec::new(),
            finalizer: false,
            clock_seconds: None,
        }
    }

    /// Asks for the time in every request, rounded down to a multiple of `seconds` (the host
    /// uses at least [`MIN_CLOCK_SECONDS`]).
    #[must_use]
    pub fn clock(mut self, seconds: u32) -> Self {
        self.clock_seconds = Some(seconds);
        self
    }

    /// The clock granularity the host gives this plugin, if it asked for one.
    pub fn clock_granularity(&self) -> Option<u32> {
        self.clock_seconds
            .map(|s| s.clamp(MIN_CLOCK_SECONDS, MAX_CLOCK_SECONDS))
    }

    /// Sets the parent kind from a type implementing [`Resource`].
    #[must_use]
    pub fn parent<K: Resource>(self) -> Self {
        self.parent_raw(K::API_VERSION, K::KIND)
    }

    /// Sets the parent kind by name.
    #[must_use]
    pub fn parent_raw(mut self, api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        self.parent = KindRef::new(api_version, kind);
        self
    }

    /// Declares a child kind.
    #[must_use]
    pub fn child<K: Resource>(self) -> Self {
        self.child_raw(K::API_VERSION, K::KIND)
    }

    /// Declares a child kind by name.
    #[must_use]
    pub fn child_raw(mut self, api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        self.children.push(KindRef::new(api_version, kind));
        self
    }

    /// Declares a related kind handed over as whole objects.
    #[must_use]
    pub fn related<K: Resource>(self) -> Self {
        self.related_raw(K::API_VERSION, K::KIND, false)
    }

    /// Declares a related kind handed over as metadata only: prefer this when names, labels or
    /// annotations are enough (smaller module, fewer bytes per call).
    #[must_use]
    pub fn related_meta<K: Resource>(self) -> Self {
        self.related_raw(K::API_VERSION, K::KIND, true)
    }

    /// Declares a related kind by name.
    #[must_use]
    pub fn related_raw(
        mut self,
        api_version: impl Into<String>,
        kind: impl Into<String>,
        metadata_only: bool,
    ) -> Self {
        self.related.push(RelatedKind {
            api_version: api_version.into(),
            kind: kind.into(),
            metadata_only,
        });
        self
    }

    /// Whether parents get the plugin's finalizer (default `false`).
    #[must_use]
    pub fn finalizer(mut self, finalizer: bool) -> Self {
        self.finalizer = finalizer;
        self
    }

    /// Replaces the version, e.g. when a second build reuses another plugin's manifest.
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The field manager for server-side apply: `wasmop/<name>`.
    pub fn field_manager(&self) -> String {
        format!("wasmop/{}", self.name)
    }

    /// The finalizer put on parents when [`Manifest::finalizer`] is set: `wasmop.io/<name>`.
    pub fn finalizer_name(&self) -> String {
        format!("wasmop.io/{}", self.name)
    }

    /// The declared child kind with exactly this apiVersion and kind.
    pub fn child_kind(&self, kind: &KindRef) -> Option<&KindRef> {
        self.children.iter().find(|c| *c == kind)
    }

    /// The declared related kind with exactly this apiVersion and kind.
    pub fn related_kind(&self, kind: &KindRef) -> Option<&RelatedKind> {
        self.related
            .iter()
            .find(|r| r.api_version == kind.api_version && r.kind == kind.kind)
    }
    /// Checks every rule and reports all the broken ones:
    /// - `name` is a DNS-1123 label (it names the field manager and the finalizer);
    /// - `version` is non-empty, at most 128 characters, without control characters;
    /// - every apiVersion is `version` or `group/version` (group a DNS-1123 subdomain, version a
    ///   DNS-1123 label) and every kind an UpperCamelCase identifier;
    /// - no kind is declared twice among the children, nor twice among the related kinds
    ///   (compared by group and kind);
    /// - the parent kind is not a child kind;
    /// - the parent kind is not `Event` (of either group): the host writes Events about each
    ///   reconcile, so such a plugin would feed itself.
    ///
    /// A kind may be both a child and a related kind: they arrive in separate request maps.
    pub fn validate(&self) -> Result<(), ManifestError> {
        let mut problems = Vec::new();
        if !is_dns1123_label(&self.name) {
            problems.push(format!(
                "name {:?} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63 characters)",
                self.name
            ));
        }
        if self.version.is_empty()
            || self.version.len() > 128
            || self.version.chars().any(char::is_control)
        {
            problems.push(format!(
                "version {:?} must be 1 to 128 printable characters",
                self.version
            ));
        }
        if let Some(s) = self.clock_seconds
            && !(1..=MAX_CLOCK_SECONDS).contains(&s)
        {
            problems.push(format!(
                "clock-seconds {s} must be 1 to {MAX_CLOCK_SECONDS} (a day)"
            ));
        }
        check_kind("parent", &self.parent, &mut problems);
        if self.parent.is_event() {
            problems.push(format!(
                "parent ({}) is an Event: the host writes Events about every reconcile, so a plugin on Events would be fed its own output",
                self.parent
            ));
        }
        for (i, child) in self.children.iter().enumerate() {
            check_kind(&format!("children[{i}]"), child, &mut problems);
            if child.same_resource(&self.parent) {
                problems.push(format!(
                    "children[{i}] ({child}) is the parent kind: a parent cannot own its own kind"
                ));
            }
            if let Some(j) = self.children[..i]
                .iter()
                .position(|c| c.same_resource(child))
            {
                problems.push(format!("children[{i}] ({child}) duplicates children[{j}]"));
            }
        }
        for (i, related) in self.related.iter().enumerate() {
            let kind = related.kind_ref();
            check_kind(&format!("related[{i}]"), &kind, &mut problems);
            if let Some(j) = self.related[..i]
                .iter()
                .position(|r| r.kind_ref().same_resource(&kind))
            {
                problems.push(format!("related[{i}] ({kind}) duplicates related[{j}]"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ManifestError { problems })
        }
    }
}

fn check_kind(field: &str, kind: &KindRef, problems: &mut Vec<String>) {
    if !is_api_version(&kind.api_version) {
        problems.push(format!(
            "{field}: apiVersion {:?} is not `version` or `group/version`",
            kind.api_version
        ));
    }
    if !is_kind_name(&kind.kind) {
        problems.push(format!(
            "{field}: kind {:?} is not an UpperCamelCase name",
            kind.kind
        ));
    }
}

/// Which objects of one related kind to gather for one parent, in the parent's namespace
/// (cluster-wide for a cluster-scoped parent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelatedSelector {
    /// The related kind; it must be declared in the [`Manifest`] (exact apiVersion).
    pub kind: KindRef,
    /// The label selector objects must match. An empty selector matches everything.
    pub label_selector: LabelSelector,
}

impl RelatedSelector {
    /// Objects of kind `K` carrying all of these labels.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::Pod;
    /// use wasmop_contract::RelatedSelector;
    ///
    /// let s = RelatedSelector::labels::<Pod>([("app", "memcached")]);
    /// assert_eq!(s.label_selector_json(), r#"{"matchLabels":{"app":"memcached"}}"#);
    /// ```
    pub fn labels<K: Resource>(
        labels: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
    ) -> Self {
        let labels: BTreeMap<String, String> = labels
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Self::new::<K>(LabelSelector {
            match_labels: Some(labels),
            ..LabelSelector::default()
        })
    }

    /// Objects of kind `K` matching a full label selector (`matchLabels`, `matchExpressions`).
    pub fn new<K: Resource>(label_selector: LabelSelector) -> Self {
        Self {
            kind: KindRef::of::<K>(),
            label_selector,
        }
    }

    /// The selector as the JSON text the WIT `related-selector` record carries.
    pub fn label_selector_json(&self) -> String {
        // Serialising a LabelSelector cannot fail: it is strings and maps of strings.
        serde_json::to_string(&self.label_selector).unwrap_or_else(|_| "{}".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            name: "memcached".into(),
            version: "0.1.0".into(),
            parent: KindRef::new("cache.example.com/v1alpha1", "Memcached"),
            children: vec![KindRef::new("apps/v1", "Deployment")],
            related: vec![RelatedKind {
                api_version: "v1".into(),
                kind: "Pod".into(),
                metadata_only: true,
            }],
            finalizer: true,
            clock_seconds: None,
        }
    }

    #[test]
    fn a_clock_is_opt_in_bounded_and_never_finer_than_a_minute() {
        let m = manifest();
        assert_eq!(m.clock_granularity(), None);
        assert!(!serde_json::to_string(&m).unwrap().contains("clock"));
        assert_eq!(
            m.clone().clock(1).clock_granularity(),
            Some(MIN_CLOCK_SECONDS)
        );
        assert_eq!(m.clone().clock(300).clock_granularity(), Some(300));
        m.clone().clock(MAX_CLOCK_SECONDS).validate().unwrap();
        for bad in [0, MAX_CLOCK_SECONDS + 1] {
            let err = m.clone().clock(bad).validate().unwrap_err().to_string();
            assert!(err.contains("clock-seconds"), "{err}");
        }
    }

    #[test]
    fn a_good_manifest_passes() {
        let m = manifest();
        m.validate().unwrap();
        assert_eq!(m.field_manager(), "wasmop/memcached");
        assert_eq!(m.finalizer_name(), "wasmop.io/memcached");
    }

    #[test]
    fn kind_ref_parts() {
        let d = KindRef::new("apps/v1", "Deployment");
        assert_eq!(
            (d.group(), d.version(), d.key()),
            ("apps", "v1", "Deployment.apps/v1".into())
        );
        let p = KindRef::new("v1", "Pod");
        assert_eq!(
            (p.group(), p.version(), p.key()),
            ("", "v1", "Pod.v1".into())
        );
        assert!(d.same_resource(&KindRef::new("apps/v1beta1", "Deployment")));
        let (core, events) = (
            KindRef::new("v1", "Event"),
            KindRef::new("events.k8s.io/v1", "Event"),
        );
        assert!(core.same_resource(&events) && events.same_resource(&core));
        assert!(core.is_event() && events.is_event());
        assert!(!KindRef::new("example.com/v1", "Event").is_event());
    }

    #[test]
    fn events_of_either_group_are_never_a_parent() {
        for api_version in ["v1", "events.k8s.io/v1"] {
            let mut m = manifest();
            m.parent = KindRef::new(api_version, "Event");
            let text = m.validate().unwrap_err().to_string();
            assert!(text.contains("is an Event"), "{text}");
        }
    }

    #[test]
    fn every_broken_rule_is_reported() {
        let mut m = manifest();
        m.name = "Mem_cached".into();
        m.version = String::new();
        m.parent.api_version = "cache.example.com/".into();
        m.children.push(KindRef::new("apps/v1beta2", "Deployment"));
        m.children
            .push(KindRef::new("cache.example.com/v1", "Memcached"));
        m.children.push(KindRef::new("v1", "configMap"));
        m.related.push(m.related[0].clone());
        let err = m.validate().unwrap_err();
        let text = err.to_string();
        for needle in [
            "name \"Mem_cached\"",
            "version \"\"",
            "parent: apiVersion",
            "children[1] (apps/v1beta2 Deployment) duplicates children[0]",
            "children[2] (cache.example.com/v1 Memcached) is the parent kind",
            "children[3]: kind \"configMap\"",
            "related[1] (v1 Pod) duplicates related[0]",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in {text}");
        }
        assert_eq!(err.problems.len(), 7, "{text}");
    }
}
