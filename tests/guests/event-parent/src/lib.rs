//! A plugin whose parent kind is `events.k8s.io/v1 Event`: the host writes Events about every
//! reconcile, so it would be fed its own output. The host refuses it at load.

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{Guest, KindRef, PluginManifest, RelatedSelector};

struct EventParent;

impl Guest for EventParent {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "event-parent".into(),
            version: "0.1.0".into(),
            parent: KindRef {
                api_version: "events.k8s.io/v1".into(),
                kind: "Event".into(),
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

    // An Event for each Event it is shown: what a host without the rule would loop on.
    fn reconcile(_request: String) -> Result<String, String> {
        Ok(r#"{"events": [{"type": "Warning", "reason": "Again", "message": "one more"}]}"#.into())
    }
}

export!(EventParent);
