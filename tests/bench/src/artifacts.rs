//! Builds what the contestants run: the Go operator (`go build`, cached by Go), the host and
//! the native controller (`cargo build --release`), and the bench plugin (`wasm32-wasip2`) once
//! per kind. The Memcached plugins come from `test-artifacts`, built with this binary.
//!
//! Outputs land under `target/bench/`. The bench plugin builds in `target/wasm-test`, the
//! directory `test-artifacts` builds its guests in, so they share the dependencies' builds.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::kinds::Kind;

/// The built programs and plugins.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `go-memcached`, the controller-runtime operator.
    pub go: PathBuf,
    /// `native-memcached`, the kube-rs controller.
    pub native: PathBuf,
    /// The `wasmop` host.
    pub wasmop: PathBuf,
    /// `memcached.wasm`.
    pub memcached: PathBuf,
    /// `memcached_v2.wasm`, for the hot swap.
    pub memcached_v2: PathBuf,
    /// The bench plugin built for each kind of the many-operators scenario, in kind order.
    pub kind_plugins: Vec<PathBuf>,
}

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root exists")
}

/// The workspace's target directory.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// `target/bench`, where outputs and logs go.
pub fn bench_dir() -> PathBuf {
    target_dir().join("bench")
}

fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Builds everything, the bench plugin once per kind in `kinds`.
pub fn build(kinds: &[Kind]) -> Result<Artifacts> {
    let out = bench_dir();
    std::fs::create_dir_all(out.join("plugins"))?;

    let go = out.join("go-memcached");
    note!("building the Go operator");
    run(Command::new("go")
        .current_dir(root().join("tests/bench/go-memcached"))
        .args(["build", "-trimpath", "-o"])
        .arg(&go)
        .arg(".")
        .env("CGO_ENABLED", "0")
        // The Go on PATH, never a toolchain download.
        .env("GOTOOLCHAIN", "local"))
    .context("go build (Go 1.26 on PATH; modules from the Go module proxy)")?;

    note!("building the host and the native controller");
    // With `-p bench` features resolve as for `cargo run -p bench`, so nothing is rebuilt.
    run(Command::new(cargo())
        .current_dir(root())
        .args(["build", "--release", "-p", "bench"])
        .args(["-p", "wasmop", "-p", "bench-native"]))?;
    let release = target_dir().join("release");

    let wasm_target = target_dir().join("wasm-test");
    let wasm_out = wasm_target.join("wasm32-wasip2/release");
    let mut kind_plugins = Vec::new();
    if !kinds.is_empty() {
        note!("building the bench plugin for {} kinds", kinds.len());
    }
    for kind in kinds {
        run(Command::new(cargo())
            .current_dir(root())
            .args(["build", "-q", "--release", "--target", "wasm32-wasip2"])
            .arg("--target-dir")
            .arg(&wasm_target)
            .args(["-p", "bench-plugin"])
            .env("BENCH_PLUGIN_KIND", kind.flag())
            // The repository's .cargo/config.toml decides guest flags.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
        let dest = out
            .join("plugins")
            .join(format!("{}.wasm", kind.plugin_name()));
        std::fs::copy(wasm_out.join("bench_plugin.wasm"), &dest)
            .with_context(|| format!("copying the plugin for {}", kind.kind))?;
        kind_plugins.push(dest);
    }

    Ok(Artifacts {
        go,
        native: release.join("native-memcached"),
        wasmop: release.join("wasmop"),
        memcached: test_artifacts::MEMCACHED.into(),
        memcached_v2: test_artifacts::MEMCACHED_V2.into(),
        kind_plugins,
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
