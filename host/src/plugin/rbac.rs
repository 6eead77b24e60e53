//! The identities and rights one plugin needs, read from its manifest: what `wasmop rbac`
//! prints and the tests apply.
//!
//! - the plugin's ServiceAccount `wasmop-plugin-<configmap>` in the host's namespace, which
//!   every write made for the plugin is made as (see [`super::identity`]);
//! - what that ServiceAccount may read and write (its kinds, status, finalizers, Events),
//!   bound to it;
//! - what the host reads with its own identity (the plugin's kinds, watched), bound to the
//!   host's ServiceAccount;
//! - a Role letting the host impersonate that one ServiceAccount, and nothing else.
//!
//! The rules are [`access::needs`], the same lists the host checks when it loads the plugin, so
//! what is granted is exactly what the check asks for. They are ClusterRoles because parents
//! may live in any namespace, or Roles in one namespace with `watch_namespace`. Kinds become
//! resources offline, without a cluster: plurals are guessed from kind names
//! ([`guess_plural`]) unless [`Options::plurals`] gives them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::ObjectMeta;
use serde_json::Value;
use wasmop_contract::{KindRef, Manifest};

use super::access::{self, Need, Resource};
use super::identity;

/// How to name and bind the rules.
#[derive(Debug, Clone)]
pub struct Options {
    /// The plugin's ConfigMap, which names its ServiceAccount; the manifest name when `None`.
    pub configmap: Option<String>,
    /// What the role names start with; `wasmop-plugin-<configmap>` when `None`.
    pub name: Option<String>,
    /// The host's namespace: its ServiceAccount's and the plugins'.
    pub namespace: String,
    /// The host's ServiceAccount.
    pub service_account: String,
    /// Rights in this namespace only (Roles), for a host run with `--watch-namespace`.
    pub watch_namespace: Option<String>,
    /// `(Kind, plural)` overrides of [`guess_plural`].
    pub plurals: Vec<(String, String)>,
}

/// The label naming the host namespace a grant is for.
pub const HOST_LABEL: &str = "wasmop.io/host";
/// The label naming the plugin ConfigMap a grant is for.
pub const FOR_LABEL: &str = "wasmop.io/rbac-for";

/// What one plugin needs.
#[derive(Debug, Clone)]
pub struct Grants {
    /// The plugin's ConfigMap.
    pub configmap: String,
    /// Its ServiceAccount.
    pub account: String,
    /// The objects that grant it, in the order they are applied.
    pub objects: Vec<Object>,
}

/// One object of [`Grants`]; serialised as the object itself.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum Object {
    /// The plugin's ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// Rights in one namespace.
    Role(Role),
    /// Binds a [`Role`].
    RoleBinding(RoleBinding),
    /// Rights in every namespace.
    ClusterRole(ClusterRole),
    /// Binds a [`ClusterRole`].
    ClusterRoleBinding(ClusterRoleBinding),
}

impl Object {
    /// The object as JSON, `apiVersion` and `kind` included.
    pub fn to_value(&self) -> Value {
        let value = match self {
            Object::ServiceAccount(o) => serde_json::to_value(o),
            Object::Role(o) => serde_json::to_value(o),
            Object::RoleBinding(o) => serde_json::to_value(o),
            Object::ClusterRole(o) => serde_json::to_value(o),
            Object::ClusterRoleBinding(o) => serde_json::to_value(o),
        };
        value.expect("a Kubernetes object serialises")
    }
}

/// Why no grants could be made.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    /// A plural was given for a kind the plugin does not have.
    #[error("--plural {kind}=…: plugin {plugin} has no kind {kind} (its kinds: {kinds})")]
    UnknownKind {
        /// The plugin.
        plugin: String,
        /// The kind named.
        kind: String,
        /// The plugin's kinds.
        kinds: String,
    },
    /// The ConfigMap's name makes no ServiceAccount name.
    #[error(transparent)]
    Account(identity::NameTooLong),
}

