//! A plugin on a built-in kind: parent Deployment, child kind ReplicaSet, and no children
//! wanted. The Deployment controller's own ReplicaSets are controlled by the same parent;
//! pruning must leave them alone.

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{Guest, KindRef, PluginManifest, RelatedSelector};

struct DeploymentPlugin;

impl Guest for DeploymentPlugin {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "deployment-plugin".into(),
            version: "0.1.0".into(),
            parent: KindRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
            },
            children: vec![KindRef {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
            }],
            related: vec![],
            finalizer: false,
            clock_seconds: None,
        }
    }

    fn related(_parent: String) -> Result<Vec<RelatedSelector>, String> {
        Ok(vec![])
    }

    fn reconcile(_request: String) -> Result<String, String> {
        Ok(r#"{"children": [], "events": [{"type": "Normal", "reason": "Reconciled", "message": "no children wanted"}]}"#.into())
    }
}

export!(DeploymentPlugin);
