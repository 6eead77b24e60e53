//! The WebAssembly guests wasmop's tests and benchmarks load, built by this crate's build
//! script: the Memcached plugins (`plugins/memcached`, `plugins/memcached-v2`) and the
//! misbehaving guests of `tests/guests/`, all `wasm32-wasip2` release builds with the flags of
//! the repository's `.cargo/config.toml`. Each constant is the absolute path of one component;
//! the build script reruns when the guests' sources change.
//!
//! They are built into `<target>/wasm-test`, a target directory of their own: the build script
//! runs while the outer cargo holds the lock on the workspace's target directory, so a nested
//! cargo building there would wait on that lock forever.

use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

/// The repository root.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/artifacts sits two levels below the repository root")
}

/// Reads a built guest.
pub fn read(path: impl AsRef<Path>) -> Vec<u8> {
    let path = path.as_ref();
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Bytes no compression shrinks, the same every run (an xorshift stream).
pub fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