/// What the plugin of `manifest` needs, named and bound as `options` says.
pub fn grants(manifest: &Manifest, options: &Options) -> Result<Grants, RbacError> {
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
        return Err(RbacError::UnknownKind {
            plugin: manifest.name.clone(),
            kind: kind.clone(),
            kinds: kinds.join(", "),
        });
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

    let configmap = options.configmap.as_deref().unwrap_or(&manifest.name);
    let account = identity::service_account(configmap).map_err(RbacError::Account)?;
    let base = options.name.clone().unwrap_or_else(|| account.clone());
    // Found and removed by these: `kubectl delete … -l wasmop.io/host=<namespace>`.
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/part-of".to_string(),
            "wasmop".to_string(),
        ),
        (HOST_LABEL.to_string(), options.namespace.clone()),
        (FOR_LABEL.to_string(), label_value(configmap)),
    ]);
    let meta = |name: String, namespace: Option<&str>| ObjectMeta {
        name: Some(name),
        namespace: namespace.map(str::to_string),
        labels: Some(labels.clone()),
        ..Default::default()
    };
    // Outside the host's namespace two hosts may grant a plugin of the same name: the default
    // names there say which host's it is.
    let outside = options.watch_namespace.as_deref() != Some(options.namespace.as_str());
    let placed = |name: String| {
        if options.name.is_none() && outside {
            format!("{name}.{}", options.namespace)
        } else {
            name
        }
    };
    let subject = |name: &str| Subject {
        kind: "ServiceAccount".into(),
        name: name.to_string(),
        namespace: Some(options.namespace.clone()),
        ..Default::default()
    };
    let host_ns = Some(options.namespace.as_str());
    let mut objects = vec![Object::ServiceAccount(ServiceAccount {
        metadata: meta(account.clone(), host_ns),
        // Never mounted: the host impersonates it, nothing runs as it.
        automount_service_account_token: Some(false),
        ..Default::default()
    })];
    let grants = [
        (placed(base.clone()), rules(&needs.plugin), &account),
        (
            placed(format!("{base}-reads")),
            rules(&needs.host),
            &options.service_account,
        ),
    ];
    for (name, rules, to) in grants {
        let watch = options.watch_namespace.as_deref();
        let role_ref = |kind: &str| RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: kind.into(),
            name: name.clone(),
        };
        if watch.is_some() {
            objects.push(Object::Role(Role {
                metadata: meta(name.clone(), watch),
                rules: Some(rules),
            }));
            objects.push(Object::RoleBinding(RoleBinding {
                metadata: meta(name.clone(), watch),
                role_ref: role_ref("Role"),
                subjects: Some(vec![subject(to)]),
            }));
        } else {
            objects.push(Object::ClusterRole(ClusterRole {
                metadata: meta(name.clone(), None),
                rules: Some(rules),
                ..Default::default()
            }));
            objects.push(Object::ClusterRoleBinding(ClusterRoleBinding {
                metadata: meta(name.clone(), None),
                role_ref: role_ref("ClusterRole"),
                subjects: Some(vec![subject(to)]),
            }));
        }
    }
    let impersonate = format!("{base}-impersonate");
    objects.push(Object::Role(Role {
        metadata: meta(impersonate.clone(), host_ns),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["serviceaccounts".into()]),
            resource_names: Some(vec![account.clone()]),
            verbs: vec!["impersonate".into()],
            ..Default::default()
        }]),
    }));
    objects.push(Object::RoleBinding(RoleBinding {
        metadata: meta(impersonate.clone(), host_ns),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: impersonate,
        },
        subjects: Some(vec![subject(&options.service_account)]),
    }));
    Ok(Grants {
        configmap: configmap.to_string(),
        account,
        objects,
    })
}

/// `name` as a label value: itself when it fits the 63 characters a label value may have, else
/// its first 46 and a hash of the whole, so that it still tells plugins apart.
pub fn label_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let hash = wasmop_contract::hash::fnv1a64(name.as_bytes());
    let head = name[..46].trim_end_matches(['-', '.']);
    format!("{head}-{hash:016x}")
}

