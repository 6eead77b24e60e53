//! Objects the watch cannot decode are kept by their metadata instead of failing the watch.
//!
//! A custom resource with `x-kubernetes-preserve-unknown-fields` can nest deeper than
//! serde_json's recursion limit (128). Decoded as a plain [`DynamicObject`], one such object
//! fails its watch event and every relist of its kind, in every namespace. A [`Lenient`] takes
//! each object as raw JSON first (serde_json skips values without recursing), decodes it in
//! full if it can, and otherwise keeps just its `apiVersion`, `kind` and `metadata`, marked
//! with [`UNDECODABLE_ANNOTATION`] in the host's copy, so the kind keeps its watch and the
//! controller can tell the one bad object apart.

use std::borrow::Cow;

use kube::Resource;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, TypeMeta};
use kube::core::DynamicResourceScope;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// Set, in the host's cached copy only, on an object that could not be decoded; its value is
/// the decoder's error.
pub const UNDECODABLE_ANNOTATION: &str = "wasmop.io/undecodable";

/// A [`DynamicObject`] whose decoding never fails the stream it came in.
#[derive(Debug, Clone)]
pub struct Lenient(pub DynamicObject);

/// Why `obj` could not be decoded, if it could not.
pub fn undecodable(obj: &DynamicObject) -> Option<&str> {
    obj.metadata
        .annotations
        .as_ref()?
        .get(UNDECODABLE_ANNOTATION)
        .map(String::as_str)
}

/// Only what every object has at its top; unknown fields are skipped without recursing.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shallow {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    metadata: ObjectMeta,
}

impl<'de> Deserialize<'de> for Lenient {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <Box<RawValue>>::deserialize(d)?;
        let error = match serde_json::from_str::<DynamicObject>(raw.get()) {
            Ok(obj) => return Ok(Lenient(obj)),
            Err(e) => e,
        };
        let shallow: Shallow = serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
        let mut metadata = shallow.metadata;
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(UNDECODABLE_ANNOTATION.into(), error.to_string());
        Ok(Lenient(DynamicObject {
            types: Some(TypeMeta {
                api_version: shallow.api_version.unwrap_or_default(),
                kind: shallow.kind.unwrap_or_default(),
            }),
            metadata,
            data: serde_json::Value::Object(Default::default()),
        }))
    }
}

impl Resource for Lenient {
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

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

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
    fn an_object_too_deep_keeps_its_metadata_and_says_why() {
        assert!(serde_json::from_str::<DynamicObject>(&nested(200)).is_err());
        let Lenient(obj) = serde_json::from_str(&nested(200)).unwrap();
        assert_eq!(obj.metadata.name.as_deref(), Some("deep"));
        assert_eq!(obj.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(obj.types.as_ref().unwrap().kind, "Probe");
        assert!(
            undecodable(&obj).unwrap().contains("recursion limit"),
            "{:?}",
            obj.metadata
        );
        assert_eq!(obj.data, json!({}));
    }

    #[test]
    fn a_list_with_one_bad_item_decodes_the_others() {
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"7"}},"items":[{},{}]}}"#,
            nested(200),
            r#"{"apiVersion":"test.wasmop.io/v1","kind":"Probe","metadata":{"name":"fine"},"spec":{"a":1}}"#
        );
        let list: kube::core::ObjectList<Lenient> = serde_json::from_str(&list).unwrap();
        assert_eq!(list.items.len(), 2);
        assert!(undecodable(&list.items[0].0).is_some());
        let fine = &list.items[1].0;
        assert_eq!(undecodable(fine), None);
        assert_eq!(fine.data["spec"]["a"], 1);
    }

    #[test]
    fn a_watch_event_with_a_bad_object_decodes() {
        let line = format!(r#"{{"type":"ADDED","object":{}}}"#, nested(300));
        let event: kube::core::WatchEvent<Lenient> = serde_json::from_str(&line).unwrap();
        let kube::core::WatchEvent::Added(Lenient(obj)) = event else {
            panic!("an ADDED event")
        };
        assert!(undecodable(&obj).is_some());
    }
}
