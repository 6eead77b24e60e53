//! A hash that stays the same across builds, platforms and runs: for an annotation that must
//! change exactly when some input does, such as a config hash on a Deployment's pod template
//! that rolls its pods when their ConfigMap changes. std's hashers are seeded per process or
//! unspecified between releases, so they cannot serve.
//!
//! [`stable_hash`] is FNV-1a (64-bit) over the value's JSON with object keys sorted, so equal
//! values hash equally whatever map type or field order built them.
//!
//! ```
//! use serde_json::json;
//! use wasmop_guest::hash::stable_hash;
//!
//! let a = stable_hash(&json!({"b": 1, "a": [1, 2]}));
//! assert_eq!(a, stable_hash(&json!({"a": [1, 2], "b": 1})));
//! assert_ne!(a, stable_hash(&json!({"a": [2, 1], "b": 1})));
//! assert_eq!(a.len(), 16);
//! ```

use serde::Serialize;
use serde_json::Value;

/// FNV-1a, 64-bit, of `bytes` (the contract's, which the host shards by too).
pub use wasmop_contract::hash::fnv1a64;

/// 16 hex digits of FNV-1a over `value`'s JSON, object keys sorted.
///
/// # Panics
///
/// If `value` does not serialise to JSON (a map with non-string keys).
pub fn stable_hash(value: &impl Serialize) -> String {
    let value = serde_json::to_value(value).expect("the value serialises to JSON");
    let mut text = String::new();
    canonical(&value, &mut text);
    format!("{:016x}", fnv1a64(text.as_bytes()))
}

fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[test]
    fn equal_maps_hash_equally() {
        let hashed: HashMap<&str, i32> = (0..50)
            .map(|i| (["k", "l", "m"][i % 3], i as i32))
            .collect();
        let sorted: BTreeMap<&str, i32> = hashed.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(stable_hash(&hashed), stable_hash(&sorted));
        // Fixed for good: an annotation written by one build must match the next one's.
        assert_eq!(
            stable_hash(&serde_json::json!({"a": 1})),
            format!("{:016x}", fnv1a64(br#"{"a":1}"#))
        );
    }
}
