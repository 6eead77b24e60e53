//! The host's view of a plugin's manifest and of the selectors `related` returns: plain serde
//! types converted from the generated bindings, with the validation the host relies on.
//!
//! A manifest is read once at load. Its name becomes the field manager `wasmop/<name>` and the
//! finalizer `wasmop.io/<name>`, hence the DNS-1123 label rule; kinds are compared by group and
//! kind (two versions of one kind are one resource).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};
use wasmop_guest::wire::kind_key;

use super::bindings::exports::wasmop::plugin::reconciler as wit;

/// A Kubernetes kind: `apps/v1` + `Deployment`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindRef {
    /// `group/version`, or just `version` for the core group.
    pub api_version: String,
    /// The kind, e.g. `Deployment`.
    pub kind: String,
}

impl KindRef {
    /// A kind from its apiVersion and kind.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
        }
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

    /// Whether `other` is the same resource (same group and kind, any version).
    pub fn same_resource(&self, other: &KindRef) -> bool {
        self.group() == other.group() && self.kind == other.kind
    }

    /// The kind of a JSON object (`apiVersion` and `kind`), if both are strings.
    pub fn of(obj: &serde_json::Value) -> Option<Self> {
        Some(Self::new(
            obj.get("apiVersion")?.as_str()?,
            obj.get("kind")?.as_str()?,
        ))
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
    /// Only `apiVersion`, `kind` and `metadata` are watched and handed over.
    #[serde(default)]
    pub metadata_only: bool,
}

impl RelatedKind {
    /// The kind without the metadata-only flag.
    pub fn kind_ref(&self) -> KindRef {
        KindRef::new(&self.api_version, &self.kind)
    }
}

/// Who a plugin is and what it works on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Unique per host: the field manager is `wasmop/<name>`, the finalizer `wasmop.io/<name>`.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The kind the plugin reconciles.
    pub parent: KindRef,
    /// The kinds the plugin creates; the host owns, applies and prunes them.
    #[serde(default)]
    pub children: Vec<KindRef>,
    /// The kinds the plugin reads, gathered by `related`.
    #[serde(default)]
    pub related: Vec<RelatedKind>,
    /// Whether parents get the plugin's finalizer.
    #[serde(default)]
    pub finalizer: bool,
}

/// Everything wrong with a manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct ManifestError {
    /// One sentence per broken rule.
    pub problems: Vec<String>,
}

impl Manifest {
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
    /// - the parent kind is not a child kind.
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
        check_kind("parent", &self.parent, &mut problems);
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

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// DNS-1123 labels joined by dots, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_api_version(s: &str) -> bool {
    match s.split_once('/') {
        Some((group, version)) => is_dns1123_subdomain(group) && is_dns1123_label(version),
        None => is_dns1123_label(s),
    }
}

fn is_kind_name(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

impl From<wit::PluginManifest> for Manifest {
    fn from(m: wit::PluginManifest) -> Self {
        Self {
            name: m.name,
            version: m.version,
            parent: KindRef::new(m.parent.api_version, m.parent.kind),
            children: m
                .children
                .into_iter()
                .map(|k| KindRef::new(k.api_version, k.kind))
                .collect(),
            related: m
                .related
                .into_iter()
                .map(|r| RelatedKind {
                    api_version: r.api_version,
                    kind: r.kind,
                    metadata_only: r.metadata_only,
                })
                .collect(),
            finalizer: m.finalizer,
        }
    }
}

/// Which objects of one related kind to gather for one parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelatedSelector {
    /// A related kind the manifest declares (exact apiVersion).
    pub kind: KindRef,
    /// Labels to match, in the parent's namespace (cluster-wide for a cluster-scoped parent).
    pub selector: LabelSelector,
}

/// Why a selector from `related` was refused.
#[derive(Debug)]
pub(crate) enum SelectorProblem {
    /// The label selector is not JSON of a `LabelSelector`.
    Json(String),
    /// Parsed, but breaks a rule.
    Invalid(String),
}

impl RelatedSelector {
    /// Parses one selector returned by `related` and checks it against the manifest.
    pub(crate) fn from_wit(
        manifest: &Manifest,
        wire: wit::RelatedSelector,
    ) -> Result<Self, SelectorProblem> {
        let kind = KindRef::new(wire.api_version, wire.kind);
        let selector: LabelSelector = serde_json::from_str(&wire.label_selector)
            .map_err(|e| SelectorProblem::Json(format!("label selector for {kind}: {e}")))?;
        if manifest.related_kind(&kind).is_none() {
            return Err(SelectorProblem::Invalid(format!(
                "selector for {kind}, which the manifest does not declare as a related kind"
            )));
        }
        if let Err(e) = kube::core::Selector::try_from(selector.clone()) {
            return Err(SelectorProblem::Invalid(format!(
                "label selector for {kind}: {e}"
            )));
        }
        Ok(Self { kind, selector })
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

    #[test]
    fn names() {
        assert!(is_dns1123_label("a-b-1"));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("web.example-1.com"));
        assert!(!is_dns1123_subdomain("web..com"));
        assert!(!is_dns1123_subdomain("Web"));
    }

    #[test]
    fn selectors_are_checked_against_the_manifest() {
        let m = manifest();
        let wire = |kind: &str, json: &str| wit::RelatedSelector {
            api_version: "v1".into(),
            kind: kind.into(),
            label_selector: json.into(),
        };
        let ok =
            RelatedSelector::from_wit(&m, wire("Pod", r#"{"matchLabels":{"app":"x"}}"#)).unwrap();
        assert_eq!(ok.kind, KindRef::new("v1", "Pod"));
        assert!(matches!(
            RelatedSelector::from_wit(&m, wire("Pod", "{nope")),
            Err(SelectorProblem::Json(_))
        ));
        assert!(matches!(
            RelatedSelector::from_wit(&m, wire("Secret", "{}")),
            Err(SelectorProblem::Invalid(_))
        ));
        let bad_op = r#"{"matchExpressions":[{"key":"a","operator":"Near"}]}"#;
        assert!(matches!(
            RelatedSelector::from_wit(&m, wire("Pod", bad_op)),
            Err(SelectorProblem::Invalid(_))
        ));
    }
}
