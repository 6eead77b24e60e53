//! One object as the caches hold it: its JSON text, and the few metadata fields the host
//! indexes and decides on, typed.
//!
//! A `serde_json::Value` tree takes seven to eight times the bytes of its text (a Deployment:
//! 16 KiB against 2.2 KiB), mostly in the nodes of small maps. An [`Object`] keeps the text
//! (without `managedFields`) and parses it again only where a body is read: comparing a child
//! with what a plugin wants, or a parent's status with the plugin's. A plugin's request is
//! assembled from the texts as they are ([`Object`] serialises as its text), so gathering costs
//! no tree at all.
//!
//! Decoding never fails on an object's depth: the text is taken without recursing, and an
//! object nested deeper than serde_json can parse back ([`MAX_DEPTH`]) is kept by its
//! `apiVersion`, `kind` and `metadata`, marked [`undecodable`](Object::undecodable) with why, so
//! one such object never fails its kind's watch and is never handed to a plugin.
//!
//! ```
//! use wasmop::watch::Object;
//!
//! let obj = Object::from_json(
//!     r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"a",
//!         "labels":{"app":"web"},"managedFields":[{"manager":"kubectl"}]},"spec":{"x":1}}"#,
//! )
//! .unwrap();
//! assert_eq!(obj.name(), "p");
//! assert_eq!(obj.labels().get("app"), Some("web"));
//! assert!(!obj.json().contains("managedFields"));
//! assert_eq!(obj.field("spec").unwrap()["x"], 1);
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::api::{ApiResource, DynamicObject, TypeMeta};
use kube::core::DynamicResourceScope;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// The deepest nesting of arrays and objects kept whole: serde_json refuses to parse deeper
/// (its recursion limit is 128), so the host could not read such a body back.
pub const MAX_DEPTH: usize = 127;

/// One cached object. Cheap to read; build one with [`Object::from_json`] or
/// [`Object::from_value`], or let a watch decode it.
#[derive(Clone)]
pub struct Object {
    /// The whole object without `managedFields`: `{"apiVersion":…,"kind":…,"metadata":{…},…}`.
    text: Box<RawValue>,
    /// Only what the host reads without parsing: name, namespace, uid, resourceVersion,
    /// generation, deletionTimestamp, ownerReferences and finalizers. Labels are in `labels`;
    /// everything else is only in the text.
    meta: ObjectMeta,
    labels: Labels,
    api_version: Box<str>,
    kind: Box<str>,
    /// Byte offset in `text` where `"metadata":` begins, so the type can be replaced without
    /// parsing again.
    meta_at: u32,
    /// Why the body could not be kept (the text then holds only apiVersion, kind, metadata).
    undecodable: Option<Box<str>>,
    /// The text holds only apiVersion, kind and metadata.
    metadata_only: bool,
}

/// An object's labels, sorted by key: a few hundred bytes fewer than a `BTreeMap` each.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Box<[(Box<str>, Box<str>)]>);

