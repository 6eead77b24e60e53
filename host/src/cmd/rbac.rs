//! `wasmop rbac`: the RBAC the host needs to run one plugin, read from the plugin's manifest
//! and printed as a ClusterRole bound to the host's ServiceAccount.
//!
//! The rules are [`access::needs`], the same list the host checks when it loads the plugin, so
//! what this prints is exactly what the check asks for. They are cluster-wide because parents
//! may live in any namespace. Kinds become resources offline, without a cluster: plurals are
//! guessed from kind names ([`guess_plural`]) unless `--plural` gives them.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::ObjectMeta;
use wasmop_contract::{KindRef, Manifest};

use crate::cli::RbacArgs;
use crate::plugin::access::{self, Need, Resource};

/// How to name and bind the rules.
#[derive(Debug, Clone)]
pub struct Options {
    /// ClusterRole and ClusterRoleBinding name; `wasmop-plugin-<plugin>` when `None`.
    pub name: Option<String>,
    /// Namespace of the host's ServiceAccount.
    pub namespace: String,
    /// The host's ServiceAccount.
    pub service_account: String,
    /// `(Kind, plural)` overrides of [`guess_plural`].
    pub plurals: Vec<(String, String)>,
}

/// Runs `wasmop rbac`.
pub fn run(args: RbacArgs) -> anyhow::Result<()> {
    let (_, plugin) = super::load_module(&args.plugin)?;
    let options = Options {
        name: args.name,
        namespace: args.namespace,
        service_account: args.service_account,
        plurals: args.plurals,
    };
    print!("{}", render(plugin.manifest(), &options)?);
    Ok(())
}

/// The ClusterRole and ClusterRoleBinding for `manifest`, as a commented multi-document YAML.
pub fn render(manifest: &Manifest, options: &Options) -> anyhow::Result<String> {
    let kinds: Vec<&str> = std::iter::once(&manifest.parent)
        .chain(&manifest.children)
        .map(|k| k.kind.as_str())
        .chain(manifest.related.iter().map(|r| r.kind.as_str()))
        .collect();
    if let Some((kind, _)) = options
        .plurals
        .iter()
        .find(|(k, _)| !kinds.contains(&k.as_str()))
    {
        anyhow::bail!(
            "--plural {kind}=…: plugin {} has no kind {kind} (its kinds: {})",
            manifest.name,
            kinds.join(", ")
        );
    }
    let resource = |k: &KindRef| Resource {
        group: k.group().to_string(),
        plural: options
            .plurals
            .iter()
            .find(|(kind, _)| *kind == k.kind)
            .map_or_else(|| guess_plural(&k.kind), |(_, p)| p.clone()),
        // A ClusterRole covers both scopes.
        namespaced: true,
    };
    let children: Vec<Resource> = manifest.children.iter().map(resource).collect();
    let related: Vec<Resource> = manifest
        .related
        .iter()
        .map(|r| resource(&r.kind_ref()))
        .collect();
    let needs = access::needs(&resource(&manifest.parent), &children, &related);

    let name = options
        .name
        .clone()
        .unwrap_or_else(|| format!("wasmop-plugin-{}", manifest.name));
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/part-of".to_string(),
            "wasmop".to_string(),
        )])),
        ..Default::default()
    };
    let role = ClusterRole {
        metadata: metadata.clone(),
        rules: Some(rules(&needs)),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: options.service_account.clone(),
            namespace: Some(options.namespace.clone()),
            ..Default::default()
        }]),
    };
    Ok(format!(
        "# What the wasmop host needs to run the plugin {:?} in every namespace: its parent, child\n\
         # and related kinds, and Events on parents. Printed by `wasmop rbac`; resource plurals are\n\
         # guessed from kind names (compare with `kubectl api-resources`, fix with --plural).\n\
         ---\n{}---\n{}",
        manifest.name,
        serde_yaml::to_string(&role)?,
        serde_yaml::to_string(&binding)?
    ))
}

/// One rule per API group and verb set, resources in order of first appearance.
fn rules(needs: &[Need]) -> Vec<PolicyRule> {
    let mut rules: Vec<PolicyRule> = Vec::new();
    for need in needs {
        let verbs: Vec<String> = need.verbs.iter().map(|v| v.to_string()).collect();
        let same = rules.iter_mut().find(|r| {
            r.api_groups.as_deref() == Some(std::slice::from_ref(&need.group)) && r.verbs == verbs
        });
        match same {
            Some(rule) => rule
                .resources
                .get_or_insert_with(Vec::new)
                .push(need.rbac_resource()),
            None => rules.push(PolicyRule {
                api_groups: Some(vec![need.group.clone()]),
                resources: Some(vec![need.rbac_resource()]),
                verbs,
                ..Default::default()
            }),
        }
    }
    rules
}

