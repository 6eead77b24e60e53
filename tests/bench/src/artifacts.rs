//! Builds what the contestants run: the Go operator (`go build`, cached by Go), the host and
//! the native controller (`cargo build --release`), and the plugins (`wasm32-wasip2`).
//!
//! Everything lands under `target/bench/`. The wasm builds use `target/wasm-test`, the
//! directory the host's tests build the same plugins in, so either run reuses the other's.

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

    note!("building the plugins");
    let wasm_target = target_dir().join("wasm-test");
    let wasm = |args: &[&str], kind: Option<&str>| -> Result<()> {
        let mut cmd = Command::new(cargo());
        cmd.current_dir(root())
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(&wasm_target)
            .args(args)
            // The repository's .cargo/config.toml decides guest flags.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        match kind {
            Some(k) => cmd.env("BENCH_PLUGIN_KIND", k),
            None => cmd.env_remove("BENCH_PLUGIN_KIND"),
        };
        run(&mut cmd)
    };
    let wasm_out = wasm_target.join("wasm32-wasip2/release");
    wasm(&["-q", "-p", "memcached", "-p", "memcached-v2"], None)?;
    let memcached = copy(&wasm_out.join("memcached.wasm"), &out.join("plugins"))?;
    let memcached_v2 = copy(&wasm_out.join("memcached_v2.wasm"), &out.join("plugins"))?;
    let mut kind_plugins = Vec::new();
    for kind in kinds {
        wasm(&["-q", "-p", "bench-plugin"], Some(&kind.flag()))?;
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
        memcached,
        memcached_v2,
        kind_plugins,
    })
}

fn copy(from: &Path, dir: &Path) -> Result<PathBuf> {
    let dest = dir.join(from.file_name().expect("a file"));
    std::fs::copy(from, &dest).with_context(|| format!("copying {}", from.display()))?;
    Ok(dest)
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