impl Labels {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// Every label, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// As the map selectors match against.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn heap_bytes(&self) -> usize {
        self.0.len() * std::mem::size_of::<(Box<str>, Box<str>)>()
            + self.0.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label strings")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Labels, E> {
                Ok(Labels::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
                let mut pairs: Vec<(Box<str>, Box<str>)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<Cow<'_, str>, Cow<'_, str>>()? {
                    pairs.push((k.into(), v.into()));
                }
                pairs.sort();
                pairs.dedup_by(|a, b| a.0 == b.0);
                Ok(Labels(pairs.into_boxed_slice()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Why an object could not be built.
#[derive(Debug, thiserror::Error)]
#[error("not a Kubernetes object: {0}")]
pub struct NotAnObject(String);

impl Object {
    /// Builds an object from its JSON text: `managedFields` are dropped, the metadata the host
    /// reads is decoded.
    pub fn from_json(text: &str) -> Result<Object, NotAnObject> {
        build(text, false)
    }

    /// Builds an object from a JSON value (files, tests).
    pub fn from_value(value: &Value) -> Result<Object, NotAnObject> {
        build(&value.to_string(), false)
    }

    /// The same object with this `apiVersion` and `kind` (list items of built-in kinds come
    /// without them; metadata-only watches name `PartialObjectMetadata`).
    pub fn with_type(self, types: &TypeMeta) -> Object {
        if self.api_version() == types.api_version && self.kind() == types.kind {
            return self;
        }
        let head = type_head(&types.api_version, &types.kind);
        let rest = &self.text.get()[self.meta_at as usize..];
        let text = RawValue::from_string(format!("{head}{rest}"))
            .expect("a new head on valid JSON stays valid");
        Object {
            meta_at: head.len() as u32,
            text,
            api_version: types.api_version.as_str().into(),
            kind: types.kind.as_str().into(),
            ..self
        }
    }

    /// The same object cut to `apiVersion`, `kind` and `metadata`.
    pub fn to_metadata_only(&self) -> Object {
        if self.metadata_only {
            return self.clone();
        }
        build(self.text.get(), true).expect("a cached object rebuilds")
    }

    /// The whole object as JSON text, without `managedFields`.
    pub fn json(&self) -> &str {
        self.text.get()
    }

    /// The whole object parsed (`null` in the one case serde_json refuses what the API
    /// server sent: a number past `f64`, which no API server stores).
    pub fn value(&self) -> Value {
        serde_json::from_str(self.text.get()).unwrap_or_else(|e| {
            tracing::warn!(kind = %self.kind, name = self.name(), error = %e, "a cached object does not parse");
            Value::Null
        })
    }

    /// One top-level field parsed (`spec`, `status`, …), if present.
    pub fn field(&self, name: &str) -> Option<Value> {
        let fields: Fields<'_> = serde_json::from_str(self.text.get()).ok()?;
        let raw = fields.get(name)?;
        serde_json::from_str(raw.get()).ok()
    }

    /// The full metadata parsed, annotations and all.
    pub fn metadata(&self) -> ObjectMeta {
        self.field("metadata")
            .and_then(|m| serde_json::from_value(m).ok())
            .unwrap_or_default()
    }

    /// `apiVersion`.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// `kind`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// `metadata.name` (empty if absent).
    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.meta.namespace.as_deref()
    }

    /// Namespace and name.
    pub fn key(&self) -> super::ObjKey {
        super::ObjKey::new(self.namespace(), self.name())
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> Option<&str> {
        self.meta.uid.as_deref()
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.meta.resource_version.as_deref()
    }

    /// `metadata.generation`.
    pub fn generation(&self) -> Option<i64> {
        self.meta.generation
    }

    /// Whether `metadata.deletionTimestamp` is set.
    pub fn is_deleting(&self) -> bool {
        self.meta.deletion_timestamp.is_some()
    }

    /// `metadata.finalizers`.
    pub fn finalizers(&self) -> &[String] {
        self.meta.finalizers.as_deref().unwrap_or_default()
    }

    /// `metadata.ownerReferences`.
    pub fn owner_references(&self) -> &[OwnerReference] {
        self.meta.owner_references.as_deref().unwrap_or_default()
    }

    /// The owner reference with `controller: true`, if any.
    pub fn controller(&self) -> Option<&OwnerReference> {
        self.owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
    }

    /// `metadata.labels`.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// Why the object's body could not be decoded, if it could not.
    pub fn undecodable(&self) -> Option<&str> {
        self.undecodable.as_deref()
    }

    /// Whether the text holds only apiVersion, kind and metadata.
    pub fn is_metadata_only(&self) -> bool {
        self.metadata_only
    }

    /// The bytes the object takes on the heap, roughly: itself, its text and decoded fields
    /// (not the allocator's own overhead).
    pub fn heap_bytes(&self) -> usize {
        let s = |o: &Option<String>| o.as_ref().map_or(0, String::len);
        let m = &self.meta;
        std::mem::size_of::<Self>()
            + self.text.get().len()
            + self.api_version.len()
            + self.kind.len()
            + s(&m.name)
            + s(&m.namespace)
            + s(&m.uid)
            + s(&m.resource_version)
            + m.owner_references.as_ref().map_or(0, |o| {
                o.iter()
                    .map(|r| {
                        std::mem::size_of::<OwnerReference>()
                            + r.api_version.len()
                            + r.kind.len()
                            + r.name.len()
                            + r.uid.len()
                    })
                    .sum()
            })
            + m.finalizers.as_ref().map_or(0, |f| {
                f.iter()
                    .map(|s| s.len() + std::mem::size_of::<String>())
                    .sum()
            })
            + self.labels.heap_bytes()
            + self.undecodable.as_ref().map_or(0, |u| u.len())
    }
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text.get())
    }
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.text.get() == other.text.get()
    }
}

impl Serialize for Object {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.text.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <Box<RawValue>>::deserialize(d)?;
        build(raw.get(), false).map_err(de::Error::custom)
    }
}

/// The top-level fields of an object, each as raw text, in order.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    out.push(entry);
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// What the host decodes of `metadata`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lean {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    deletion_timestamp: Option<Time>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    labels: Labels,
}

/// `{"apiVersion":…,"kind":…,` — what every object's text starts with.
fn type_head(api_version: &str, kind: &str) -> String {
    let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
    format!("{{\"apiVersion\":{},\"kind\":{},", q(api_version), q(kind))
}

