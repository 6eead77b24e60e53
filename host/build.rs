//! Embeds the plugin SDK (`guest-sdk/`, crate `wasmop-guest`) and the contract it depends on
//! (`contract/`, crate `wasmop-contract`) in the binary, so that `wasmop new` can write them
//! beside a new plugin crate as path dependencies: the crate then builds with nothing but Rust
//! and this binary, from the same sources the host is built from.
//!
//! Their manifests inherit from this workspace (`edition.workspace = true`, `serde.workspace =
//! true`); they are written out standalone, with the workspace's values in place.
//!
//! Also builds the script interpreters (`interpreters/`) for `wasm32-wasip2`, with a nested
//! cargo into `<target>/wasm-interp`, and copies each component into `OUT_DIR`, where the
//! sandbox embeds it: `wasmop` alone runs script plugins.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The crates embedded: (directory in this workspace, name in the new crate's `sdk/`, files and
/// folders to take).
const CRATES: &[(&str, &str, &[&str])] = &[
    ("guest-sdk", "wasmop-guest", &["README.md", "src", "wit"]),
    ("contract", "wasmop-contract", &["src"]),
];

fn main() {
    let host = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = host
        .parent()
        .expect("host/ sits in the workspace")
        .to_path_buf();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let workspace = read_toml(&root.join("Cargo.toml"));
    println!(
        "cargo::rerun-if-changed={}",
        root.join("Cargo.toml").display()
    );

    let mut table = String::from("&[\n");
    for (dir, name, takes) in CRATES {
        let src = root.join(dir);
        let manifest = standalone(&read_toml(&src.join("Cargo.toml")), &workspace);
        let written = out.join(format!("{name}.Cargo.toml"));
        std::fs::write(&written, manifest).expect("writing a manifest to OUT_DIR");
        println!(
            "cargo::rerun-if-changed={}",
            src.join("Cargo.toml").display()
        );
        entry(&mut table, &format!("{name}/Cargo.toml"), &written);
        for take in *takes {
            // A directory too: a file added to it changes what is embedded.
            println!("cargo::rerun-if-changed={}", src.join(take).display());
            for file in files(&src.join(take)) {
                let rel = file.strip_prefix(&src).expect("below its crate");
                let rel = rel.to_str().expect("UTF-8 paths").replace('\\', "/");
                entry(&mut table, &format!("{name}/{rel}"), &file);
            }
        }
    }
    table.push(']');
    std::fs::write(out.join("sdk.rs"), table).expect("writing sdk.rs to OUT_DIR");

    for (dir, stem) in INTERPRETERS {
        interpreter(&root, &out, dir, stem);
    }
}

/// The interpreters: (directory, the file stem of the component it builds).
const INTERPRETERS: &[(&str, &str)] = &[("interpreters/starlark", "wasmop_starlark")];

