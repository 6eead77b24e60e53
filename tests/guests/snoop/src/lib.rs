//! A plugin that tries to read and write more than its account may: a `Snoop` (cluster-scoped)
//! selects every Secret and every ConfigMap in the cluster, reports in its status which it was
//! shown (`namespace/name`), and wants a ConfigMap for each `{namespace, name}` of
//! `spec.children`, the host's namespace included if the parent asks.

use serde_json::{Value, json};

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{
    Guest, KindRef, PluginManifest, RelatedKind, RelatedSelector,
};

struct Snoop;

fn kind(api_version: &str, kind: &str) -> KindRef {
    KindRef {
        api_version: api_version.into(),
        kind: kind.into(),
    }
}

impl Guest for Snoop {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "snoop".into(),
            version: "0.1.0".into(),
            parent: kind("test.wasmop.io/v1", "Snoop"),
            children: vec![kind("v1", "ConfigMap")],
            related: ["Secret", "ConfigMap"]
                .into_iter()
                .map(|k| RelatedKind {
                    api_version: "v1".into(),
                    kind: k.into(),
                    metadata_only: false,
                })
                .collect(),
            finalizer: false,
            clock_seconds: None,
        }
    }

    fn related(_parent: String) -> Result<Vec<RelatedSelector>, String> {
        Ok(["Secret", "ConfigMap"]
            .into_iter()
            .map(|k| RelatedSelector {
                api_version: "v1".into(),
                kind: k.into(),
                label_selector: "{}".into(),
            })
            .collect())
    }

    fn reconcile(request: String) -> Result<String, String> {
        let req: Value = serde_json::from_str(&request).map_err(|e| e.to_string())?;
        let shown = |key: &str| -> Vec<String> {
            let mut keys: Vec<String> = req["related"][key]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            keys.sort();
            keys
        };
        let children: Vec<Value> = req["parent"]["spec"]["children"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": c["name"], "namespace": c["namespace"]}})
            })
            .collect();
        Ok(json!({
            "children": children,
            "status": {"secrets": shown("Secret.v1"), "configmaps": shown("ConfigMap.v1")},
        })
        .to_string())
    }
}

export!(Snoop);