fn build(text: &str, metadata_only: bool) -> Result<Object, NotAnObject> {
    let bad = |e: serde_json::Error| NotAnObject(e.to_string());
    let fields: Fields<'_> = serde_json::from_str(text).map_err(bad)?;
    let metadata = fields.get("metadata");
    let meta: Fields<'_> = match metadata {
        Some(m) => serde_json::from_str(m.get()).map_err(bad)?,
        None => Fields(Vec::new()),
    };
    let lean: Lean = match metadata {
        Some(m) => serde_json::from_str(m.get()).map_err(bad)?,
        None => serde_json::from_str("{}").map_err(bad)?,
    };
    let string = |name: &str| -> Option<String> {
        serde_json::from_str::<String>(fields.get(name)?.get()).ok()
    };
    let (api_version, kind) = (
        string("apiVersion").unwrap_or_default(),
        string("kind").unwrap_or_default(),
    );

    let depth = nesting(text);
    let undecodable = (depth > MAX_DEPTH).then(|| {
        format!("nested {depth} levels deep, deeper than the {MAX_DEPTH} the host can read")
            .into_boxed_str()
    });
    let metadata_only = metadata_only || undecodable.is_some();

    let head = type_head(&api_version, &kind);
    let mut out = String::with_capacity(text.len());
    out.push_str(&head);
    out.push_str("\"metadata\":{");
    let mut first = true;
    for (k, v) in meta.0.iter().filter(|(k, _)| k != "managedFields") {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        push_entry(&mut out, k, v);
    }
    out.push('}');
    if !metadata_only {
        for (k, v) in fields.0.iter() {
            if matches!(k.as_ref(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            out.push(',');
            push_entry(&mut out, k, v);
        }
    }
    out.push('}');
    let text = RawValue::from_string(out).map_err(bad)?;
    Ok(Object {
        text,
        meta: ObjectMeta {
            name: lean.name,
            namespace: lean.namespace,
            uid: lean.uid,
            resource_version: lean.resource_version,
            generation: lean.generation,
            deletion_timestamp: lean.deletion_timestamp,
            owner_references: lean.owner_references.filter(|o| !o.is_empty()),
            finalizers: lean.finalizers.filter(|f| !f.is_empty()),
            ..ObjectMeta::default()
        },
        labels: lean.labels,
        api_version: api_version.into(),
        kind: kind.into(),
        meta_at: head.len() as u32,
        undecodable,
        metadata_only,
    })
}

fn push_entry(out: &mut String, key: &str, value: &RawValue) {
    out.push_str(&serde_json::to_string(key).expect("a string serialises"));
    out.push(':');
    out.push_str(value.get());
}

/// The deepest nesting of arrays and objects in JSON `text`.
fn nesting(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// An [`Object`] decoded from a full watch or list.
#[derive(Clone, Debug)]
pub struct Full(pub Object);

/// An [`Object`] decoded from a metadata-only watch or list (`PartialObjectMetadata`).
#[derive(Clone, Debug)]
pub struct MetaOnly(pub Object);

impl<'de> Deserialize<'de> for Full {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Object::deserialize(d).map(Full)
    }
}

impl<'de> Deserialize<'de> for MetaOnly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <Box<RawValue>>::deserialize(d)?;
        build(raw.get(), true)
            .map(MetaOnly)
            .map_err(de::Error::custom)
    }
}

macro_rules! dynamic_resource {
    ($t:ty, $metadata_api:expr) => {
        impl Resource for $t {
            type DynamicType = ApiResource;
            type Scope = DynamicResourceScope;

            fn group(dt: &ApiResource) -> Cow<'_, str> {
                DynamicObject::group(dt)
            }
            fn version(dt: &ApiResource) -> Cow<'_, str> {
                DynamicObject::version(dt)
            }
            fn kind(dt: &ApiResource) -> Cow<'_, str> {
                DynamicObject::kind(dt)
            }
            fn api_version(dt: &ApiResource) -> Cow<'_, str> {
                DynamicObject::api_version(dt)
            }
            fn plural(dt: &ApiResource) -> Cow<'_, str> {
                DynamicObject::plural(dt)
            }
            /// Only the fields listed on [`Object`]'s `meta`: enough for a watch to resume.
            fn meta(&self) -> &ObjectMeta {
                &self.0.meta
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.0.meta
            }
            fn metadata_api() -> bool {
                $metadata_api
            }
        }
    };
}

