//! Run a plugin natively, the way the host runs it, from plain `cargo test`.
//!
//! [`RequestBuilder`] assembles a [`WireRequest`] like the host does; [`reconcile`] and
//! [`related`] then go through the very JSON → typed → JSON path the wasm export uses, so a test
//! that passes here exercises the code that ships.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use serde_json::json;
//! use wasmop_guest::testing::{self, RequestBuilder};
//!
//! let parent = json!({"metadata": {"name": "a", "namespace": "ns"}});
//! let cm = ConfigMap {
//!     metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
//!         name: Some("a".into()),
//!         ..Default::default()
//!     },
//!     ..Default::default()
//! };
//! let req = RequestBuilder::new(&parent).child(&cm).settings(json!({"x": 1})).build();
//! assert!(req.children["ConfigMap.v1"].contains_key("a"));
//! # let _ = testing::take_logs();
//! ```

use std::collections::BTreeSet;

use k8s_openapi::Resource;
use serde::Serialize;
use serde_json::Value;

use crate::log::Level;
use crate::manifest::RelatedSelector;
use crate::wire::{WireRequest, WireResponse, kind_key};
use crate::{__reconcile_json, __related_json, Plugin};

/// Builds a [`WireRequest`] the way the host assembles one.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct RequestBuilder {
    wire: WireRequest,
}

impl RequestBuilder {
    /// A request for this parent (anything that serialises to the parent's JSON).
    pub fn new(parent: &impl Serialize) -> Self {
        Self {
            wire: WireRequest {
                parent: to_json(parent),
                ..WireRequest::default()
            },
        }
    }

    /// Adds an observed child.
    pub fn child<K: Resource + Serialize>(mut self, obj: &K) -> Self {
        let obj = with_kind::<K>(to_json(obj));
        let key = self.object_key(&obj);
        self.wire
            .children
            .entry(kind_key(K::API_VERSION, K::KIND))
            .or_default()
            .insert(key, obj);
        self
    }

    /// Adds an observed related object (the whole object, as for
    /// [`crate::Manifest::related`]).
    pub fn related<K: Resource + Serialize>(mut self, obj: &K) -> Self {
        let obj = with_kind::<K>(to_json(obj));
        let key = self.object_key(&obj);
        self.wire
            .related
            .entry(kind_key(K::API_VERSION, K::KIND))
            .or_default()
            .insert(key, obj);
        self
    }

    /// Adds an observed related object reduced to `apiVersion`, `kind` and `metadata`, as the
    /// host sends kinds declared with [`crate::Manifest::related_meta`].
    pub fn related_meta<K: Resource + Serialize>(mut self, obj: &K) -> Self {
        let full = with_kind::<K>(to_json(obj));
        let mut obj = serde_json::Map::new();
        for field in ["apiVersion", "kind", "metadata"] {
            if let Some(v) = full.get(field) {
                obj.insert(field.to_owned(), v.clone());
            }
        }
        let obj = Value::Object(obj);
        let key = self.object_key(&obj);
        self.wire
            .related
            .entry(kind_key(K::API_VERSION, K::KIND))
            .or_default()
            .insert(key, obj);
        self
    }

    /// Sets the plugin's settings.
    pub fn settings(mut self, settings: Value) -> Self {
        self.wire.settings = settings;
        self
    }

    /// Marks the parent as being deleted with the plugin's finalizer still on it.
    pub fn finalizing(mut self, finalizing: bool) -> Self {
        self.wire.finalizing = finalizing;
        self
    }

    /// The request.
    pub fn build(self) -> WireRequest {
        self.wire
    }

    // The host keys objects by name, and by namespace/name under a cluster-scoped parent.
    fn object_key(&self, obj: &Value) -> String {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        match ns {
            Some(ns) if self.wire.parent.pointer("/metadata/namespace").is_none() => {
                format!("{ns}/{name}")
            }
            _ => name.to_owned(),
        }
    }
}

impl From<RequestBuilder> for WireRequest {
    fn from(b: RequestBuilder) -> Self {
        b.build()
    }
}

/// Runs `P::reconcile` on a request through the same code as the wasm export.
///
/// Like the host, it first adds an empty map for every declared child and related kind the
/// request lacks. Afterwards it refuses what the host would refuse before applying anything:
/// children of undeclared kinds and duplicate children.
pub fn reconcile<P: Plugin>(request: &WireRequest) -> Result<WireResponse, String> {
    let manifest = P::manifest();
    let mut request = request.clone();
    for k in &manifest.children {
        request
            .children
            .entry(kind_key(&k.api_version, &k.kind))
            .or_default();
    }
    for r in &manifest.related {
        request
            .related
            .entry(kind_key(&r.kind.api_version, &r.kind.kind))
            .or_default();
    }
    let json = serde_json::to_string(&request).map_err(|e| e.to_string())?;
    let out = __reconcile_json::<P>(&json)?;
    let response: WireResponse = serde_json::from_str(&out).map_err(|e| e.to_string())?;

    let declared: BTreeSet<(&str, &str)> = manifest
        .children
        .iter()
        .map(|k| (k.api_version.as_str(), k.kind.as_str()))
        .collect();
    let mut seen = BTreeSet::new();
    for child in &response.children {
        let field = |ptr: &str| {
            child
                .pointer(ptr)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        let (api_version, kind) = (field("/apiVersion"), field("/kind"));
        if !declared.contains(&(api_version, kind)) {
            return Err(format!(
                "child kind {} is not declared",
                kind_key(api_version, kind)
            ));
        }
        let id = (
            kind_key(api_version, kind),
            field("/metadata/namespace"),
            field("/metadata/name"),
        );
        if !seen.insert(id.clone()) {
            return Err(format!("duplicate child {} {}", id.0, id.2));
        }
    }
    Ok(response)
}

/// Runs `P::related` on a parent through the same code as the wasm export.
pub fn related<P: Plugin>(parent: &impl Serialize) -> Result<Vec<RelatedSelector>, String> {
    let json = serde_json::to_string(&to_json(parent)).map_err(|e| e.to_string())?;
    __related_json::<P>(&json)
}

/// Takes the lines logged so far on this thread (natively every test runs on its own thread).
pub fn take_logs() -> Vec<(Level, String)> {
    crate::log::take()
}

fn to_json(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("test object serialises to JSON")
}

fn with_kind<K: Resource>(mut obj: Value) -> Value {
    if let Value::Object(map) = &mut obj {
        map.entry("apiVersion")
            .or_insert_with(|| K::API_VERSION.into());
        map.entry("kind").or_insert_with(|| K::KIND.into());
    }
    obj
}
