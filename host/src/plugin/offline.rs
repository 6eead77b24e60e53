//! A plugin loaded without a cluster, for the commands that work on a module or script file (`wasmop
//! render`, `inspect`, `rbac`, `package`, `replay`, `capture`) and the tests: the same sandbox
//! and checks as the host's, so a module the host would refuse is refused here too.

use std::path::Path;

use anyhow::Context;

use crate::sandbox::{Language, Limits, Plugin, Sandbox, SandboxConfig};

/// Loads `module`, named `name` (a file or ConfigMap key: a script by its extension, else a
/// component), under `limits` in a small sandbox of its own.
pub fn load(name: &str, module: &[u8], limits: Limits) -> anyhow::Result<Plugin> {
    // Two slots: `render` calls `related` and `reconcile` one after the other.
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 2,
        ..SandboxConfig::default()
    })?;
    Ok(match Language::of_key(name) {
        Some(language) => sandbox.load_script_blocking(language, name, module, limits)?,
        None => sandbox.load_blocking(module, limits)?,
    })
}

/// Reads the module at `path` and loads it with default limits.
pub fn load_file(path: &Path) -> anyhow::Result<(Vec<u8>, Plugin)> {
    load_file_with(path, Limits::default())
}

/// Reads the module at `path` and loads it under `limits`.
pub fn load_file_with(path: &Path, limits: Limits) -> anyhow::Result<(Vec<u8>, Plugin)> {
    let wasm = std::fs::read(path).with_context(|| format!("reading plugin {}", path.display()))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let plugin =
        load(&name, &wasm, limits).with_context(|| format!("loading plugin {}", path.display()))?;
    Ok((wasm, plugin))
}
