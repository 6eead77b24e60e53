//! What a plugin declares about itself, and which related objects it wants for one parent.
//!
//! These mirror the `manifest`, `kind-ref`, `related-kind` and `related-selector` records of
//! `wit/plugin.wit`; the export glue converts them, so plugins and their native tests never touch
//! generated bindings.

use std::collections::BTreeMap;

use k8s_openapi::Resource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A Kubernetes kind: `apiVersion` (`group/version`, or `version` for the core group) and `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindRef {
    /// E.g. `apps/v1`.
    pub api_version: String,
    /// E.g. `Deployment`.
    pub kind: String,
}

impl KindRef {
    /// The kind of a k8s-openapi type (or any type implementing [`Resource`]).
    pub fn of<K: Resource>() -> Self {
        Self::new(K::API_VERSION, K::KIND)
    }

    /// A kind by name, for types without a Rust definition.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }
}

/// A kind the plugin reads but does not own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelatedKind {
    /// The kind.
    pub kind: KindRef,
    /// Whether the host hands over only `apiVersion`, `kind` and `metadata`.
    pub metadata_only: bool,
}

/// Who the plugin is and what it works on; read once when the host loads the plugin.
///
/// ```
/// use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
/// use wasmop_guest::Manifest;
///
/// let m = Manifest::new("memcached", "0.1.0")
///     .parent_raw("cache.example.com/v1alpha1", "Memcached")
///     .child::<Deployment>()
///     .related_meta::<Pod>();
/// assert_eq!(m.children[0].kind, "Deployment");
/// assert!(!m.finalizer);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Unique per host: it names the field manager (`wasmop/<name>`) and the finalizer. Keep it
    /// stable across versions, or the host treats the new build as a different plugin.
    pub name: String,
    /// The plugin's own version, shown in logs, Events and metrics.
    pub version: String,
    /// The kind the plugin reconciles.
    pub parent: KindRef,
    /// The kinds the plugin creates; the host owns, applies and prunes them.
    pub children: Vec<KindRef>,
    /// The kinds the plugin reads, gathered by [`crate::Plugin::related`].
    pub related: Vec<RelatedKind>,
    /// Whether parents get the finalizer `wasmop.io/<name>` so the plugin runs on deletion.
    pub finalizer: bool,
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
        }
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
            kind: KindRef::new(api_version, kind),
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
}

/// Which objects of one related kind to gather for one parent, in the parent's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct RelatedSelector {
    /// The related kind; it must be declared in the [`Manifest`].
    pub kind: KindRef,
    /// The label selector objects must match. An empty selector matches everything.
    pub label_selector: LabelSelector,
}

impl RelatedSelector {
    /// Objects of kind `K` carrying all of these labels.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::Pod;
    /// use wasmop_guest::RelatedSelector;
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
