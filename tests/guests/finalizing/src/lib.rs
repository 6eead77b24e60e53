//! A plugin with a finalizer that it never releases: a deleted parent waits for it forever,
//! unless the host releases the finalizer when the plugin goes away.

use serde_json::{Value, json};

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{Guest, KindRef, PluginManifest, RelatedSelector};

struct Finalizing;

impl Guest for Finalizing {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "finalizing".into(),
            version: "0.1.0".into(),
            parent: KindRef {
                api_version: "test.wasmop.io/v1".into(),
                kind: "Probe".into(),
            },
            children: vec![KindRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            }],
            related: vec![],
            finalizer: true,
            clock_seconds: None,
        }
    }

    fn related(_parent: String) -> Result<Vec<RelatedSelector>, String> {
        Ok(vec![])
    }

    fn reconcile(request: String) -> Result<String, String> {
        let req: Value = serde_json::from_str(&request).map_err(|e| e.to_string())?;
        let name = req["parent"]["metadata"]["name"].as_str().unwrap_or("unnamed");
        let child = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
        // `finalized` stays false: the plugin holds every deletion.
        Ok(json!({"children": [child], "finalized": false}).to_string())
    }
}

export!(Finalizing);
