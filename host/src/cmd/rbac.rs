//! `wasmop rbac`: prints, as one commented multi-document YAML, the identities and rights one
//! plugin needs ([`crate::plugin::rbac`]).

use crate::cli::RbacArgs;
use crate::plugin::rbac::{self, Options};
use wasmop_contract::Manifest;

/// Runs `wasmop rbac`.
pub fn run(args: RbacArgs) -> anyhow::Result<()> {
    let (_, plugin) = crate::plugin::offline::load_file(&args.plugin)?;
    let options = Options {
        configmap: args.configmap,
        name: args.name,
        namespace: args.namespace,
        service_account: args.service_account,
        watch_namespace: args.watch_namespace,
        plurals: args.plurals,
    };
    super::print(&render(plugin.manifest(), &options)?)?;
    Ok(())
}

/// The grants for `manifest`, as a commented multi-document YAML.
pub fn render(manifest: &Manifest, options: &Options) -> anyhow::Result<String> {
    let grants = rbac::grants(manifest, options)?;
    let docs = grants
        .objects
        .iter()
        .map(serde_yaml::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    let scope = options
        .watch_namespace
        .as_deref()
        .map_or("every namespace".to_string(), |ns| {
            format!("namespace {ns}")
        });
    Ok(format!(
        "# What the plugin {:?} needs in {scope}, printed by `wasmop rbac`:\n\
         # - ServiceAccount {}/{} (from ConfigMap {}),\n\
         #   which makes every write for the plugin (children, status, finalizers, Events)\n\
         #   and must be allowed to read whatever the host hands the plugin;\n\
         # - what the host ({}) reads with its own identity;\n\
         # - the host's right to impersonate that one ServiceAccount.\n\
         # Resource plurals are guessed from kind names (compare with `kubectl api-resources`,\n\
         # fix with --plural).\n\
         ---\n{}",
        manifest.name,
        options.namespace,
        grants.account,
        grants.configmap,
        options.service_account,
        docs.join("---\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixtures::rbac_options as options;

    /// The Memcached plugin's manifest, from its native build: the SDK's type is the host's.
    fn memcached_manifest() -> Manifest {
        use wasmop_guest::Plugin;
        memcached::MemcachedPlugin::manifest()
    }

    /// `deploy/rbac/memcached.yaml` is what `wasmop rbac memcached.wasm` prints. Regenerate it:
    /// `make deploy-plugin && wasmop rbac deploy/plugins/memcached.wasm > deploy/rbac/memcached.yaml`
    #[test]
    fn deploy_rbac_matches_the_memcached_manifest() {
        let printed = render(&memcached_manifest(), &options()).unwrap();
        let file = include_str!("../../../deploy/rbac/memcached.yaml");
        assert_eq!(printed, file);
    }
}
