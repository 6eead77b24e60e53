//! Write wasmop reconcile plugins in Rust.
//!
//! A plugin is a type implementing [`Plugin`]: a [`Manifest`] saying what it reconciles, an
//! optional [`Plugin::related`] naming the objects it wants to read, and [`Plugin::reconcile`],
//! a pure function from observed state ([`Request`]) to desired state ([`Response`]).
//! [`export!`] turns it into the component the host loads; the same code runs natively, so
//! [`testing`] drives it from plain `cargo test`.
//!
//! Build a plugin with `cargo build --release --target wasm32-wasip2` from a `cdylib` crate.
//! The wire format and the host's rules are in `docs/plugin-contract.md`.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//! use serde::{Deserialize, Serialize};
//! use serde_json::json;
//! use wasmop_guest::{Error, Manifest, Plugin, Request, Response, testing};
//!
//! /// The parent: only the fields the plugin reads.
//! #[derive(Serialize, Deserialize)]
//! struct Greeting {
//!     metadata: ObjectMeta,
//!     spec: GreetingSpec,
//! }
//! #[derive(Serialize, Deserialize)]
//! struct GreetingSpec {
//!     text: String,
//! }
//!
//! struct Greeter;
//!
//! impl Plugin for Greeter {
//!     type Parent = Greeting;
//!
//!     fn manifest() -> Manifest {
//!         Manifest::new("greeter", "0.1.0")
//!             .parent_raw("example.com/v1", "Greeting")
//!             .child::<ConfigMap>()
//!     }
//!
//!     fn reconcile(req: &Request<Greeting>) -> Result<Response, Error> {
//!         if req.parent().spec.text.is_empty() {
//!             return Err(Error::msg("spec.text must not be empty"));
//!         }
//!         let cm = ConfigMap {
//!             metadata: ObjectMeta {
//!                 name: Some(req.name().to_owned()),
//!                 ..ObjectMeta::default()
//!             },
//!             data: Some([("text".to_owned(), req.parent().spec.text.clone())].into()),
//!             ..ConfigMap::default()
//!         };
//!         Ok(Response::new().child(cm).status(json!({"written": true})))
//!     }
//! }
//!
//! wasmop_guest::export!(Greeter);
//!
//! // Natively, the same code runs under test:
//! let parent = json!({"metadata": {"name": "hi", "namespace": "default"}, "spec": {"text": "hello"}});
//! let resp = testing::reconcile::<Greeter>(&testing::RequestBuilder::new(&parent).build()).unwrap();
//! assert_eq!(resp.children[0]["kind"], "ConfigMap");
//! assert_eq!(resp.children[0]["data"]["text"], "hello");
//! ```

//! # Notes for authors
//!
//! - **An Event when something changed.** A plugin keeps no state between calls, so it compares
//!   what it observes with what it wants: the Memcached plugin reads its observed Deployment
//!   (`req.child_as`) and adds a `Scaled` Event only when the observed replicas differ from the
//!   desired ones. At steady state that records nothing, and the host then makes no call at all
//!   on a resync whose request is unchanged.
//! - **Size.** A module ships in a ConfigMap (1 MiB at most, gzipped if that is smaller). Build
//!   the `wasm32-wasip2` target with `opt-level=z`, `codegen-units=1` and `strip=symbols` (this
//!   repository's `.cargo/config.toml` sets them for that target only), and read
//!   observed children into small structs of the fields you use rather than whole k8s-openapi
//!   types, whose deserialisers are large (reading a whole `Deployment` about doubles the
//!   Memcached module).
//! - **A parent that does not deserialise** as [`Plugin::Parent`] fails the call before your
//!   code runs — in `related` first, even when the plugin does not implement it — and the parent
//!   gets `Ready=False`, reason `PluginFailed`, with serde's message (`parent: missing field …`).
//!   Make fields that may be absent `Option` or `#[serde(default)]`.
//! - **k8s-openapi 0.29:** `Deployment.spec` is a `DeploymentSpec`, not an `Option`, while
//!   `Service.spec` and `PodDisruptionBudget.spec` are `Option`s; the pod template's `spec` is an
//!   `Option` too.
//! - **The parent and its CRD.** [`custom_resource!`] declares the parent from a spec and a
//!   status type; [`Crd`] writes the CustomResourceDefinition from them natively (see
//!   [`resource`]), so the schema and the Rust type cannot drift.
//! - **Stable hashes.** For a config-hash annotation that rolls pods when their ConfigMap
//!   changes, use [`hash::stable_hash`]: std's hashers differ between processes and releases.

