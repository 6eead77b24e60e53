//! The operator-sdk Memcached operator as a wasmop plugin: the component build of
//! [`memcached_core`], whose items are re-exported here.
//!
//! Build with `cargo build --release --target wasm32-wasip2 -p memcached`, which gives
//! `memcached.wasm`. The `export` feature (on by default) exports [`MemcachedPlugin`].

pub use memcached_core::*;
use wasmop_guest::Crd;

#[cfg(feature = "export")]
wasmop_guest::export!(MemcachedPlugin);

/// The `Memcached` CRD, written from the plugin's types with the columns `kubectl get` shows;
/// `deploy/crds/memcached.yaml` is its output (`cargo run -p memcached --example crd`). Native
/// use only: the component never calls it, so none of it is linked there.
pub fn crd() -> Crd {
    Crd::of::<Memcached>()
        .scale(".spec.size", ".status.replicas")
        .column("Size", "integer", ".spec.size")
        .column(
            "Available",
            "string",
            ".status.conditions[?(@.type==\"Available\")].status",
        )
}
