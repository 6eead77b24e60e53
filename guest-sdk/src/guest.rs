//! The component-model glue, compiled for wasm only: WIT bindings, the adapter from
//! [`Plugin`] to the generated `Guest` trait, and the panic hook.

use std::marker::PhantomData;
use std::sync::Once;

use crate::log::Level;
use crate::{__reconcile_json, __related_json, Plugin};
use crate::{KindRef, Manifest, RelatedSelector};

/// Generated from `wit/plugin.wit`; the export macro is public so that
/// [`crate::export!`] can expand it inside the plugin crate.
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__wasmop_export_world",
        default_bindings_module: "wasmop_guest::__private::bindings",
        runtime_path: "wasmop_guest::__private::wit_bindgen::rt",
    });
}

use bindings::exports::wasmop::plugin::reconciler as wit;
use bindings::wasmop::plugin::host;

/// Implements the generated `Guest` trait for any [`Plugin`]; [`crate::export!`] names
/// `Exporter<YourPlugin>`.
pub struct Exporter<P>(PhantomData<P>);

impl<P: Plugin> wit::Guest for Exporter<P> {
    fn manifest() -> wit::PluginManifest {
        install_panic_hook();
        let Manifest {
            name,
            version,
            parent,
            children,
            related,
            finalizer,
            clock_seconds,
        } = P::manifest();
        wit::PluginManifest {
            name,
            version,
            parent: kind_ref(parent),
            children: children.into_iter().map(kind_ref).collect(),
            related: related
                .into_iter()
                .map(|r| wit::RelatedKind {
                    api_version: r.api_version,
                    kind: r.kind,
                    metadata_only: r.metadata_only,
                })
                .collect(),
            finalizer,
            clock_seconds,
        }
    }

    fn related(parent: String) -> Result<Vec<wit::RelatedSelector>, String> {
        install_panic_hook();
        let selectors = __related_json::<P>(&parent)?;
        Ok(selectors.into_iter().map(related_selector).collect())
    }

    fn reconcile(request: String) -> Result<String, String> {
        install_panic_hook();
        __reconcile_json::<P>(&request)
    }
}

fn kind_ref(k: KindRef) -> wit::KindRef {
    wit::KindRef {
        api_version: k.api_version,
        kind: k.kind,
    }
}

fn related_selector(s: RelatedSelector) -> wit::RelatedSelector {
    let label_selector = s.label_selector_json();
    wit::RelatedSelector {
        api_version: s.kind.api_version,
        kind: s.kind.kind,
        label_selector,
    }
}

pub(crate) fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => host::Level::Trace,
        Level::Debug => host::Level::Debug,
        Level::Info => host::Level::Info,
        Level::Warn => host::Level::Warn,
        Level::Error => host::Level::Error,
    };
    host::log(level, message);
}

/// A panic aborts the instance (the host sees a trap); the hook first sends the message and
/// location through `log`, where the host picks it up as the reason.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let msg = info.payload_as_str().unwrap_or("Box<dyn Any>");
            let text = match info.location() {
                Some(l) => format!("panic: {msg} at {}:{}:{}", l.file(), l.line(), l.column()),
                None => format!("panic: {msg}"),
            };
            log(Level::Error, &text);
        }));
    });
}
