//! Builds the WebAssembly guests the tests and benchmarks load, once per process: the
//! adversarial guests under `tests/guests/` and the real Memcached plugins (v1 and v2).
//!
//! Both go to `target/wasm-test`, not the workspace's target directory, so the nested cargo
//! never waits for the lock the running `cargo test` holds. Included with `#[path]` by
//! `host/tests/sandbox*.rs`, `host/benches/plugin_call.rs` and `tests/e2e/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The adversarial guests (see `tests/guests/`).
pub struct Guests {
    /// Misbehaves according to `settings.mode` (reconcile) or `spec.mode` (related).
    pub adversarial: PathBuf,
    /// A component whose manifest breaks the host's rules.
    pub bad_manifest: PathBuf,
    /// The plugin world at interface version 0.2.0.
    pub wrong_version: PathBuf,
}

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    workspace_root().join("target").join("wasm-test")
}

fn wasm_dir() -> PathBuf {
    target_dir().join("wasm32-wasip2").join("release")
}

/// Runs `cargo build --release --target wasm32-wasip2` with `args`, from the repository root so
/// its `.cargo/config.toml` (size flags for wasm) applies.
fn cargo_build(args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(target_dir())
        .args(args)
        // The project's config decides guest flags, not whatever the host build was given.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("running cargo");
    assert!(
        output.status.success(),
        "cargo build {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The adversarial guests, built on first use.
pub fn guests() -> &'static Guests {
    static GUESTS: OnceLock<Guests> = OnceLock::new();
    GUESTS.get_or_init(|| {
        cargo_build(&["--manifest-path", "tests/guests/Cargo.toml"]);
        let dir = wasm_dir();
        Guests {
            adversarial: dir.join("adversarial.wasm"),
            bad_manifest: dir.join("bad_manifest.wasm"),
            wrong_version: dir.join("wrong_version.wasm"),
        }
    })
}

/// The Memcached plugin (`plugins/memcached`), built on first use.
pub fn memcached() -> &'static Path {
    &plugins().0
}

/// Its second version (`plugins/memcached-v2`), built on first use.
pub fn memcached_v2() -> &'static Path {
    &plugins().1
}

/// Both Memcached plugins, in one cargo run.
fn plugins() -> &'static (PathBuf, PathBuf) {
    static PLUGINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PLUGINS.get_or_init(|| {
        cargo_build(&["-p", "memcached", "-p", "memcached-v2"]);
        let dir = wasm_dir();
        (dir.join("memcached.wasm"), dir.join("memcached_v2.wasm"))
    })
}

/// Reads a built guest.
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
