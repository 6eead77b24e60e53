//! A plugin whose parent is cluster-scoped: a `ClusterProbe` wants a ConfigMap in each
//! namespace its `spec.namespaces` lists, and reports how many of them it was shown.

use serde_json::{Value, json};

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{Guest, KindRef, PluginManifest, RelatedSelector};

struct ClusterParent;

impl Guest for ClusterParent {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "cluster-parent".into(),
            version: "0.1.0".into(),
            parent: KindRef {
                api_version: "test.wasmop.io/v1".into(),
                kind: "ClusterProbe".into(),
            },
            children: vec![KindRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            }],
            related: vec![],
            finalizer: false,
            clock_seconds: None,
        }
    }

    fn related(_parent: String) -> Result<Vec<RelatedSelector>, String> {
        Ok(vec![])
    }

    fn reconcile(request: String) -> Result<String, String> {
        let req: Value = serde_json::from_str(&request).map_err(|e| e.to_string())?;
        let name = req["parent"]["metadata"]["name"].as_str().unwrap_or("unnamed");
        let children: Vec<Value> = req["parent"]["spec"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|ns| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": ns}})
            })
            .collect();
        let seen = req["children"]["ConfigMap.v1"]
            .as_object()
            .map_or(0, |m| m.len());
        Ok(json!({"children": children, "status": {"seen": seen}}).to_string())
    }
}

export!(ClusterParent);
