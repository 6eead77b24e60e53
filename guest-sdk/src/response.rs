//! Building the answer to one reconcile: desired children, status, Events, requeue, finalized.
//!
//! [`Response`] is a by-value builder. Serialising a value can fail only for hand-written types;
//! such a failure is kept and returned as the reconcile's error, so the chain stays free of `?`.

use std::time::Duration;

use k8s_openapi::Resource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::wire::{EventType, WireEvent, WireResponse};

/// The desired state a plugin returns.
///
/// Children the parent controls but that are missing from the response are deleted by the
/// host, so a response lists *every* child the parent should have.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct Response {
    wire: WireResponse,
    error: Option<Error>,
}

impl Response {
    /// No children, status untouched, no Events.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a desired child. `apiVersion` and `kind` come from `K` when the serialised object
    /// lacks them (k8s-openapi types always write them).
    pub fn child<K: Resource + Serialize>(mut self, obj: K) -> Self {
        match serde_json::to_value(&obj) {
            Ok(Value::Object(mut map)) => {
                for (field, value) in [("apiVersion", K::API_VERSION), ("kind", K::KIND)] {
                    map.entry(field).or_insert_with(|| value.into());
                }
                self.wire.children.push(Value::Object(map));
            }
            Ok(_) => self.fail(Error::msg(format!("child {}: not a JSON object", K::KIND))),
            Err(e) => self.fail(Error::from(e).context(format!("child {}", K::KIND))),
        }
        self
    }

    /// Adds a desired child given as JSON; it must carry `apiVersion`, `kind` and
    /// `metadata.name`.
    pub fn child_json(mut self, obj: Value) -> Self {
        let has = |ptr: &str| {
            obj.pointer(ptr)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        if has("/apiVersion") && has("/kind") && has("/metadata/name") {
            self.wire.children.push(obj);
        } else {
            self.fail(Error::msg(
                "child: apiVersion, kind and metadata.name are required",
            ));
        }
        self
    }

    /// Replaces the parent's `.status`. The host adds `observedGeneration` and writes the
    /// status only when it changed, so keep it deterministic (no clocks, sorted lists).
    pub fn status(mut self, status: impl Serialize) -> Self {
        match serde_json::to_value(status) {
            Ok(v) => self.wire.status = Some(v),
            Err(e) => self.fail(Error::from(e).context("status")),
        }
        self
    }

    /// Reconcile again after this long even if nothing changes; rounded up to whole seconds,
    /// at least one.
    pub fn requeue_after(mut self, after: Duration) -> Self {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.wire.requeue_after_seconds = Some(secs.max(1));
        self
    }

    /// Records a Kubernetes Event on the parent. `reason` is short UpperCamelCase.
    pub fn event(
        mut self,
        type_: EventType,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        self.wire.events.push(WireEvent {
            type_,
            reason: reason.into(),
            message: message.into(),
        });
        self
    }

    /// Records a `Normal` Event on the parent.
    pub fn normal(self, reason: impl Into<String>, message: impl Into<String>) -> Self {
        self.event(EventType::Normal, reason, message)
    }

    /// Records a `Warning` Event on the parent.
    pub fn warning(self, reason: impl Into<String>, message: impl Into<String>) -> Self {
        self.event(EventType::Warning, reason, message)
    }

    /// While finalizing: cleanup is complete, the host may remove the finalizer.
    pub fn finalized(mut self) -> Self {
        self.wire.finalized = true;
        self
    }

    /// The wire form, or the first error met while building.
    pub fn into_wire(self) -> Result<WireResponse> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.wire),
        }
    }

    fn fail(&mut self, err: Error) {
        self.error.get_or_insert(err);
    }
}

/// A standard Kubernetes condition (`status.conditions[]`) without the clock.
///
/// Leave `last_transition_time` out: the host keeps the previous time while the condition's
/// status holds and stamps the current time when it flips, so the plugin stays deterministic.
/// The host also fills a missing `observed_generation` with the parent's generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// UpperCamelCase type, e.g. `Available`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// UpperCamelCase cause of the status.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
    /// The parent's generation the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the status last changed (RFC 3339); normally left to the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

impl Condition {
    /// A `True` or `False` condition.
    pub fn new(
        type_: impl Into<String>,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.to_owned(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
            last_transition_time: None,
        }
    }

    /// Sets `observedGeneration`, usually to [`crate::Request::generation`].
    #[must_use]
    pub fn observed_generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    #[test]
    fn child_carries_api_version_and_kind() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let wire = Response::new().child(cm).into_wire().unwrap();
        assert_eq!(wire.children[0]["apiVersion"], "v1");
        assert_eq!(wire.children[0]["kind"], "ConfigMap");
    }

    #[test]
    fn bad_json_child_is_the_error() {
        let err = Response::new()
            .child_json(json!({"kind": "ConfigMap"}))
            .into_wire()
            .unwrap_err();
        assert!(err.message().contains("apiVersion"), "{err}");
    }

    #[test]
    fn requeue_rounds_up() {
        let r = Response::new().requeue_after(Duration::from_millis(1500));
        assert_eq!(r.into_wire().unwrap().requeue_after_seconds, Some(2));
        let r = Response::new().requeue_after(Duration::ZERO);
        assert_eq!(r.into_wire().unwrap().requeue_after_seconds, Some(1));
    }
}
