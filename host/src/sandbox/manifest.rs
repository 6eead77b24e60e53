//! The edge between the generated WIT bindings and the contract's manifest and selector
//! types (`wasmop_contract`): conversions, and the checks a selector from `related` must pass
//! before the host uses it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use wasmop_contract::{KindRef, Manifest, RelatedKind, RelatedSelector};

use super::bindings::exports::wasmop::plugin::reconciler as wit;

/// A manifest from its WIT record.
pub(crate) fn from_wit(m: wit::PluginManifest) -> Manifest {
    Manifest {
        name: m.name,
        version: m.version,
        parent: KindRef::new(m.parent.api_version, m.parent.kind),
        children: m
            .children
            .into_iter()
            .map(|k| KindRef::new(k.api_version, k.kind))
            .collect(),
        related: m
            .related
            .into_iter()
            .map(|r| RelatedKind {
                api_version: r.api_version,
                kind: r.kind,
                metadata_only: r.metadata_only,
            })
            .collect(),
        finalizer: m.finalizer,
        clock_seconds: m.clock_seconds,
    }
}

/// Why a selector from `related` was refused.
#[derive(Debug)]
pub(crate) enum SelectorProblem {
    /// The label selector is not JSON of a `LabelSelector`.
    Json(String),
    /// Parsed, but breaks a rule.
    Invalid(String),
}

/// Parses one selector returned by `related` and checks it against the manifest.
pub(crate) fn selector_from_wit(
    manifest: &Manifest,
    wire: wit::RelatedSelector,
) -> Result<RelatedSelector, SelectorProblem> {
    let kind = KindRef::new(wire.api_version, wire.kind);
    let label_selector: LabelSelector = serde_json::from_str(&wire.label_selector)
        .map_err(|e| SelectorProblem::Json(format!("label selector for {kind}: {e}")))?;
    if manifest.related_kind(&kind).is_none() {
        return Err(SelectorProblem::Invalid(format!(
            "selector for {kind}, which the manifest does not declare as a related kind"
        )));
    }
    if let Err(e) = kube::core::Selector::try_from(label_selector.clone()) {
        return Err(SelectorProblem::Invalid(format!(
            "label selector for {kind}: {e}"
        )));
    }
    Ok(RelatedSelector {
        kind,
        label_selector,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest::new("memcached", "0.1.0")
            .parent_raw("cache.example.com/v1alpha1", "Memcached")
            .related_raw("v1", "Pod", true)
    }

    #[test]
    fn selectors_are_checked_against_the_manifest() {
        let m = manifest();
        let wire = |kind: &str, json: &str| wit::RelatedSelector {
            api_version: "v1".into(),
            kind: kind.into(),
            label_selector: json.into(),
        };
        let ok = selector_from_wit(&m, wire("Pod", r#"{"matchLabels":{"app":"x"}}"#)).unwrap();
        assert_eq!(ok.kind, KindRef::new("v1", "Pod"));
        assert!(matches!(
            selector_from_wit(&m, wire("Pod", "{nope")),
            Err(SelectorProblem::Json(_))
        ));
        assert!(matches!(
            selector_from_wit(&m, wire("Secret", "{}")),
            Err(SelectorProblem::Invalid(_))
        ));
        let bad_op = r#"{"matchExpressions":[{"key":"a","operator":"Near"}]}"#;
        assert!(matches!(
            selector_from_wit(&m, wire("Pod", bad_op)),
            Err(SelectorProblem::Invalid(_))
        ));
    }
}
