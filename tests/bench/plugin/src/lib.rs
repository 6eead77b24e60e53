//! The Memcached plugin (`plugins/memcached-core`) for a parent kind chosen at build time, so
//! one host can run ten copies side by side in the many-operators benchmark (`tests/bench`).
//!
//! The manifest is static, so the kind comes from the build environment:
//!
//! ```sh
//! BENCH_PLUGIN_KIND=bench.wasmop.io/v1alpha1/Memcached3 \
//!   cargo build --release --target wasm32-wasip2 -p bench-plugin
//! ```
//!
//! gives `bench_plugin.wasm`, a plugin named `memcached3` for `Memcached3` in
//! `bench.wasmop.io/v1alpha1`. Without the variable it is the plain `memcached` plugin.

use memcached_core::{Memcached, MemcachedPlugin};
use wasmop_guest::{Error, KindRef, Manifest, Plugin, RelatedSelector, Request, Response};

/// `group/version/Kind` of the parent, fixed at build time.
const KIND: &str = match option_env!("BENCH_PLUGIN_KIND") {
    Some(kind) => kind,
    None => "cache.example.com/v1alpha1/Memcached",
};

/// The Memcached plugin, reconciling [`KIND`].
pub struct BenchMemcached;

impl Plugin for BenchMemcached {
    type Parent = Memcached;

    fn manifest() -> Manifest {
        let (api_version, kind) = KIND.rsplit_once('/').unwrap_or(("", KIND));
        let mut manifest = MemcachedPlugin::manifest();
        // Plugin names must be unique per host: one per kind.
        manifest.name = kind.to_ascii_lowercase();
        manifest.parent = KindRef::new(api_version, kind);
        manifest
    }

    fn related(parent: &Memcached) -> Result<Vec<RelatedSelector>, Error> {
        MemcachedPlugin::related(parent)
    }

    fn reconcile(req: &Request<Memcached>) -> Result<Response, Error> {
        MemcachedPlugin::reconcile(req)
    }
}

wasmop_guest::export!(BenchMemcached);
