//! The operator-sdk Memcached operator as a wasmop plugin: the component build of
//! [`memcached_core`], whose items are re-exported here.
//!
//! Build with `cargo build --release --target wasm32-wasip2 -p memcached`, which gives
//! `memcached.wasm`. The `export` feature (on by default) exports [`MemcachedPlugin`].

pub use memcached_core::*;

#[cfg(feature = "export")]
wasmop_guest::export!(MemcachedPlugin);
