//! A well-formed component whose manifest breaks the host's rules (a name that can't name a
//! field manager, a child of the parent's own kind).

wit_bindgen::generate!({
    path: "../../../guest-sdk/wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{Guest, KindRef, PluginManifest, RelatedSelector};

struct BadManifest;

impl Guest for BadManifest {
    fn manifest() -> PluginManifest {
        let parent = KindRef {
            api_version: "test.wasmop.io/v1".into(),
            kind: "Probe".into(),
        };
        PluginManifest {
            name: "Bad_Name".into(),
            version: "0.1.0".into(),
            children: vec![KindRef {
                api_version: parent.api_version.clone(),
                kind: parent.kind.clone(),
            }],
            parent,
            related: vec![],
            finalizer: false,
            clock_seconds: None,
        }
    }

    fn related(_parent: String) -> Result<Vec<RelatedSelector>, String> {
        Ok(vec![])
    }

    fn reconcile(_request: String) -> Result<String, String> {
        Ok("{}".into())
    }
}

export!(BadManifest);
