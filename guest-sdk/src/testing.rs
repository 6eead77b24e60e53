//! Run a plugin natively, the way the host runs it, from plain `cargo test`.
//!
//! [`RequestBuilder`] assembles a [`WireRequest`] like the host does; [`reconcile`] and
//! [`related`] then go through the very JSON → typed → JSON path the wasm export uses, and
//! [`reconcile`] checks the response with the host's own output rules
//! ([`wasmop_contract::validate`]), so a test that passes here exercises the code that ships
//! and the rules it will meet.
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

use k8s_openapi::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use wasmop_contract::validate::{Target, validate};
use wasmop_contract::{KindRef, Scope};

use crate::log::Level;
use crate::wire::{WireRequest, WireResponse, kind_key, object_key};
use crate::{__reconcile_json, __related_json, Plugin, RelatedSelector};

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

    fn object_key(&self, obj: &Value) -> String {
        object_key(obj, Scope::of_object(&self.wire.parent))
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
/// request lacks. Afterwards it checks the response with the host's output rules and refuses
/// what the host would refuse before applying anything, with the host's message. The parent's
/// scope is read off the parent (namespaced when it has a namespace); every child kind counts
/// as namespaced.
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
            .entry(kind_key(&r.api_version, &r.kind))
            .or_default();
    }
    let json = serde_json::to_string(&request).map_err(|e| e.to_string())?;
    let out = __reconcile_json::<P>(&json)?;
    let response: WireResponse = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let scope_of = |_: &KindRef| None;
    let target = Target {
        manifest: &manifest,
        parent: &request.parent,
        scope_of: &scope_of,
        parent_scope: Scope::of_object(&request.parent),
    };
    validate(&target, response.clone()).map_err(|e| e.to_string())?;
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

/// Typed access to what a response asks for, for tests:
/// `resp.child::<Deployment>("web")`, `resp.children_of::<Service>()`.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use wasmop_guest::testing::ResponseExt;
/// use wasmop_guest::wire::WireResponse;
///
/// let resp = WireResponse {
///     children: vec![serde_json::json!({
///         "apiVersion": "v1", "kind": "ConfigMap",
///         "metadata": {"name": "web"}, "data": {"a": "1"},
///     })],
///     ..Default::default()
/// };
/// let cm: ConfigMap = resp.child("web").expect("a ConfigMap named web");
/// assert_eq!(cm.data.unwrap()["a"], "1");
/// assert!(resp.child::<ConfigMap>("other").is_none());
/// assert_eq!(resp.children_of::<ConfigMap>().len(), 1);
/// ```
pub trait ResponseExt {
    /// The child of kind `K` named `name`, if the response has it.
    ///
    /// # Panics
    ///
    /// If that child does not deserialise as a `K`: the test has found a bad child.
    fn child<K: Resource + DeserializeOwned>(&self, name: &str) -> Option<K>;
    /// Every child of kind `K`, in response order.
    fn children_of<K: Resource + DeserializeOwned>(&self) -> Vec<K>;
}

fn is_kind<K: Resource>(obj: &Value) -> bool {
    obj["apiVersion"] == K::API_VERSION && obj["kind"] == K::KIND
}

fn decode<K: DeserializeOwned>(obj: &Value) -> K {
    serde_json::from_value(obj.clone()).unwrap_or_else(|e| {
        panic!(
            "child {} does not deserialise: {e}",
            obj["metadata"]["name"]
        )
    })
}

impl ResponseExt for WireResponse {
    fn child<K: Resource + DeserializeOwned>(&self, name: &str) -> Option<K> {
        self.children
            .iter()
            .find(|c| is_kind::<K>(c) && c["metadata"]["name"] == name)
            .map(decode)
    }

    fn children_of<K: Resource + DeserializeOwned>(&self) -> Vec<K> {
        self.children
            .iter()
            .filter(|c| is_kind::<K>(c))
            .map(decode)
            .collect()
    }
}
