//! `wasmop new`: scaffolds a standalone plugin crate.
//!
//! The crate is its own workspace: the SDK (`wasmop-guest` and the `wasmop-contract` it
//! depends on, written into `sdk/` from the sources this binary was built with, until the SDK
//! is published; or a local checkout with `--sdk-path`), a size-tuned release profile, a parent kind declared with
//! `custom_resource!`, reconcile logic that keeps a Deployment, native tests, an example that
//! prints the CRD written from the Rust types, a sample CR and a README with the build,
//! render, package and install commands. With `--lang starlark` it is a directory with
//! `plugin.star`, its tests in `plugin_test.star`, the CRD as YAML, a sample and a README
//! instead: nothing to build. Every name is checked before anything is written, and an
//! existing non-empty directory is never written into.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use wasmop_contract::names::{is_dns1123_label, is_dns1123_subdomain};

use crate::cli::{Lang, NewArgs};
use crate::plugin::rbac::guess_plural;

/// The SDK's crates, as this binary was built with them (`build.rs`): (path under `sdk/`,
/// contents).
const SDK: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/sdk.rs"));

/// Where the SDK's crates go in a new crate.
const SDK_DIR: &str = "sdk";

/// The template files: (path in the new crate, text with `__PLACEHOLDERS__`).
const FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../templates/new/Cargo.toml.tmpl"),
    ),
    (".gitignore", include_str!("../../templates/new/gitignore")),
    ("README.md", include_str!("../../templates/new/README.md")),
    ("src/lib.rs", include_str!("../../templates/new/lib.rs")),
    (
        "tests/reconcile.rs",
        include_str!("../../templates/new/reconcile.rs"),
    ),
    (
        "examples/crd.rs",
        include_str!("../../templates/new/crd.rs"),
    ),
    (
        "sample.yaml",
        include_str!("../../templates/new/sample.yaml"),
    ),
];

/// The template files of a Starlark plugin.
const STARLARK_FILES: &[(&str, &str)] = &[
    (
        "plugin.star",
        include_str!("../../templates/new-star/plugin.star"),
    ),
    (
        "plugin_test.star",
        include_str!("../../templates/new-star/plugin_test.star"),
    ),
    (
        "crd.yaml",
        include_str!("../../templates/new-star/crd.yaml"),
    ),
    (
        "sample.yaml",
        include_str!("../../templates/new/sample.yaml"),
    ),
    (
        "README.md",
        include_str!("../../templates/new-star/README.md"),
    ),
];

/// What a scaffold is made of, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scaffold {
    /// Crate, plugin and ConfigMap name: a DNS-1123 label.
    pub name: String,
    /// The parent kind, UpperCamelCase.
    pub kind: String,
    /// API group (a DNS subdomain with a dot).
    pub group: String,
    /// API version (a DNS-1123 label, e.g. `v1alpha1`).
    pub version: String,
    /// Resource plural.
    pub plural: String,
    /// The `wasmop-guest = …` dependency line.
    pub sdk: String,
}

/// Runs `wasmop new`.
pub fn run(args: NewArgs) -> anyhow::Result<()> {
    let sdk = match &args.sdk_path {
        Some(dir) => path_dependency(dir)?,
        None => format!("wasmop-guest = {{ path = \"{SDK_DIR}/wasmop-guest\" }}"),
    };
    let scaffold = Scaffold::new(
        &args.name,
        args.kind.as_deref(),
        &args.group,
        &args.version,
        args.plural.as_deref(),
        sdk,
    )?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    if args.lang == Lang::Starlark {
        write_files(&dir, &scaffold, STARLARK_FILES)?;
        return super::print(&format!(
            "created {} ({} {}/{}, plugin {}, in Starlark)\n\nnext:\n  cd {}\n  wasmop \
             test\n  wasmop render --plugin plugin.star --parent sample.yaml\n  wasmop package plugin.star > \
             configmap.yaml\n\nthe README says how to install it on a cluster\n",
            dir.display(),
            scaffold.kind,
            scaffold.group,
            scaffold.version,
            scaffold.name,
            dir.display(),
        ));
    }
    write(&dir, &scaffold)?;
    if args.sdk_path.is_none() {
        write_sdk(&dir)?;
    }
    let wasm = format!(
        "target/wasm32-wasip2/release/{}.wasm",
        scaffold.crate_name()
    );
    super::print(&format!(
        "created {} ({} {}/{}, plugin {})\n\nnext:\n  cd {}\n  cargo test\n  cargo build \
         --release --target wasm32-wasip2\n  cargo run -q --example crd > crd.yaml\n  wasmop \
         render --plugin {wasm} --parent sample.yaml\n  wasmop package {wasm} > \
         configmap.yaml\n\nthe README says how to install it on a cluster\n",
        dir.display(),
        scaffold.kind,
        scaffold.group,
        scaffold.version,
        scaffold.name,
        dir.display(),
    ))
}

