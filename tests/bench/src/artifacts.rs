//! Builds what the contestants run: the Go operator (`go build`, cached by Go), the host and
//! the native controller (`cargo build`, in this binary's own profile), and the bench plugin
//! (`wasm32-wasip2`) once per kind. The Memcached plugins come from `test-artifacts`, built with this binary.
//!
//! Outputs land under `target/bench/`. The bench plugin builds in `target/wasm-test`, the
//! directory `test-artifacts` builds its guests in, so they share the dependencies' builds.

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
    /// `plugins/memcached-star/plugin.star`, the same operator as a Starlark script.
    pub memcached_star: PathBuf,
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

/// A `cargo` command without what `cargo run` set for this runner (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_*`, ...): build scripts that watch those variables (ring's) would otherwise see
/// them change between `cargo run -p bench` and this build, and each would rebuild the TLS
/// stack and everything above it.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&name.as_ref())
        {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
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
    // `-p bench` too, so that shared dependencies resolve their features as close as they
    // can to `cargo run -p bench`'s. In this binary's profile: a release runner measures
    // release builds; a dev one (CI's quick check) reuses what the tests built.
    let (profile_flag, profile_dir): (&[&str], _) = if cfg!(debug_assertions) {
        (&[], "debug")
    } else {
        (&["--release"], "release")
    };
    run(cargo()
        .current_dir(root())
        .args(["build", "-p", "bench"])
        .args(profile_flag)
        .args(["-p", "wasmop", "-p", "bench-native"]))?;
    let release = target_dir().join(profile_dir);

    let wasm_target = target_dir().join("wasm-test");
    let wasm_out = wasm_target.join("wasm32-wasip2/release");
    let mut kind_plugins = Vec::new();
    if !kinds.is_empty() {
        // One build for the first kind; the others are that module with its kind patched in
        // (every bench kind's flag has the same length): distinct modules, distinct digests,
        // each compiled on its own by the host, without a build each.
        note!("building the bench plugin for {} kinds", kinds.len());
        let template = Kind::bench(0).flag();
        run(cargo()
            .current_dir(root())
            .args(["build", "-q", "--release", "--target", "wasm32-wasip2"])
            .arg("--target-dir")
            .arg(&wasm_target)
            .args(["-p", "bench-plugin"])
            .env("BENCH_PLUGIN_KIND", &template)
            // The repository's .cargo/config.toml decides guest flags.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
        let built = std::fs::read(wasm_out.join("bench_plugin.wasm"))?;
        for kind in kinds {
            let dest = out
                .join("plugins")
                .join(format!("{}.wasm", kind.plugin_name()));
            std::fs::write(&dest, patch_kind(&built, &template, &kind.flag())?)
                .with_context(|| format!("writing the plugin for {}", kind.kind))?;
            kind_plugins.push(dest);
        }
    }

    Ok(Artifacts {
        go,
        native: release.join("native-memcached"),
        // Another build of the host, to compare with this one on the same machine.
        wasmop: std::env::var_os("WASMOP_BENCH_HOST")
            .map(PathBuf::from)
            .unwrap_or_else(|| release.join("wasmop")),
        memcached: test_artifacts::MEMCACHED.into(),
        memcached_v2: test_artifacts::MEMCACHED_V2.into(),
        memcached_star: test_artifacts::workspace_root().join("plugins/memcached-star/plugin.star"),
        kind_plugins,
    })
}

/// `module` with its one occurrence of `from` replaced by `to`, of the same length.
fn patch_kind(module: &[u8], from: &str, to: &str) -> Result<Vec<u8>> {
    let (from, to) = (from.as_bytes(), to.as_bytes());
    if from.len() != to.len() {
        bail!("a bench kind of another length: {to:?}");
    }
    let at: Vec<usize> = module
        .windows(from.len())
        .enumerate()
        .filter(|(_, w)| *w == from)
        .map(|(i, _)| i)
        .collect();
    let [at] = at[..] else {
        bail!(
            "the bench plugin holds its kind {} times, not once",
            at.len()
        );
    };
    let mut out = module.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_patched_once_or_not_at_all() {
        let module = b"\0asm....bench.wasmop.io/v1alpha1/Memcached000....".to_vec();
        let (a, b) = (Kind::bench(0).flag(), Kind::bench(42).flag());
        let patched = patch_kind(&module, &a, &b).unwrap();
        assert!(patched.windows(b.len()).any(|w| w == b.as_bytes()));
        assert_eq!(patched.len(), module.len());
        let twice = [&module[..], &module[..]].concat();
        assert!(patch_kind(&twice, &a, &b).is_err());
        assert!(patch_kind(&module, &a, "short").is_err());
    }
}
