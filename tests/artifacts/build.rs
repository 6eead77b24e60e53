//! Builds the WebAssembly guests with a nested `cargo build --release --target wasm32-wasip2`
//! into `<target>/wasm-test`, then writes `artifacts.rs` into `OUT_DIR`: one constant per
//! guest, its absolute path.

use std::collections::BTreeSet;
use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One nested cargo run and what it produces.
struct Build {
    /// Arguments after `cargo build --release --target wasm32-wasip2 --target-dir <dir>`.
    args: &'static [&'static str],
    /// The constant's name, the file stem of the `.wasm`, and the constant's doc.
    artifacts: &'static [(&'static str, &'static str, &'static str)],
}

const BUILDS: &[Build] = &[
    Build {
        // Its own workspace: the root workspace neither builds nor lints these.
        args: &["--manifest-path", "tests/guests/Cargo.toml"],
        artifacts: &[
            (
                "ADVERSARIAL",
                "adversarial",
                "Misbehaves according to `settings.mode` (reconcile) or `spec.mode` (related): \
                 `tests/guests/adversarial`.",
            ),
            (
                "BAD_MANIFEST",
                "bad_manifest",
                "A component whose manifest breaks the host's rules: `tests/guests/bad-manifest`.",
            ),
            (
                "CLUSTER_PARENT",
                "cluster_parent",
                "Parent ClusterProbe (cluster-scoped), a ConfigMap in each namespace of \
                 `spec.namespaces`, `status.seen` the ones it was shown: `tests/guests/cluster-parent`.",
            ),
            (
                "DEPLOYMENT_PLUGIN",
                "deployment_plugin",
                "Parent Deployment, child kind ReplicaSet, no children wanted: \
                 `tests/guests/deployment-plugin`.",
            ),
            (
                "EVENT_PARENT",
                "event_parent",
                "Parent kind `events.k8s.io/v1 Event`, refused at load: `tests/guests/event-parent`.",
            ),
            (
                "FINALIZING",
                "finalizing",
                "Puts a finalizer on every Probe and never releases it: `tests/guests/finalizing`.",
            ),
            (
                "SNOOP",
                "snoop",
                "Parent Snoop (cluster-scoped) selecting every Secret and ConfigMap, `status` the \
                 ones it was shown, a ConfigMap child for each of `spec.children`: \
                 `tests/guests/snoop`.",
            ),
            (
                "WRONG_VERSION",
                "wrong_version",
                "The plugin world at interface version 0.1.0, the one before: `tests/guests/wrong-version`.",
            ),
        ],
    },
    Build {
        args: &["-p", "memcached", "-p", "memcached-v2"],
        artifacts: &[
            (
                "MEMCACHED",
                "memcached",
                "The Memcached plugin: `plugins/memcached`.",
            ),
            (
                "MEMCACHED_V2",
                "memcached_v2",
                "Its second version, the hot-swap target: `plugins/memcached-v2`.",
            ),
        ],
    },
];

/// What the guests are built from, relative to the repository root.
const SOURCES: &[&str] = &[
    "plugins",
    "guest-sdk",
    "tests/guests",
    "Cargo.toml",
    "Cargo.lock",
    ".cargo/config.toml",
];

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .ancestors()
        .nth(2)
        .expect("tests/artifacts sits two levels below the repository root");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));

    for source in SOURCES {
        println!("cargo:rerun-if-changed={}", root.join(source).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    let target_dir = target_dir(&out_dir).join("wasm-test");
    let wasm_dir = target_dir.join("wasm32-wasip2").join("release");
    let mut code = String::new();
    let mut inputs = BTreeSet::new();
    for build in BUILDS {
        cargo_build(root, &target_dir, build.args);
        for (name, stem, doc) in build.artifacts {
            let wasm = wasm_dir.join(format!("{stem}.wasm"));
            assert!(
                wasm.is_file(),
                "{} was not built by cargo build {:?}",
                wasm.display(),
                build.args
            );
            read_dep_info(&wasm.with_extension("d"), &target_dir, &mut inputs);
            let path = wasm.to_str().expect("a UTF-8 target directory");
            writeln!(code, "/// {doc}\npub const {name}: &str = {path:?};").unwrap();
        }
    }
    for input in inputs {
        println!("cargo:rerun-if-changed={}", input.display());
    }
    std::fs::write(out_dir.join("artifacts.rs"), code).expect("writing artifacts.rs");
}

/// The workspace's target directory. `CARGO_TARGET_DIR` when absolute (a relative one is
/// relative to wherever cargo was started, unknown here); otherwise found from `OUT_DIR`,
/// `<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`, which also covers a target directory
/// set in a cargo config.
fn target_dir(out_dir: &Path) -> PathBuf {
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR").map(PathBuf::from)
        && dir.is_absolute()
    {
        return dir;
    }
    let profile = out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("no build/ above OUT_DIR {}", out_dir.display()));
    let mut target = profile
        .parent()
        .expect("the profile directory has a parent");
    // With `--target`, the profile directories sit one level down, under the triple.
    if env::var_os("TARGET").is_some_and(|t| target.file_name() == Some(t.as_os_str())) {
        target = target.parent().expect("the triple directory has a parent");
    }
    target.to_path_buf()
}

/// Runs the nested cargo from the repository root, so its `.cargo/config.toml` applies; fails
/// this build with the nested cargo's stderr when it fails.
fn cargo_build(root: &Path, target_dir: &Path, args: &[&str]) {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(target_dir)
        .args(args)
        // The repository's config decides guest flags, not whatever this build was given.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        // Under `cargo clippy` this is clippy-driver, meant for the outer workspace only.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stdin(Stdio::null());
    let output = cmd.output().expect("running cargo");
    if !output.status.success() {
        eprintln!(
            "{cmd:?} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        std::process::exit(1);
    }
}

/// Adds the files the compiler read for an artifact, as its dep-info lists them, to `inputs`:
/// rerunning when they change covers local dependencies outside [`SOURCES`]. Files under the
/// nested target directory are its own output, skipped.
fn read_dep_info(dep_info: &Path, target_dir: &Path, inputs: &mut BTreeSet<PathBuf>) {
    let text = std::fs::read_to_string(dep_info)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dep_info.display()));
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        // Paths are separated by spaces; a space inside a path is escaped with a backslash.
        let mut path = String::new();
        for part in deps.split(' ') {
            if let Some(escaped) = part.strip_suffix('\\') {
                path.push_str(escaped);
                path.push(' ');
                continue;
            }
            path.push_str(part);
            let file = PathBuf::from(std::mem::take(&mut path));
            if file.is_absolute() && !file.starts_with(target_dir) {
                inputs.insert(file);
            }
        }
    }
}