dynamic_resource!(Full, false);
dynamic_resource!(MetaOnly, true);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(depth: usize) -> String {
        format!(
            r#"{{"apiVersion":"test.wasmop.io/v1","kind":"Probe","metadata":{{"name":"deep","uid":"u1"}},"spec":{}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    }

    #[test]
    fn keeps_the_text_without_managed_fields_and_decodes_what_the_host_reads() {
        let obj = Object::from_value(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "a", "uid": "u", "generation": 3,
                "resourceVersion": "7", "labels": {"b": "2", "a": "1"},
                "annotations": {"note": "x"}, "finalizers": ["f"],
                "managedFields": [{"manager": "m"}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "p", "uid": "pu", "controller": true}]},
            "spec": {"replicas": 2}, "status": {"ready": 1}
        }))
        .unwrap();
        assert_eq!(obj.key(), super::super::ObjKey::new(Some("a"), "d"));
        assert_eq!((obj.api_version(), obj.kind()), ("apps/v1", "Deployment"));
        assert_eq!(obj.uid(), Some("u"));
        assert_eq!(obj.generation(), Some(3));
        assert_eq!(obj.resource_version(), Some("7"));
        assert_eq!(obj.finalizers(), ["f"]);
        assert_eq!(obj.controller().unwrap().uid, "pu");
        assert_eq!(
            obj.labels().iter().collect::<Vec<_>>(),
            [("a", "1"), ("b", "2")]
        );
        assert!(!obj.is_deleting());
        assert_eq!(obj.field("status"), Some(json!({"ready": 1})));
        assert_eq!(obj.metadata().annotations.unwrap()["note"], "x");
        let mut expected: Value = serde_json::from_str(obj.json()).unwrap();
        assert!(expected["metadata"].get("managedFields").is_none());
        expected["metadata"]["managedFields"] = json!([{"manager": "m"}]);
        assert_eq!(expected["spec"]["replicas"], 2);
        assert!(obj.heap_bytes() >= obj.json().len());
    }

    #[test]
    fn serialises_as_its_text_and_takes_a_new_type() {
        let obj = Object::from_json(r#"{"metadata":{"name":"p"},"spec":{}}"#).unwrap();
        assert_eq!(obj.kind(), "");
        let typed = obj.with_type(&TypeMeta {
            api_version: "v1".into(),
            kind: "Pod".into(),
        });
        assert_eq!((typed.api_version(), typed.kind()), ("v1", "Pod"));
        assert_eq!(
            serde_json::to_value(&typed).unwrap(),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}})
        );
        let meta = typed.to_metadata_only();
        assert!(meta.is_metadata_only());
        assert_eq!(
            meta.value(),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
        );
    }

    #[test]
    fn an_object_too_deep_keeps_its_metadata_and_says_why() {
        let obj = Object::from_json(&nested(200)).unwrap();
        assert_eq!(obj.name(), "deep");
        assert_eq!(obj.uid(), Some("u1"));
        assert!(obj.undecodable().unwrap().contains("201 levels"), "{obj:?}");
        assert_eq!(obj.field("spec"), None);
        let fine = Object::from_json(&nested(100)).unwrap();
        assert_eq!(fine.undecodable(), None);
        assert!(fine.field("spec").is_some());
    }

    #[test]
    fn a_list_with_one_bad_item_decodes_the_others() {
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"7"}},"items":[{},{}]}}"#,
            nested(300),
            r#"{"apiVersion":"test.wasmop.io/v1","kind":"Probe","metadata":{"name":"fine"},"spec":{"a":1}}"#
        );
        let list: kube::core::ObjectList<Full> = serde_json::from_str(&list).unwrap();
        assert!(list.items[0].0.undecodable().is_some());
        assert_eq!(list.items[1].0.field("spec").unwrap()["a"], 1);
        let line = format!(r#"{{"type":"ADDED","object":{}}}"#, nested(300));
        let event: kube::core::WatchEvent<Full> = serde_json::from_str(&line).unwrap();
        assert!(
            matches!(event, kube::core::WatchEvent::Added(Full(o)) if o.undecodable().is_some())
        );
    }

    #[test]
    fn escaped_keys_and_strings_survive() {
        let obj = Object::from_json(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"a\"b":"[{"}},"data":{"k\\":"]}\"{"}}"#,
        )
        .unwrap();
        assert_eq!(obj.labels().get("a\"b"), Some("[{"));
        assert_eq!(obj.field("data").unwrap()["k\\"], "]}\"{");
        assert_eq!(nesting(obj.json()), 3);
    }

    #[test]
    fn a_metadata_only_decode_drops_the_body() {
        let MetaOnly(obj) = serde_json::from_str(
            r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"p","labels":{"app":"x"}}}"#,
        )
        .unwrap();
        let obj = obj.with_type(&TypeMeta {
            api_version: "v1".into(),
            kind: "Pod".into(),
        });
        assert!(obj.is_metadata_only());
        assert_eq!(
            obj.value(),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "x"}}})
        );
    }
}
