//! `wasmop package`: prints a plugin module as the ConfigMap the host loads it from
//! ([`crate::plugin::package`]). The module is loaded in the sandbox first, as `inspect` does,
//! so a broken module is refused here rather than in a cluster.

use anyhow::Context;

use crate::cli::PackageArgs;
use crate::plugin::offline;
use crate::plugin::package::{package, package_script};
use crate::sandbox::Language;

/// Runs `wasmop package`.
pub fn run(args: PackageArgs) -> anyhow::Result<()> {
    let (wasm, plugin) = offline::load_file(&args.plugin)?;
    let settings = match &args.settings {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading settings {}", path.display()))?;
            // The host would refuse settings that do not parse; refuse them here already.
            serde_yaml::from_str::<serde_yaml::Value>(&text)
                .with_context(|| format!("settings {}", path.display()))?;
            Some(text)
        }
        None => None,
    };
    let manifest = plugin.manifest();
    let name = args.name.unwrap_or_else(|| manifest.name.clone());
    let file = args
        .plugin
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    let packaged = match Language::of_key(&file) {
        // `offline::load_file` took it as UTF-8 text already.
        Some(_) => package_script(
            &file,
            &String::from_utf8_lossy(&wasm),
            &name,
            &args.namespace,
            settings,
        )?,
        None => package(&wasm, &name, &args.namespace, settings)?,
    };
    super::print(&format!(
        "# Plugin {} {}, {}: {} bytes, stored as {} ({} bytes).\n\
         # Apply with `kubectl apply --server-side -f -`: a client-side apply would also copy the\n\
         # module into an annotation, and annotations hold at most 256 KiB.\n{}",
        manifest.name,
        manifest.version,
        plugin.digest(),
        wasm.len(),
        packaged.key,
        packaged.stored,
        serde_yaml::to_string(&packaged.configmap)?
    ))
}
