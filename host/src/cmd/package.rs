//! `wasmop package`: prints a plugin module as the ConfigMap the host loads it from
//! ([`crate::plugin::package`]). The module is loaded in the sandbox first, as `inspect` does,
//! so a broken module is refused here rather than in a cluster. A module in a registry is
//! pulled and loaded the same way, and its ConfigMap names it pinned by digest.

use anyhow::Context;

use crate::cli::PackageArgs;
use crate::plugin::oci::{Limits, OciClient, Reference, SCHEME};
use crate::plugin::offline;
use crate::plugin::package::{package, package_reference, package_script};
use crate::sandbox::Language;

/// Runs `wasmop package`.
pub fn run(args: PackageArgs) -> anyhow::Result<()> {
    let settings = settings(&args)?;
    if let Some(reference) = args.plugin.to_str().filter(|p| p.starts_with(SCHEME)) {
        return from_registry(reference, &args, settings);
    }
    let (wasm, plugin) = offline::load_file(&args.plugin)?;
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

/// The ConfigMap for a module in a registry: pulled (a tag resolved to its digest once, here)
/// and loaded as the host would, then named pinned.
fn from_registry(
    reference: &str,
    args: &PackageArgs,
    settings: Option<String>,
) -> anyhow::Result<()> {
    let parsed: Reference = reference
        .parse()
        .map_err(|e: String| anyhow::anyhow!("{reference}: {e}"))?;
    let credentials = super::push::credentials(args.docker_config.as_deref(), &parsed)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let pulled = runtime.block_on(async {
        OciClient::new(&parsed, credentials, Limits::default())?
            .pull(&parsed)
            .await
    })?;
    let language = pulled.language();
    let file = match language {
        Some(language) => format!("plugin.{}", language.extension()),
        None => "plugin.wasm".to_string(),
    };
    let plugin = offline::load(&file, &pulled.module, crate::sandbox::Limits::default())
        .with_context(|| format!("loading the plugin of {}", pulled.reference))?;
    let manifest = plugin.manifest();
    let name = args.name.clone().unwrap_or_else(|| manifest.name.clone());
    let packaged = package_reference(
        &pulled.reference,
        language,
        &name,
        &args.namespace,
        settings,
        args.pull_secret.as_deref(),
    )?;
    super::print(&format!(
        "# Plugin {} {}, {}: {} bytes in {}.\n{}",
        manifest.name,
        manifest.version,
        plugin.digest(),
        pulled.module.len(),
        pulled.reference,
        serde_yaml::to_string(&packaged.configmap)?
    ))
}

fn settings(args: &PackageArgs) -> anyhow::Result<Option<String>> {
    Ok(match &args.settings {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading settings {}", path.display()))?;
            // The host would refuse settings that do not parse; refuse them here already.
            serde_yaml::from_str::<serde_yaml::Value>(&text)
                .with_context(|| format!("settings {}", path.display()))?;
            Some(text)
        }
        None => None,
    })
}
