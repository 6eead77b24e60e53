//! Declaring the parent kind once, and the CustomResourceDefinition written from it.
//!
//! [`custom_resource!`](crate::custom_resource) turns a spec type and a status type into the
//! parent struct (`metadata`, `spec`, `status`), its k8s-openapi [`Resource`] identity and a
//! [`CustomResource`] impl. [`Crd`] then writes the CRD from those types with schemars, adding
//! what the host writes on every parent: `status.observedGeneration` and standard conditions
//! (with `lastTransitionTime` and the host's `Ready`). Schema generation runs natively (a test,
//! an example, a build step); a wasm build links none of it because nothing there calls it.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use wasmop_guest::schemars::{self, JsonSchema};
//! use wasmop_guest::{Condition, Crd};
//!
//! /// `Greeting.spec`.
//! #[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
//! pub struct GreetingSpec {
//!     /// What to write.
//!     pub text: String,
//! }
//!
//! /// `Greeting.status`.
//! #[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
//! pub struct GreetingStatus {
//!     /// Standard conditions.
//!     #[serde(default)]
//!     pub conditions: Vec<Condition>,
//! }
//!
//! wasmop_guest::custom_resource! {
//!     /// A greeting, written into a ConfigMap.
//!     pub struct Greeting("example.com", "v1", "greetings", GreetingSpec, GreetingStatus);
//! }
//!
//! let g = Greeting::new("hi", GreetingSpec { text: "hello".into() });
//! assert_eq!(g.metadata.namespace.as_deref(), Some("default"));
//!
//! let crd = Crd::of::<Greeting>().column("Text", "string", ".spec.text").to_json();
//! assert_eq!(crd["metadata"]["name"], "greetings.example.com");
//! let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
//! assert_eq!(status["properties"]["observedGeneration"]["format"], "int64");
//! assert_eq!(status["properties"]["conditions"]["items"]["required"][0], "lastTransitionTime");
//! assert!(status.get("required").is_none(), "the host may write Ready alone");
//! ```

use std::any::TypeId;

use k8s_openapi::{NamespaceResourceScope, Resource};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};

use crate::response::Condition;

/// A parent kind declared with [`custom_resource!`](crate::custom_resource): its spec and
/// status types, which the CRD's schema is written from.
pub trait CustomResource: Resource + 'static {
    /// `spec`.
    type Spec: JsonSchema;
    /// `status`, as the plugin writes it (the host's fields are added to the schema).
    type Status: JsonSchema;
    /// The doc comment on the declaration: the CRD's description.
    const DESCRIPTION: &'static str;
}