impl Scaffold {
    /// Checks every name; `kind` defaults to the UpperCamelCase of `name`, `plural` to the
    /// guess `wasmop rbac` makes (so the two agree).
    pub fn new(
        name: &str,
        kind: Option<&str>,
        group: &str,
        version: &str,
        plural: Option<&str>,
        sdk: String,
    ) -> anyhow::Result<Self> {
        let starts_with_letter = name.starts_with(|c: char| c.is_ascii_lowercase());
        if !is_dns1123_label(name) || !starts_with_letter {
            bail!(
                "{name:?} is not a plugin name: use lowercase letters, digits and '-', starting \
                 with a letter, at most 63 characters (it names the crate, the plugin and its \
                 ConfigMap)"
            );
        }
        // Names rustc or cargo reserve for their own crates.
        if ["core", "std", "alloc", "test", "proc-macro", "build"].contains(&name) {
            bail!("{name:?} names a Rust built-in crate: choose another plugin name");
        }
        let kind = kind.map_or_else(|| camel(name), str::to_owned);
        let kind_ok = kind.starts_with(|c: char| c.is_ascii_uppercase())
            && kind.chars().all(|c| c.is_ascii_alphanumeric())
            && kind.len() <= 63;
        if !kind_ok {
            bail!("--kind {kind:?} is not a kind: UpperCamelCase letters and digits, e.g. WebApp");
        }
        if !is_dns1123_subdomain(group) || !group.contains('.') {
            bail!("--group {group:?} is not an API group: a DNS name with a dot, e.g. example.com");
        }
        let version_ok = is_dns1123_label(version)
            && version.starts_with('v')
            && version[1..].starts_with(|c: char| c.is_ascii_digit());
        if !version_ok {
            bail!("--version {version:?} is not an API version: e.g. v1, v1alpha1, v2beta3");
        }
        let plural = plural.map_or_else(|| guess_plural(&kind), str::to_owned);
        if !is_dns1123_label(&plural) || format!("{plural}.{group}").len() > 253 {
            bail!("--plural {plural:?} is not a resource plural: lowercase, e.g. webapps");
        }
        Ok(Self {
            name: name.to_owned(),
            kind,
            group: group.to_owned(),
            version: version.to_owned(),
            plural,
            sdk,
        })
    }

    /// The crate's Rust name: `web-app` → `web_app` (also the `.wasm` file's stem).
    pub fn crate_name(&self) -> String {
        self.name.replace('-', "_")
    }

    /// A template with every placeholder filled.
    pub fn fill(&self, template: &str) -> String {
        template
            .replace("__SDK__", &self.sdk)
            .replace("__NAME__", &self.name)
            .replace("__CRATE__", &self.crate_name())
            .replace("__KIND__", &self.kind)
            .replace("__LOWER__", &self.kind.to_lowercase())
            .replace("__GROUP__", &self.group)
            .replace("__VERSION__", &self.version)
            .replace("__PLURAL__", &self.plural)
    }
}

/// Writes the scaffold into `dir`, which must be absent or empty.
pub fn write(dir: &Path, scaffold: &Scaffold) -> anyhow::Result<()> {
    write_files(dir, scaffold, FILES)
}