// Lets the paths baked into the generated bindings (`wasmop_guest::…`) resolve inside this
// crate as well as in plugin crates.
extern crate self as wasmop_guest;

pub mod error;
pub mod hash;
pub mod log;
pub mod request;
pub mod resource;
pub mod response;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

#[cfg(target_arch = "wasm32")]
mod guest;

pub use error::{Error, Result};
pub use request::Request;
pub use resource::{Crd, CustomResource};
pub use response::{Condition, Response};
pub use wasmop_contract::wire::{self, EventType};
pub use wasmop_contract::{KindRef, Manifest, RelatedKind, RelatedSelector};
// Plugins name k8s-openapi types in their signatures; the re-export keeps versions in step.
pub use k8s_openapi;
// Parent types derive `JsonSchema` for their CRD; one schemars for the SDK and the plugin.
pub use schemars;

use serde::de::DeserializeOwned;

/// A reconcile plugin. Implement it on a unit struct and pass that to [`export!`].
pub trait Plugin {
    /// The parent object as the plugin's own type; only the fields it reads need to exist.
    type Parent: DeserializeOwned;

    /// Who the plugin is and what it works on. Called once when the host loads the plugin.
    fn manifest() -> Manifest;

    /// For one parent, which related objects to gather before [`Plugin::reconcile`]. Every
    /// selector's kind must be declared in the manifest. The default gathers nothing. The host
    /// keeps the answer until the parent's spec or metadata change, so it must not depend on
    /// the parent's status.
    fn related(parent: &Self::Parent) -> Result<Vec<RelatedSelector>> {
        let _ = parent;
        Ok(Vec::new())
    }

    /// One reconcile: observed state in, desired state out. Must be deterministic: the host
    /// writes only what changed. Under the host there is no real clock or entropy (the wall
    /// clock is fixed, a sleep returns at once, randomness is a fixed sequence), so read time
    /// from the request, never from `SystemTime`. An `Err` is a guest fault: it is retried when
    /// the input or the plugin changes.
    fn reconcile(req: &Request<Self::Parent>) -> Result<Response>;
}

/// Exports a [`Plugin`] as the component's `wasmop:plugin/reconciler` interface.
///
/// Use it once, in the plugin crate's root. It expands to nothing outside wasm, so native
/// builds and tests of the same crate are unaffected.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)]
        const _: () = {
            // The generated export macro takes a plain type name.
            type __WasmopExporter = $crate::__private::Exporter<$plugin>;
            $crate::__private::bindings::__wasmop_export_world!(
                __WasmopExporter with_types_in $crate::__private::bindings
            );
        };
    };
}

/// Runs one `reconcile` from request JSON to response JSON: the only path, shared by the wasm
/// export and [`testing::reconcile`].
#[doc(hidden)]
pub fn __reconcile_json<P: Plugin>(request: &str) -> Result<String, String> {
    let wire: wire::WireRequest =
        serde_json::from_str(request).map_err(|e| format!("request: {e}"))?;
    let req = Request::<P::Parent>::from_wire(wire)?;
    let response = P::reconcile(&req)?.into_wire()?;
    serde_json::to_string(&response).map_err(|e| format!("response: {e}"))
}

/// Runs one `related` from parent JSON: shared by the wasm export and [`testing::related`].
#[doc(hidden)]
pub fn __related_json<P: Plugin>(parent: &str) -> Result<Vec<RelatedSelector>, String> {
    let parent: P::Parent = serde_json::from_str(parent).map_err(|e| format!("parent: {e}"))?;
    Ok(P::related(&parent)?)
}

#[doc(hidden)]
pub mod __private {
    #[cfg(target_arch = "wasm32")]
    pub use crate::guest::{Exporter, bindings};
    #[cfg(target_arch = "wasm32")]
    pub use wit_bindgen;
}
