//! A plugin of the same world at interface version 0.1.0, the one before: the host (0.2.0)
//! must refuse it at load. Its WIT (`wit/plugin.wit`) is the real one with the version changed, written by build.rs.

wit_bindgen::generate!({
    path: "wit",
    world: "plugin",
});

use exports::wasmop::plugin::reconciler::{Guest, KindRef, PluginManifest, RelatedSelector};

struct WrongVersion;

impl Guest for WrongVersion {
    fn manifest() -> PluginManifest {
        PluginManifest {
            name: "wrong-version".into(),
            version: "0.1.0".into(),
            parent: KindRef {
                api_version: "test.wasmop.io/v1".into(),
                kind: "Probe".into(),
            },
            children: vec![],
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

export!(WrongVersion);