/// Builds the interpreter in `dir` and copies `<stem>.wasm` into `out`.
fn interpreter(root: &Path, out: &Path, dir: &str, stem: &str) {
    for input in [dir, "guest-sdk/wit"] {
        println!("cargo::rerun-if-changed={}", root.join(input).display());
    }
    let target = target_dir(out).join("wasm-interp");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "build",
            "--locked",
            "--release",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--manifest-path")
        .arg(root.join(dir).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        // Its own profile decides, not the flags given to the host's build or the plugins'.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env("CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS", "-C strip=symbols")
        .stdin(Stdio::null());
    let output = cmd.output().expect("running cargo");
    if !output.status.success() {
        panic!(
            "building the interpreter in {dir} failed (the wasm32-wasip2 target is needed: \
             `rustup target add wasm32-wasip2`):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let built = target.join(format!("wasm32-wasip2/release/{stem}.wasm"));
    std::fs::copy(&built, out.join(format!("{stem}.wasm")))
        .unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
}

/// The target directory of this build: `CARGO_TARGET_DIR` when absolute, else found above
/// `OUT_DIR` (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`), so that every profile
/// shares one nested build.
fn target_dir(out: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from)
        && dir.is_absolute()
    {
        return dir;
    }
    let build = out
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .unwrap_or_else(|| panic!("no build/ above OUT_DIR {}", out.display()));
    let mut dir = build
        .parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>");
    if std::env::var_os("TARGET").is_some_and(|t| dir.file_name() == Some(t.as_os_str())) {
        dir = dir.parent().expect("the triple directory has a parent");
    }
    dir.to_path_buf()
}

fn entry(table: &mut String, path: &str, file: &Path) {
    println!("cargo::rerun-if-changed={}", file.display());
    writeln!(
        table,
        "    ({path:?}, include_bytes!({:?})),",
        file.display().to_string()
    )
    .expect("writing to a String");
}

/// Every file below `path` (or `path` itself), in a stable order.
fn files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut found = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for entry in entries {
        found.extend(files(&entry));
    }
    found
}

fn read_toml(path: &Path) -> toml::Table {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// `manifest` with what it inherits from `workspace` written in, its lints (the workspace's
/// policy, not the plugin author's) left out, and `wasmop-contract` found beside it.
fn standalone(manifest: &toml::Table, workspace: &toml::Table) -> String {
    let ws = workspace["workspace"].as_table().expect("[workspace]");
    let ws_package = ws["package"].as_table().expect("[workspace.package]");
    let ws_deps = ws["dependencies"]
        .as_table()
        .expect("[workspace.dependencies]");
    let mut out = manifest.clone();
    out.remove("lints");
    let package = out["package"].as_table_mut().expect("[package]");
    for (key, value) in package.iter_mut() {
        if inherits(value) {
            *value = ws_package[key.as_str()].clone();
        }
    }
    let version = package["version"].clone();
    for section in ["dependencies", "dev-dependencies"] {
        if let Some(deps) = out.get_mut(section).and_then(|d| d.as_table_mut()) {
            resolve(deps, ws_deps, &version);
        }
    }
    if let Some(targets) = out.get_mut("target").and_then(|t| t.as_table_mut()) {
        for (_, target) in targets.iter_mut() {
            if let Some(deps) = target
                .get_mut("dependencies")
                .and_then(|d| d.as_table_mut())
            {
                resolve(deps, ws_deps, &version);
            }
        }
    }
    format!(
        "# Written by `wasmop new` from the SDK the wasmop binary was built with.\n{}",
        toml::to_string(&out).expect("a manifest serialises")
    )
}

fn inherits(value: &toml::Value) -> bool {
    value
        .as_table()
        .is_some_and(|t| t.get("workspace").and_then(toml::Value::as_bool) == Some(true))
}

fn resolve(deps: &mut toml::Table, ws_deps: &toml::Table, version: &toml::Value) {
    for (name, dep) in deps.iter_mut() {
        if !inherits(dep) {
            continue;
        }
        let mut resolved = match &ws_deps[name.as_str()] {
            toml::Value::String(v) => {
                let mut t = toml::Table::new();
                t.insert("version".into(), toml::Value::String(v.clone()));
                t
            }
            toml::Value::Table(t) => t.clone(),
            other => panic!("workspace dependency {name}: {other}"),
        };
        // Features added at the use site come on top of the workspace's.
        if let Some(extra) = dep.get("features").and_then(toml::Value::as_array) {
            let features = resolved
                .entry("features")
                .or_insert_with(|| toml::Value::Array(Vec::new()));
            features
                .as_array_mut()
                .expect("features are a list")
                .extend(extra.iter().cloned());
        }
        if resolved.contains_key("path") {
            // The SDK's own crates sit side by side under `sdk/`.
            resolved.insert("path".into(), toml::Value::String(format!("../{name}")));
            resolved.entry("version").or_insert_with(|| version.clone());
        }
        *dep = toml::Value::Table(resolved);
    }
}
