//! Typed, read-only views of one reconcile request.
//!
//! The request arrives as JSON ([`WireRequest`]); [`Request`] deserialises the parent into the
//! plugin's own type once and every other object lazily, by the k8s-openapi type the plugin asks
//! for. A plugin only pays (in code size and time) for the types it reads.

use k8s_openapi::Resource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::wire::{ByName, WireRequest, kind_key};

/// One reconcile request: the parent, its children, the related objects and the settings.
#[derive(Debug, Clone)]
pub struct Request<P> {
    parent: P,
    wire: WireRequest,
}

/// Reads `metadata` and ignores the rest of an object: no code for the object's body is linked.
#[derive(Deserialize)]
struct MetaOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

impl<P: DeserializeOwned> Request<P> {
    /// Reads the parent into `P`; fails with the serde message when it does not fit.
    pub fn from_wire(wire: WireRequest) -> Result<Self> {
        let parent = P::deserialize(&wire.parent).map_err(|e| Error::from(e).context("parent"))?;
        Ok(Self { parent, wire })
    }
}

impl<P> Request<P> {
    /// The parent, as the plugin's own type.
    pub fn parent(&self) -> &P {
        &self.parent
    }

    /// The parent's metadata, read from the JSON on each call. [`Request::name`],
    /// [`Request::namespace`] and [`Request::generation`] are cheaper, and a plugin that never
    /// calls this links no `ObjectMeta` deserialiser (tens of KB with its timestamp parser).
    pub fn parent_meta(&self) -> Result<ObjectMeta> {
        MetaOnly::deserialize(&self.wire.parent)
            .map(|m| m.metadata)
            .map_err(|e| Error::from(e).context("parent metadata"))
    }

    /// The parent as the host sent it.
    pub fn parent_json(&self) -> &Value {
        &self.wire.parent
    }

    /// The parent's name (empty only if the host sent a nameless parent).
    pub fn name(&self) -> &str {
        self.parent_str("/metadata/name").unwrap_or_default()
    }

    /// The parent's namespace; `None` for a cluster-scoped parent.
    pub fn namespace(&self) -> Option<&str> {
        self.parent_str("/metadata/namespace")
    }

    /// The parent's `metadata.generation`.
    pub fn generation(&self) -> Option<i64> {
        self.wire
            .parent
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
    }

    fn parent_str(&self, pointer: &str) -> Option<&str> {
        self.wire.parent.pointer(pointer).and_then(Value::as_str)
    }

    /// The observed children of kind `K`, ordered by name.
    pub fn children<K: Resource + DeserializeOwned>(&self) -> Result<Vec<K>> {
        self.children_as::<K, K>()
    }

    /// The observed child of kind `K` with this name (`namespace/name` when the parent is
    /// cluster-scoped), if it exists.
    pub fn child<K: Resource + DeserializeOwned>(&self, name: &str) -> Result<Option<K>> {
        self.child_as::<K, K>(name)
    }

    /// Whether a child of kind `K` with this name was observed; reads nothing of its body.
    pub fn has_child<K: Resource>(&self, name: &str) -> bool {
        self.wire
            .children
            .get(&key::<K>())
            .is_some_and(|m| m.contains_key(name))
    }

    /// The observed child of kind `K` with this name as the host sent it: the cheapest way to
    /// read a field or two (`.pointer("/status/readyReplicas")`) without linking a deserialiser.
    pub fn child_json<K: Resource>(&self, name: &str) -> Option<&Value> {
        self.wire.children.get(&key::<K>())?.get(name)
    }

    /// The observed children of kind `K`, read into `T`: a struct with only the fields the
    /// plugin needs. Prefer it for big kinds; a full `Deployment` deserialiser alone adds
    /// hundreds of KB to a module.
    pub fn children_as<K: Resource, T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        typed_all::<K, T>("child", self.wire.children.get(&key::<K>()))
    }

    /// The observed child of kind `K` with this name, read into `T` (see
    /// [`Request::children_as`]).
    pub fn child_as<K: Resource, T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        let Some(obj) = self
            .wire
            .children
            .get(&key::<K>())
            .and_then(|m| m.get(name))
        else {
            return Ok(None);
        };
        typed::<K, T>("child", name, obj).map(Some)
    }

    /// The related objects of kind `K` (declared with [`crate::Manifest::related`]), ordered by
    /// name.
    pub fn related<K: Resource + DeserializeOwned>(&self) -> Result<Vec<K>> {
        self.related_as::<K, K>()
    }

    /// The related objects of kind `K`, read into `T` (see [`Request::children_as`]).
    pub fn related_as<K: Resource, T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        typed_all::<K, T>("related", self.wire.related.get(&key::<K>()))
    }

    /// The names of the related objects of kind `K`, sorted (`namespace/name` when the parent
    /// is cluster-scoped). Reads no object bodies.
    pub fn related_names<K: Resource>(&self) -> Vec<String> {
        self.wire
            .related
            .get(&key::<K>())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The metadata of the related objects of kind `K`, ordered by name. Works for kinds
    /// declared with [`crate::Manifest::related_meta`] (the host sends only metadata) and with
    /// `related`.
    pub fn related_meta<K: Resource>(&self) -> Result<Vec<ObjectMeta>> {
        let Some(objects) = self.wire.related.get(&key::<K>()) else {
            return Ok(Vec::new());
        };
        objects
            .iter()
            .map(|(name, obj)| {
                MetaOnly::deserialize(obj)
                    .map(|m| m.metadata)
                    .map_err(|e| Error::from(e).context(what::<K>("related", name)))
            })
            .collect()
    }

    /// The plugin's settings as `T`. Absent settings read as `{}`, so a struct whose fields
    /// have `#[serde(default)]` gets its defaults.
    pub fn settings<T: DeserializeOwned>(&self) -> Result<T> {
        let empty = Value::Object(serde_json::Map::new());
        let settings = match &self.wire.settings {
            Value::Null => &empty,
            v => v,
        };
        T::deserialize(settings).map_err(|e| Error::from(e).context("settings"))
    }

    /// One top-level setting as `T`: `None` when it is absent or null, an error naming
    /// `settings.<key>` when it does not fit.
    pub fn setting<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.wire.settings.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => T::deserialize(v)
                .map(Some)
                .map_err(|e| Error::from(e).context(format!("settings.{key}"))),
        }
    }

    /// True while the parent is being deleted and the plugin's finalizer is still on it.
    pub fn finalizing(&self) -> bool {
        self.wire.finalizing
    }

    /// The whole request as the host sent it, for kinds without a Rust type.
    pub fn wire(&self) -> &WireRequest {
        &self.wire
    }
}

fn key<K: Resource>() -> String {
    kind_key(K::API_VERSION, K::KIND)
}

fn what<K: Resource>(role: &str, name: &str) -> String {
    format!("{role} {} \"{name}\"", key::<K>())
}

fn typed<K: Resource, T: DeserializeOwned>(role: &str, name: &str, obj: &Value) -> Result<T> {
    T::deserialize(obj).map_err(|e| Error::from(e).context(what::<K>(role, name)))
}

fn typed_all<K: Resource, T: DeserializeOwned>(
    role: &str,
    objects: Option<&ByName>,
) -> Result<Vec<T>> {
    objects
        .into_iter()
        .flatten()
        .map(|(name, obj)| typed::<K, T>(role, name, obj))
        .collect()
}