/// The resource plural Kubernetes most likely uses for `kind`: lowercase, then `es` after s,
/// x, ch or sh, `ies` in place of a y after a consonant, else `s`. A guess: irregular kinds
/// (`Endpoints` → `endpoints`) need `--plural`.
pub fn guess_plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if ["s", "x", "ch", "sh"]
        .iter()
        .any(|end| lower.ends_with(end))
    {
        return format!("{lower}es");
    }
    if let Some(stem) = lower.strip_suffix('y')
        && stem.chars().last().is_some_and(|c| !"aeiou".contains(c))
    {
        return format!("{stem}ies");
    }
    format!("{lower}s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmop_contract::RelatedKind;

    fn options() -> Options {
        Options {
            name: None,
            namespace: "wasmop-system".into(),
            service_account: "wasmop".into(),
            plurals: Vec::new(),
        }
    }

    /// The Memcached plugin's manifest, from its native build: the SDK's type is the host's.
    fn memcached_manifest() -> Manifest {
        use wasmop_guest::Plugin;
        memcached::MemcachedPlugin::manifest()
    }

    #[test]
    fn plurals() {
        let cases = [
            ("Memcached", "memcacheds"),
            ("Deployment", "deployments"),
            ("Ingress", "ingresses"),
            ("Box", "boxes"),
            ("Patch", "patches"),
            ("Mesh", "meshes"),
            ("NetworkPolicy", "networkpolicies"),
            ("Gateway", "gateways"),
            ("ConfigMap", "configmaps"),
        ];
        for (kind, plural) in cases {
            assert_eq!(guess_plural(kind), plural, "{kind}");
        }
    }

    /// `deploy/rbac/memcached.yaml` is what `wasmop rbac memcached.wasm` prints. Regenerate it:
    /// `make deploy-plugin && wasmop rbac deploy/plugins/memcached.wasm > deploy/rbac/memcached.yaml`
    #[test]
    fn deploy_rbac_matches_the_memcached_manifest() {
        let printed = render(&memcached_manifest(), &options()).unwrap();
        let file = include_str!("../../../deploy/rbac/memcached.yaml");
        assert_eq!(printed, file);
    }

    #[test]
    fn rules_follow_the_manifest_and_overrides() {
        let manifest = Manifest {
            name: "edge".into(),
            version: "1".into(),
            parent: KindRef::new("net.example.com/v1", "Gateway"),
            children: vec![
                KindRef::new("v1", "Service"),
                KindRef::new("v1", "Endpoints"),
            ],
            related: vec![RelatedKind {
                api_version: "v1".into(),
                kind: "Pod".into(),
                metadata_only: true,
            }],
            finalizer: true,
        };
        let mut opts = options();
        opts.plurals = vec![("Endpoints".into(), "endpoints".into())];
        opts.name = Some("edge-rbac".into());
        let yaml = render(&manifest, &opts).unwrap();
        let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let joined = |v: &serde_json::Value| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(",")
        };
        let rules: Vec<String> = docs[0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}: {} [{}]",
                    r["apiGroups"][0].as_str().unwrap(),
                    joined(&r["resources"]),
                    joined(&r["verbs"]),
                )
            })
            .collect();
        assert_eq!(
            rules,
            [
                "net.example.com: gateways [get,list,watch,patch]",
                "net.example.com: gateways/status [patch]",
                "net.example.com: gateways/finalizers [update]",
                ": services,endpoints [get,list,watch,create,patch,delete]",
                ": pods [get,list,watch]",
                "events.k8s.io: events [create,patch]",
            ]
        );
        assert_eq!(docs[1]["roleRef"]["name"], "edge-rbac");
        assert_eq!(docs[1]["subjects"][0]["namespace"], "wasmop-system");

        opts.plurals = vec![("Nope".into(), "nopes".into())];
        let err = render(&manifest, &opts).unwrap_err().to_string();
        assert!(err.contains("has no kind Nope"), "{err}");
    }
}
