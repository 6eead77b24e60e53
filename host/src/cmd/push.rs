//! `wasmop push`: a plugin module (or a script plugin's script) to a registry, as the one-layer
//! artifact [`crate::plugin::oci`] pulls, after loading it the way the host does (a plugin
//! that would not load is not published). Prints the reference pinned to the manifest's digest: what a
//! plugin ConfigMap names to run exactly this module. With `--sign-key`, the digest is also
//! signed as cosign signs it ([`crate::plugin::oci::Policy`] says who must have).

use anyhow::{Context, bail};

use crate::cli::PushArgs;
use crate::plugin::oci::{Credentials, Limits, OciClient, Reference, SigningKey};

/// Runs `wasmop push`.
pub fn run(args: PushArgs) -> anyhow::Result<()> {
    let reference = target(&args.reference)?;
    let language = crate::sandbox::Language::of_key(&args.plugin.to_string_lossy());
    let (wasm, plugin) = crate::plugin::offline::load_file(&args.plugin)?;
    let credentials = credentials(args.docker_config.as_deref(), &reference)?;
    let key = match &args.sign_key {
        Some(path) => {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let key: SigningKey = pem
                .parse()
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(key)
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let digest = runtime.block_on(async {
        let registry = OciClient::new(&reference, credentials, Limits::default())?;
        let digest = registry.push_plugin(&reference, language, &wasm).await?;
        if let Some(key) = &key {
            registry.sign(&reference, &digest, key).await?;
            eprintln!(
                "signed {digest} with key {}",
                key.public_key().fingerprint()
            );
        }
        anyhow::Ok(digest)
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

/// The credentials for `reference`'s registry in the Docker config at `path`, if any.
pub(super) fn credentials(
    path: Option<&std::path::Path>,
    reference: &Reference,
) -> anyhow::Result<Option<Credentials>> {
    let Some(path) = path else { return Ok(None) };
    let json = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Credentials::from_docker_config(&json, &reference.registry)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Where to push: a reference with no digest (the digest is the answer).
pub(super) fn target(reference: &str) -> anyhow::Result<Reference> {
    let parsed: Reference = reference
        .parse()
        .map_err(|e: String| anyhow::anyhow!("{reference}: {e}"))?;
    if parsed.digest.is_some() {
        bail!("{parsed}: push to a tag or to the repository alone; the digest is the answer");
    }
    Ok(parsed)
}
