//! A plugin loaded without a cluster, for the commands that work on a module file (`wasmop
//! render`, `inspect`, `rbac`, `package`, `replay`, `capture`) and the tests: the same sandbox
//! and checks as the host's, so a module the host would refuse is refused here too.

use std::path::Path;

use anyhow::Context;

use crate::sandbox::{Limits, Plugin, Sandbox, SandboxConfig};

/// Loads `wasm` under `limits` in a small sandbox of its own.
pub fn load(wasm: &[u8], limits: Limits) -> anyhow::Result<Plugin> {
    // Two slots: `render` calls `related` and `reconcile` one after the other.
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 2,
        ..SandboxConfig::default()
    })?;
    Ok(sandbox.load_blocking(wasm, limits)?)
}

/// Reads the module at `path` and loads it with default limits.
pub fn load_file(path: &Path) -> anyhow::Result<(Vec<u8>, Plugin)> {
    load_file_with(path, Limits::default())
}

/// Reads the module at `path` and loads it under `limits`.
pub fn load_file_with(path: &Path, limits: Limits) -> anyhow::Result<(Vec<u8>, Plugin)> {
    let wasm = std::fs::read(path).with_context(|| format!("reading plugin {}", path.display()))?;
    let plugin =
        load(&wasm, limits).with_context(|| format!("loading plugin {}", path.display()))?;
    Ok((wasm, plugin))
}