/// [`grants`], as one JSON value per object: what a caller applies itself.
pub fn objects(manifest: &Manifest, options: &Options) -> Result<Vec<Value>, RbacError> {
    Ok(grants(manifest, options)?
        .objects
        .iter()
        .map(Object::to_value)
        .collect())
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

    use crate::fixtures::rbac_options as options;

    #[test]
    fn long_configmap_names_fit_a_label() {
        let long = format!("a{}", "-b".repeat(100));
        let value = label_value(&long);
        assert!(value.len() <= 63, "{value}");
        assert_ne!(
            value,
            label_value(&format!("{long}c")),
            "a hash tells them apart"
        );
        assert_eq!(label_value("memcached"), "memcached");
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
            clock_seconds: None,
        };
        let mut opts = options();
        opts.plurals = vec![("Endpoints".into(), "endpoints".into())];
        opts.name = Some("edge-rbac".into());
        let docs = objects(&manifest, &opts).unwrap();
        let joined = |v: &serde_json::Value| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(",")
        };
        let rules = |doc: &serde_json::Value| -> Vec<String> {
            doc["rules"]
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
                .collect()
        };
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding"
            ]
        );
        assert_eq!(docs[0]["metadata"]["name"], "wasmop-plugin-edge");
        assert_eq!(docs[0]["automountServiceAccountToken"], false);
        // The plugin's identity writes.
        assert_eq!(
            rules(&docs[1]),
            [
                "net.example.com: gateways [get,list,watch,patch]",
                ": services,endpoints [get,list,watch,create,patch,delete]",
                ": pods [get,list,watch]",
                "net.example.com: gateways/status [patch]",
                "net.example.com: gateways/finalizers [update]",
                "events.k8s.io: events [create,patch]",
            ]
        );
        assert_eq!(docs[2]["roleRef"]["name"], "edge-rbac");
        assert_eq!(docs[2]["subjects"][0]["name"], "wasmop-plugin-edge");
        // The host reads.
        assert_eq!(
            rules(&docs[3]),
            [
                "net.example.com: gateways [get,list,watch]",
                ": services,endpoints,pods [get,list,watch]",
            ]
        );
        assert_eq!(docs[4]["roleRef"]["name"], "edge-rbac-reads");
        assert_eq!(docs[4]["subjects"][0]["name"], "wasmop");
        // And may impersonate that one account, in its own namespace.
        assert_eq!(docs[5]["metadata"]["namespace"], "wasmop-system");
        assert_eq!(docs[5]["rules"][0]["verbs"][0], "impersonate");
        assert_eq!(
            docs[5]["rules"][0]["resourceNames"],
            serde_json::json!(["wasmop-plugin-edge"])
        );
        assert_eq!(docs[6]["subjects"][0]["name"], "wasmop");

        // One namespace: Roles there, the account and the impersonation where the host is.
        opts.watch_namespace = Some("team-a".into());
        opts.configmap = Some("edge-v2".into());
        let docs = objects(&manifest, &opts).unwrap();
        let placed: Vec<String> = docs
            .iter()
            .map(|d| {
                format!(
                    "{} {}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["namespace"]
                )
            })
            .collect();
        assert_eq!(
            placed,
            [
                "ServiceAccount \"wasmop-system\"",
                "Role \"team-a\"",
                "RoleBinding \"team-a\"",
                "Role \"team-a\"",
                "RoleBinding \"team-a\"",
                "Role \"wasmop-system\"",
                "RoleBinding \"wasmop-system\"",
            ]
        );
        assert_eq!(docs[0]["metadata"]["name"], "wasmop-plugin-edge-v2");

        opts.plurals = vec![("Nope".into(), "nopes".into())];
        let err = objects(&manifest, &opts).unwrap_err().to_string();
        assert!(err.contains("has no kind Nope"), "{err}");
    }
}
