//! Decides whether applying a desired object would change anything, without asking the server.
//!
//! A child is up to date when every field of the desired object has the same value in the
//! observed one (fields the server or other managers added are ignored) *and* the desired
//! object's hash, recorded in [`HASH_ANNOTATION`] at the last apply, still matches. The hash
//! catches what a subset check cannot: a field the plugin stopped setting, which server-side
//! apply would remove.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Annotation holding the hash of the desired object last applied.
pub const HASH_ANNOTATION: &str = "wasmop.io/desired-hash";

/// A short, stable hash of a JSON value.
pub fn hash(value: &Value) -> String {
    let bytes = serde_json::to_vec(value).expect("a JSON value serialises");
    let digest = Sha256::digest(&bytes);
    crate::text::hex(&digest[..8])
}

/// Records the hash of `desired` in its annotations. Call before adding host-managed fields
/// whose values are stable (owner references), so the hash describes the plugin's intent.
pub fn stamp(desired: &mut Value) {
    let h = hash(desired);
    let meta = desired
        .as_object_mut()
        .expect("validated children are objects")
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let annotations = meta
        .as_object_mut()
        .expect("validated metadata is an object")
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(a) = annotations.as_object_mut() {
        a.insert(HASH_ANNOTATION.to_string(), Value::String(h));
    }
}

/// True when every field of `desired` has the same value in `observed`.
///
/// Objects compare key by key; arrays must have the same length and compare element-wise;
/// `null` in `desired` matches a missing field.
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d.iter().all(|(k, dv)| match o.get(k) {
            Some(ov) => is_subset(dv, ov),
            None => dv.is_null() || is_empty_container(dv),
        }),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(dv, ov)| is_subset(dv, ov))
        }
        (Value::Number(d), Value::Number(o)) => d.as_f64() == o.as_f64(),
        (d, o) => d == o,
    }
}

// The server omits empty maps and lists, so `labels: {}` matches a missing `labels`.
fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn server_defaults_do_not_count_as_drift() {
        let desired = json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [
            {"name": "memcached", "ports": [{"containerPort": 11211}]}
        ]}}}});
        let observed = json!({"spec": {"replicas": 3, "strategy": {"type": "RollingUpdate"},
            "template": {"spec": {"containers": [
                {"name": "memcached", "imagePullPolicy": "IfNotPresent",
                 "ports": [{"containerPort": 11211, "protocol": "TCP"}]}
            ]}}}, "status": {"replicas": 3}});
        assert!(is_subset(&desired, &observed));
    }

    #[test]
    fn changed_values_and_list_lengths_are_drift() {
        let desired = json!({"spec": {"replicas": 3, "args": ["-v"]}});
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 1, "args": ["-v"]}})
        ));
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 3, "args": []}})
        ));
        assert!(!is_subset(&desired, &json!({"spec": {"args": ["-v"]}})));
        assert!(is_subset(&json!({"a": 1.0}), &json!({"a": 1})));
        assert!(is_subset(&json!({"a": null, "b": {}}), &json!({})));
    }

    #[test]
    fn stamp_is_stable_and_tracks_content() {
        let mut a = json!({"kind": "Service", "metadata": {"name": "x"}});
        let mut b = a.clone();
        stamp(&mut a);
        stamp(&mut b);
        assert_eq!(a, b);
        let h = a["metadata"]["annotations"][HASH_ANNOTATION]
            .as_str()
            .unwrap();
        assert_eq!(h.len(), 16);
        let mut c = json!({"kind": "Service", "metadata": {"name": "y"}});
        stamp(&mut c);
        assert_ne!(c["metadata"]["annotations"][HASH_ANNOTATION], h);
    }
}