/// Writes `files`, filled, into `dir`, which must be absent or empty.
fn write_files(dir: &Path, scaffold: &Scaffold, files: &[(&str, &str)]) -> anyhow::Result<()> {
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && entries.next().is_some()
    {
        bail!(
            "{} exists and is not empty: choose another --dir",
            dir.display()
        );
    }
    for (path, template) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, scaffold.fill(template))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes the SDK's crates into `dir/sdk/`.
fn write_sdk(dir: &Path) -> anyhow::Result<()> {
    for (path, bytes) in SDK {
        let path = dir.join(SDK_DIR).join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `wasmop-guest = { path = "…" }` for an SDK checkout, after checking it is one.
fn path_dependency(dir: &Path) -> anyhow::Result<String> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("--sdk-path {}", dir.display()))?;
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))
        .with_context(|| format!("--sdk-path {}: no Cargo.toml", dir.display()))?;
    if !manifest
        .lines()
        .any(|l| l.trim() == "name = \"wasmop-guest\"")
    {
        bail!(
            "--sdk-path {}: its Cargo.toml is not the wasmop-guest crate (the SDK is guest-sdk/ \
             in a wasmop checkout)",
            dir.display()
        );
    }
    // TOML basic strings take the path as JSON escapes it.
    let path = serde_json::to_string(&dir.to_string_lossy())?;
    Ok(format!("wasmop-guest = {{ path = {path} }}"))
}

/// `web-app` → `WebApp`.
fn camel(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaffold(name: &str) -> anyhow::Result<Scaffold> {
        Scaffold::new(name, None, "example.com", "v1alpha1", None, "sdk".into())
    }

    #[test]
    fn names_follow_the_plugin_name() {
        let s = scaffold("web-app").unwrap();
        assert_eq!((s.kind.as_str(), s.plural.as_str()), ("WebApp", "webapps"));
        assert_eq!(s.crate_name(), "web_app");
        assert_eq!(
            s.fill("__KIND__Spec __GROUP__/__VERSION__ __LOWER__"),
            "WebAppSpec example.com/v1alpha1 webapp"
        );
    }

    #[test]
    fn every_template_is_filled() {
        let s = scaffold("web-app").unwrap();
        for (path, template) in FILES.iter().chain(STARLARK_FILES) {
            let text = s.fill(template);
            assert!(!text.contains("__"), "{path} keeps a placeholder:\n{text}");
        }
    }

    #[test]
    fn hostile_names_are_refused_with_what_to_use() {
        for bad in ["Web", "9web", "web_app", "-web", "web/../x", ""] {
            let err = scaffold(bad).unwrap_err().to_string();
            assert!(err.contains("is not a plugin name"), "{bad}: {err}");
        }
        let kind = Scaffold::new("w", Some("web\"app"), "example.com", "v1", None, "".into());
        assert!(kind.unwrap_err().to_string().contains("--kind"));
        let group = Scaffold::new("w", None, "example", "v1", None, "".into());
        assert!(group.unwrap_err().to_string().contains("--group"));
        let version = Scaffold::new("w", None, "example.com", "1", None, "".into());
        assert!(version.unwrap_err().to_string().contains("--version"));
    }

    #[test]
    fn a_non_empty_directory_is_never_written_into() {
        let dir = std::env::temp_dir().join(format!("wasmop-new-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep"), "mine").unwrap();
        let err = write(&dir, &scaffold("web").unwrap()).unwrap_err();
        assert!(err.to_string().contains("not empty"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.join("keep")).unwrap(), "mine");
        assert!(!dir.join("Cargo.toml").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sdk_path_must_be_the_sdk() {
        let sdk = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");
        let dep = path_dependency(Path::new(sdk)).unwrap();
        assert!(dep.starts_with("wasmop-guest = { path = \""), "{dep}");
        let host = path_dependency(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap_err();
        assert!(
            host.to_string().contains("not the wasmop-guest crate"),
            "{host}"
        );
    }
}
