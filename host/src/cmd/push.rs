//! `wasmop push`: a plugin module to a registry, as the one-layer wasm artifact
//! [`crate::plugin::oci`] pulls, after loading it the way the host does (a module that would
//! not load is not published). Prints the reference pinned to the manifest's digest: what a
//! plugin ConfigMap names to run exactly this module.

use anyhow::{Context, bail};

use crate::cli::PushArgs;
use crate::plugin::oci::{Credentials, Limits, OciClient, Reference};

/// Runs `wasmop push`.
pub fn run(args: PushArgs) -> anyhow::Result<()> {
    let reference: Reference = args
        .reference
        .parse()
        .map_err(|e: String| anyhow::anyhow!("{}: {e}", args.reference))?;
    if reference.digest.is_some() {
        bail!("{reference}: push to a tag or to the repository alone; the digest is the answer");
    }
    if crate::sandbox::Language::of_key(&args.plugin.to_string_lossy()).is_some() {
        bail!(
            "{}: scripts are published in their ConfigMap (`wasmop package`); a registry holds modules",
            args.plugin.display()
        );
    }
    let (wasm, plugin) = crate::plugin::offline::load_file(&args.plugin)?;
    let credentials = match &args.docker_config {
        Some(path) => {
            let json =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Credentials::from_docker_config(&json, &reference.registry)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let digest = runtime.block_on(async {
        let registry = OciClient::new(&reference, credentials, Limits::default())?;
        registry.push(&reference, &wasm).await
    })?;
    eprintln!(
        "pushed {} {} ({} bytes, module {})",
        plugin.manifest().name,
        plugin.manifest().version,
        wasm.len(),
        plugin.digest()
    );
    super::print(&format!("{}\n", reference.pinned(digest)))?;
    Ok(())
}
