//! The child kinds each plugin has had, kept across host restarts.
//!
//! A version that drops a child kind still has children of that kind out there, and only the
//! host knows they were the plugin's. The host records every plugin's child kinds, declared and
//! retired, in the ConfigMap [`LEDGER`] of its own namespace, one key per plugin ConfigMap, so
//! a host that starts after the swap — or was down during it — still prunes them. The record
//! is input like any ConfigMap: it is bounded, and a kind in it only widens what the plugin
//! prunes among its own children (labelled with its name, controlled by its parents).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use wasmop_contract::KindRef;

/// The ConfigMap, in the host's namespace.
pub const LEDGER: &str = "wasmop-child-kinds";
/// Kinds kept per plugin; more are dropped, oldest retired first.
pub const MAX_KINDS: usize = 32;

/// Reads and writes [`LEDGER`].
#[derive(Clone)]
pub struct Ledger {
    api: Api<ConfigMap>,
}

/// One `apiVersion kind` per line.
pub fn format(kinds: &[KindRef]) -> String {
    kinds
        .iter()
        .map(|k| format!("{} {}\n", k.api_version, k.kind))
        .collect()
}

/// The kinds in `text`: well-formed lines only, at most [`MAX_KINDS`].
pub fn parse(text: &str) -> Vec<KindRef> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (api_version, kind) = (words.next()?, words.next()?);
            let plausible = |w: &str| w.len() <= 253 && w.chars().all(|c| c.is_ascii_graphic());
            (words.next().is_none() && plausible(api_version) && plausible(kind))
                .then(|| KindRef::new(api_version, kind))
        })
        .take(MAX_KINDS)
        .collect()
}

impl Ledger {
    /// The ledger in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Ledger {
            api: Api::namespaced(client, namespace),
        }
    }

    /// The kinds recorded for `configmap` (none without a record); `None` when the record
    /// cannot be read, so that it is not overwritten either.
    pub async fn read(&self, configmap: &str) -> Option<Vec<KindRef>> {
        match self.api.get_opt(LEDGER).await {
            Ok(cm) => Some(
                cm.and_then(|cm| cm.data?.remove(configmap))
                    .map(|text| parse(&text))
                    .unwrap_or_default(),
            ),
            Err(e) => {
                tracing::warn!(configmap, error = %e, "could not read the child kinds on record");
                None
            }
        }
    }

    /// Records `kinds` for `configmap`; `None` removes its record.
    pub async fn write(&self, configmap: &str, kinds: Option<&[KindRef]>) {
        let value = kinds.map(format);
        let patch = json!({"data": {configmap: value}});
        let result = match self
            .api
            .patch(LEDGER, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 && value.is_some() => {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": LEDGER, "labels": {"app.kubernetes.io/part-of": "wasmop"}},
                    "data": {configmap: value},
                }))
                .expect("a ConfigMap");
                self.api
                    .create(&PostParams::default(), &cm)
                    .await
                    .map(|_| ())
            }
            r => r.map(|_| ()),
        };
        if let Err(e) = result {
            tracing::warn!(configmap, error = %e, "could not record the plugin's child kinds");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_is_bounded() {
        let kinds = vec![
            KindRef::new("apps/v1", "Deployment"),
            KindRef::new("v1", "Service"),
        ];
        assert_eq!(format(&kinds), "apps/v1 Deployment\nv1 Service\n");
        assert_eq!(parse(&format(&kinds)), kinds);
        let hostile = "apps/v1 Deployment extra\n\nv1\nv1 Ser\u{7f}vice\n".to_string()
            + &"v1 ConfigMap\n".repeat(1000);
        let parsed = parse(&hostile);
        assert_eq!(parsed.len(), MAX_KINDS);
        assert!(parsed.iter().all(|k| k.kind == "ConfigMap"));
    }
}