/// Declares a parent kind: `pub struct Name(group, version, plural, Spec, Status);`.
///
/// The struct has `metadata`, `spec` and an optional `status`; it implements serde's traits,
/// k8s-openapi's [`Resource`](k8s_openapi::Resource) (namespaced; add `cluster` after the
/// status type for a cluster-scoped kind) and [`CustomResource`], and has
/// `Name::new(name, spec)` for tests and `name()`. Only doc comments may precede `struct`.
/// The plugin crate needs `serde` with `derive`, and the SDK under its own name,
/// `wasmop_guest`. A status that does not fit reads as `None` ([`lenient_status`]).
#[macro_export]
macro_rules! custom_resource {
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident(
            $group:literal, $version:literal, $plural:literal, $spec:ty, $status:ty $(, $cluster:ident)? $(,)?
        );
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, ::serde::Serialize, ::serde::Deserialize)]
        $vis struct $name {
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: $crate::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            /// The desired state.
            pub spec: $spec,
            /// The observed state, as last written by the host; `None` when absent or when it
            /// does not fit the status type (see [`lenient_status`](wasmop_guest::resource::lenient_status)).
            #[serde(
                default,
                skip_serializing_if = "Option::is_none",
                deserialize_with = "::wasmop_guest::resource::lenient_status"
            )]
            pub status: ::core::option::Option<$status>,
        }

        impl $name {
            /// `metadata.name`, or `""`.
            #[allow(dead_code)]
            pub fn name(&self) -> &str {
                self.metadata.name.as_deref().unwrap_or_default()
            }

            /// A parent named `name` in the `default` namespace, without status.
            #[allow(dead_code)]
            pub fn new(name: &str, spec: $spec) -> Self {
                Self {
                    metadata: $crate::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.into()),
                        namespace: $crate::__scope_namespace!($($cluster)?),
                        ..::core::default::Default::default()
                    },
                    spec,
                    status: None,
                }
            }
        }

        impl $crate::k8s_openapi::Resource for $name {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = stringify!($name);
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $crate::__scope_type!($($cluster)?);
        }

        impl $crate::CustomResource for $name {
            type Spec = $spec;
            type Status = $status;
            const DESCRIPTION: &'static str = concat!($($doc, "\n"),*);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scope_type {
    () => {
        $crate::k8s_openapi::NamespaceResourceScope
    };
    (cluster) => {
        $crate::k8s_openapi::ClusterResourceScope
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scope_namespace {
    () => {
        Some("default".into())
    };
    (cluster) => {
        None
    };
}

/// Reads a parent's `status` as `T`, or `None` when it is absent or does not fit.
///
/// The host writes partial statuses (`Ready=False` alone when a call failed, or what an older
/// build wrote): a status that does not fit must not make the parent unreadable, or the plugin
/// could never fix it. Plugins rarely read their own status; this keeps it best-effort.
pub fn lenient_status<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Option::<Value>::deserialize(deserializer)?;
    Ok(value.and_then(|v| T::deserialize(v).ok()))
}

/// One additional printer column (`kubectl get` output).
#[derive(Debug, Clone)]
struct Column {
    name: String,
    type_: String,
    json_path: String,
}

/// Writes the CustomResourceDefinition of a [`CustomResource`].
///
/// The schema is the spec's and the status's, inlined (Kubernetes takes no `$ref`), plus
/// `status.observedGeneration` and `status.conditions` as the host writes them. `Ready` and
/// `Age` columns come last.
#[derive(Debug, Clone)]
pub struct Crd {
    kind: &'static str,
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    namespaced: bool,
    description: String,
    spec: Value,
    status: Value,
    columns: Vec<Column>,
    short_names: Vec<String>,
    // The scale subresource: the spec's and the status's replica counts.
    scale: Option<(String, String)>,
}

impl Crd {
    /// The CRD of `K`, from its spec and status types.
    pub fn of<K: CustomResource>() -> Self {
        let mut generator = SchemaSettings::openapi3()
            .with(|s| {
                s.inline_subschemas = true;
                s.meta_schema = None;
            })
            .into_generator();
        Self {
            kind: K::KIND,
            group: K::GROUP,
            version: K::VERSION,
            plural: K::URL_PATH_SEGMENT,
            namespaced: TypeId::of::<K::Scope>() == TypeId::of::<NamespaceResourceScope>(),
            description: doc_text(K::DESCRIPTION),
            spec: clean(K::Spec::json_schema(&mut generator).to_value()),
            status: clean(K::Status::json_schema(&mut generator).to_value()),
            columns: Vec::new(),
            short_names: Vec::new(),
            scale: None,
        }
    }

    /// Adds the scale subresource (`kubectl scale`, autoscalers): the paths of the replica
    /// counts the spec asks for and the status reports, as `.spec.replicas`.
    #[must_use]
    pub fn scale(mut self, spec_replicas: &str, status_replicas: &str) -> Self {
        self.scale = Some((spec_replicas.into(), status_replicas.into()));
        self
    }

    /// Adds a printer column: `type_` is `string`, `integer`, `number`, `boolean` or `date`.
    #[must_use]
    pub fn column(mut self, name: &str, type_: &str, json_path: &str) -> Self {
        self.columns.push(Column {
            name: name.into(),
            type_: type_.into(),
            json_path: json_path.into(),
        });
        self
    }

    /// Adds a short name (`kubectl get mc`).
    #[must_use]
    pub fn short_name(mut self, name: &str) -> Self {
        self.short_names.push(name.into());
        self
    }

    /// The CRD as JSON, ready for `kubectl apply -f` (JSON is YAML).
    pub fn to_json(&self) -> Value {
        let mut status = self.status.clone();
        // The host writes partial statuses (Ready alone when a call fails): nothing is required.
        if let Some(s) = status.as_object_mut() {
            s.remove("required");
        }
        let props = status
            .as_object_mut()
            .map(|s| {
                s.insert("type".into(), json!("object"));
                s.entry("properties").or_insert_with(|| json!({}))
            })
            .and_then(Value::as_object_mut);
        if let Some(props) = props {
            props.insert(
                "observedGeneration".into(),
                json!({
                    "description": "The generation the host last reconciled.",
                    "type": "integer", "format": "int64",
                }),
            );
            props.insert("conditions".into(), conditions_schema());
        }
        let mut columns: Vec<Value> = self
            .columns
            .iter()
            .map(|c| json!({"name": c.name, "type": c.type_, "jsonPath": c.json_path}))
            .collect();
        columns.push(json!({
            "name": "Ready", "type": "string",
            "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status",
        }));
        columns.push(
            json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}),
        );

        let mut root = Map::new();
        if !self.description.is_empty() {
            root.insert("description".into(), json!(self.description));
        }
        root.insert("type".into(), json!("object"));
        root.insert("required".into(), json!(["spec"]));
        root.insert(
            "properties".into(),
            json!({
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": self.spec,
                "status": status,
            }),
        );
        let mut names = json!({
            "kind": self.kind,
            "listKind": format!("{}List", self.kind),
            "plural": self.plural,
            "singular": self.kind.to_lowercase(),
        });
        if !self.short_names.is_empty() {
            names["shortNames"] = json!(self.short_names);
        }
        let mut subresources = json!({"status": {}});
        if let Some((spec, status)) = &self.scale {
            subresources["scale"] = json!({"specReplicasPath": spec, "statusReplicasPath": status});
        }
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{}.{}", self.plural, self.group)},
            "spec": {
                "group": self.group,
                "names": names,
                "scope": if self.namespaced { "Namespaced" } else { "Cluster" },
                "versions": [{
                    "name": self.version,
                    "served": true,
                    "storage": true,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": Value::Object(root)},
                }],
            },
        })
    }

    /// The CRD as pretty JSON with a trailing newline, for a file or `kubectl apply -f -`.
    pub fn to_string_pretty(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.to_json()).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// Joins doc-comment lines (each with its leading space) into one paragraph.
