//! The parent's status: what the plugin returned, plus what the host adds, written only when
//! it changed.
//!
//! The host adds `observedGeneration`, a `Ready` condition (True after a successful reconcile,
//! False with the failure's reason otherwise, its message naming the plugin version), and a
//! `lastTransitionTime` on any condition that lacks one: plugins have no clock, so the host
//! keeps the previous time while a condition's status holds and stamps the current time when
//! it flips.

use kube::api::{Api, DynamicObject, Patch, PatchParams};

use crate::watch::Object;
use serde_json::{Map, Value, json};

/// The condition type the host maintains.
pub const READY: &str = "Ready";

/// The host's verdict on the last reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// Whether it succeeded.
    pub ok: bool,
    /// UpperCamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// `Ready=True` after a successful reconcile by `by` (a version, as `Loaded::describe` says it).
pub fn reconciled(by: &str) -> Ready {
    Ready {
        ok: true,
        reason: "Reconciled".into(),
        message: format!("reconciled by {by}"),
    }
}

/// The status to write: `plugin` (or, when the plugin said nothing or failed, the `observed`
/// status) with the host's fields merged in. `now` is an RFC 3339 time.
pub fn desired(
    observed: Option<&Value>,
    plugin: Option<&Value>,
    generation: Option<i64>,
    ready: &Ready,
    now: &str,
) -> Value {
    let mut status = match plugin.or(observed) {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    if let Some(g) = generation {
        status.insert("observedGeneration".into(), json!(g));
    }
    let mut conditions: Vec<Value> = match status.remove("conditions") {
        Some(Value::Array(c)) => c,
        _ => Vec::new(),
    };
    conditions.retain(|c| c["type"] != READY);
    conditions.push(json!({
        "type": READY,
        "status": if ready.ok { "True" } else { "False" },
        "reason": ready.reason,
        "message": ready.message,
    }));
    let previous = observed
        .and_then(|s| s["conditions"].as_array())
        .cloned()
        .unwrap_or_default();
    for c in &mut conditions {
        let Some(c) = c.as_object_mut() else { continue };
        if let Some(g) = generation {
            c.entry("observedGeneration").or_insert(json!(g));
        }
        if c.get("lastTransitionTime").is_some_and(|t| !t.is_null()) {
            continue;
        }
        let same = previous
            .iter()
            .find(|p| p["type"] == c["type"] && p["status"] == c["status"]);
        let time = same
            .and_then(|p| p.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        c.insert("lastTransitionTime".into(), time);
    }
    status.insert("conditions".into(), Value::Array(conditions));
    Value::Object(status)
}

/// Writes `status` through the status subresource unless `parent` already has it.
/// Returns whether a write was made.
pub async fn write(
    api: &Api<DynamicObject>,
    parent: &Object,
    status: Value,
    field_manager: &str,
) -> Result<bool, kube::Error> {
    if parent.field("status").as_ref() == Some(&status) {
        return Ok(false);
    }
    let patch = json!({
        "apiVersion": parent.api_version(),
        "kind": parent.kind(),
        "status": status,
    });
    let name = parent.name();
    api.patch_status(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(true)
}

/// The current time in RFC 3339, to the second, as Kubernetes writes it.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .expect("rounding to seconds")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Ready {
        Ready {
            ok: true,
            reason: "Reconciled".into(),
            message: "memcached 0.1.0".into(),
        }
    }

    #[test]
    fn adds_generation_ready_and_transition_times() {
        let plugin = json!({"nodes": ["a"], "conditions": [{"type": "Available", "status": "True", "reason": "Ready"}]});
        let s = desired(None, Some(&plugin), Some(4), &ok(), "2026-01-01T00:00:00Z");
        assert_eq!(s["observedGeneration"], 4);
        assert_eq!(s["nodes"], json!(["a"]));
        let c = s["conditions"].as_array().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(c[0]["observedGeneration"], 4);
        assert_eq!(c[1]["type"], "Ready");
        assert_eq!(c[1]["status"], "True");
    }

    #[test]
    fn steady_state_is_a_fixed_point() {
        let plugin = json!({"nodes": ["a"], "conditions": [{"type": "Available", "status": "True", "reason": "Ready"}]});
        let first = desired(None, Some(&plugin), Some(1), &ok(), "2026-01-01T00:00:00Z");
        let again = desired(
            Some(&first),
            Some(&plugin),
            Some(1),
            &ok(),
            "2026-02-02T00:00:00Z",
        );
        assert_eq!(first, again, "no change, so nothing to write");
    }

    #[test]
    fn failure_keeps_the_plugin_status_and_flips_ready() {
        let observed = desired(
            None,
            Some(&json!({"nodes": ["a"]})),
            Some(1),
            &ok(),
            "2026-01-01T00:00:00Z",
        );
        let failed = Ready {
            ok: false,
            reason: "PluginTrapped".into(),
            message: "memcached 0.2.0 trapped".into(),
        };
        let s = desired(
            Some(&observed),
            None,
            Some(1),
            &failed,
            "2026-03-03T00:00:00Z",
        );
        assert_eq!(s["nodes"], json!(["a"]));
        let ready = &s["conditions"][0];
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "PluginTrapped");
        assert_eq!(ready["lastTransitionTime"], "2026-03-03T00:00:00Z");
    }
}