fn doc_text(doc: &str) -> String {
    doc.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Drops what a CRD schema should not hold: `$schema`, `title`, and the `default`s that
/// `#[serde(default)]` adds (serde applies them in the plugin; in the CRD the API server would
/// write them into every object). Property names are left alone. What JSON Schema says in
/// ways a structural schema may not is said the Kubernetes way ([`structural`]).
fn clean(mut value: Value) -> Value {
    match &mut value {
        Value::Object(map) => {
            map.remove("$schema");
            map.remove("title");
            map.remove("default");
            structural(map);
            for (key, v) in map.iter_mut() {
                match (key.as_str(), v) {
                    ("properties", Value::Object(props)) => {
                        for p in props.values_mut() {
                            *p = clean(std::mem::take(p));
                        }
                    }
                    ("enum" | "required", _) => {}
                    (_, v) => *v = clean(std::mem::take(v)),
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                *v = clean(std::mem::take(v));
            }
        }
        _ => {}
    }
    value
}

/// Rewrites one schema node the way a structural schema says it (the API server refuses the
/// JSON Schema forms): `type: [T, "null"]` (an `Option<T>`) becomes `type: T` with `nullable`;
/// `anyOf`/`oneOf` of a schema and `null` (an `Option` of a struct or an enum) becomes that
/// schema with `nullable`; a `oneOf` of string constants (an enum whose variants carry docs)
/// becomes an `enum` of strings; a `const` becomes a one-value `enum`.
fn structural(map: &mut Map<String, Value>) {
    let is_null = |v: &Value| {
        v.get("type") == Some(&json!("null"))
            || (v.get("nullable") == Some(&json!(true)) && v.get("const") == Some(&Value::Null))
    };
    if let Some(Value::Array(types)) = map.get("type") {
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if rest.len() < types.len() {
            map.insert("nullable".into(), json!(true));
        }
        if let [one] = rest.as_slice() {
            map.insert("type".into(), one.clone());
        }
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = map.get(key) else {
            continue;
        };
        let rest: Vec<Value> = branches.iter().filter(|b| !is_null(b)).cloned().collect();
        if let ([one], true) = (rest.as_slice(), rest.len() < branches.len()) {
            let Value::Object(inner) = one.clone() else {
                continue;
            };
            map.remove(key);
            for (k, v) in inner {
                // The field's own description wins over its type's; what `clean` drops stays
                // dropped.
                if !["$schema", "title", "default"].contains(&k.as_str()) {
                    map.entry(k).or_insert(v);
                }
            }
            map.insert("nullable".into(), json!(true));
            structural(map);
            return;
        }
        let strings: Option<Vec<Vec<Value>>> = branches
            .iter()
            .map(|b| match (b.get("type"), b.get("const"), b.get("enum")) {
                (Some(t), Some(c), _) if t == "string" => Some(vec![c.clone()]),
                (Some(t), None, Some(Value::Array(e))) if t == "string" => Some(e.clone()),
                _ => None,
            })
            .collect();
        if let Some(values) = strings {
            map.remove(key);
            map.insert("type".into(), json!("string"));
            map.insert("enum".into(), Value::Array(values.concat()));
        }
    }
    if map.get("const") == Some(&Value::Null) {
        map.remove("const");
    } else if let Some(value) = map.remove("const") {
        map.insert("enum".into(), json!([value]));
    }
    // The API server checks a null against an enum even when it is nullable, and refuses it;
    // a field that is not nullable has its null dropped before validation instead, which
    // reads as `None` all the same.
    if map.contains_key("enum") {
        map.remove("nullable");
    }
}

/// `status.conditions` as the host writes it: a list keyed by `type`, each with the fields
/// Kubernetes' own `metav1.Condition` requires.
fn conditions_schema() -> Value {
    json!({
        "description": "Standard conditions: the plugin's, and Ready from the host. The host stamps lastTransitionTime and observedGeneration.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": Condition::schema_value(),
    })
}

impl Condition {
    fn schema_value() -> Value {
        json!({
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "type": {
                    "type": "string", "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                },
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {
                    "type": "string", "minLength": 1, "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                },
                "message": {"type": "string", "maxLength": 32768},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
            },
        })
    }
}

impl JsonSchema for Condition {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Condition".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        Schema::try_from(Condition::schema_value()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_lines_join() {
        assert_eq!(doc_text(" A thing.\n with more.\n"), "A thing. with more.");
    }

    /// Every field type the guide recommends, as a spec.
    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Everything {
        /// A plain field.
        size: i32,
        /// Absent or a number.
        replicas: Option<u32>,
        /// Absent or a struct.
        tls: Option<Nested>,
        labels: std::collections::BTreeMap<String, String>,
        #[serde(default)]
        ports: Vec<Nested>,
        tier: Tier,
        mode: Option<Tier>,
        /// Defaulted in the plugin.
        #[serde(default = "ten")]
        timeout: u64,
    }

    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Nested {
        name: String,
        port: Option<u16>,
    }

    /// A unit enum whose variants carry docs.
    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    enum Tier {
        /// Small.
        Small,
        /// Large.
        Large,
        Huge,
    }

    fn ten() -> u64 {
        10
    }

    /// What a structural schema may not hold, anywhere below `v`.
    fn unstructural(v: &Value, at: &str, found: &mut Vec<String>) {
        let Value::Object(map) = v else {
            if let Value::Array(items) = v {
                items.iter().for_each(|i| unstructural(i, at, found));
            }
            return;
        };
        for key in ["anyOf", "oneOf", "allOf", "const", "$ref", "default"] {
            if map.contains_key(key) {
                found.push(format!("{at}: {key}"));
            }
        }
        if map.get("type").is_some_and(|t| !t.is_string()) {
            found.push(format!("{at}: type {}", map["type"]));
        }
        for (k, child) in map {
            if k != "enum" && k != "required" {
                unstructural(child, &format!("{at}.{k}"), found);
            }
        }
    }

    #[test]
    fn every_recommended_field_type_gives_a_structural_schema() {
        let mut generator = SchemaSettings::openapi3()
            .with(|s| {
                s.inline_subschemas = true;
                s.meta_schema = None;
            })
            .into_generator();
        let spec = clean(Everything::json_schema(&mut generator).to_value());
        let mut found = Vec::new();
        unstructural(&spec, "spec", &mut found);
        assert!(found.is_empty(), "{found:?}\n{spec:#}");
        let props = &spec["properties"];
        assert_eq!(props["replicas"]["type"], "integer");
        assert_eq!(props["replicas"]["nullable"], true);
        assert_eq!(props["tls"]["type"], "object");
        assert_eq!(props["tls"]["nullable"], true);
        assert_eq!(props["tls"]["description"], "Absent or a struct.");
        assert_eq!(props["tls"]["properties"]["port"]["nullable"], true);
        let variants = |v: &Value| {
            let mut names: Vec<String> = v["enum"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect();
            names.sort();
            names
        };
        assert_eq!(props["tier"]["type"], "string");
        assert_eq!(variants(&props["tier"]), ["Huge", "Large", "Small"]);
        assert!(
            props["mode"].get("nullable").is_none(),
            "a null enum is dropped by the API server, not checked against the enum"
        );
        assert_eq!(variants(&props["mode"]), ["Huge", "Large", "Small"]);
        assert_eq!(props["labels"]["additionalProperties"]["type"], "string");
        assert!(props["timeout"].get("default").is_none());
    }

    #[test]
    fn clean_strips_nested_keys() {
        let v = clean(json!({
            "$schema": "x", "title": "t",
            "properties": {"title": {"default": 1, "type": "integer"}},
        }));
        assert_eq!(v, json!({"properties": {"title": {"type": "integer"}}}));
    }
}
