//! The kinds a plugin's manifest names, resolved into API resources through discovery: the
//! shared vocabulary of every stage after loading (watch, gather, validate, apply).

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery;

use wasmop_contract::{KindRef, Manifest};

pub use wasmop_contract::Scope;

/// A kind with what the API server told us about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedKind {
    /// As the manifest names it.
    pub kind: KindRef,
    /// Group, version, plural.
    pub resource: ApiResource,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl ResolvedKind {
    /// An `Api` in `namespace`, or cluster-wide for cluster-scoped kinds.
    pub fn api(&self, client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &self.resource),
            _ => Api::all_with(client.clone(), &self.resource),
        }
    }

    /// Whether Kubernetes itself serves this kind (core, `apps`, `*.k8s.io`…), so that its
    /// own controllers own its status: custom resources live in dotted groups outside
    /// `k8s.io`, which needs an approval to use.
    pub fn is_builtin(&self) -> bool {
        is_builtin_group(&self.resource.group)
    }

    /// The scope of this kind.
    pub fn scope(&self) -> Scope {
        if self.namespaced {
            Scope::Namespaced
        } else {
            Scope::Cluster
        }
    }
}

/// Every kind of one manifest, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kinds {
    /// The parent kind.
    pub parent: ResolvedKind,
    /// The child kinds, in manifest order.
    pub children: Vec<ResolvedKind>,
    /// The related kinds and whether each is metadata-only, in manifest order.
    pub related: Vec<(ResolvedKind, bool)>,
    /// Child kinds an earlier version of the plugin declared and this one does not: the
    /// children of those kinds that a parent controls are pruned like any undesired child.
    pub retired: Vec<ResolvedKind>,
}

impl Kinds {
    /// True when both watch the same kinds the same way (retired kinds aside).
    pub fn same_watches(&self, other: &Kinds) -> bool {
        self.parent == other.parent
            && self.children == other.children
            && self.related == other.related
    }

    /// Every kind a parent's children can have: declared, then retired.
    pub fn all_children(&self) -> Vec<ResolvedKind> {
        self.children.iter().chain(&self.retired).cloned().collect()
    }

    /// Sets [`Self::retired`] from the version this one replaces.
    pub fn retire_from(&mut self, previous: &Kinds) {
        self.retired = previous
            .all_children()
            .into_iter()
            .filter(|old| !self.children.iter().any(|k| k.kind == old.kind))
            .collect();
    }

    /// True when a controller over these kinds also sees everything `other` needs (a
    /// candidate run beside the live version).
    pub fn covers(&self, other: &Kinds) -> bool {
        let children = self.all_children();
        self.parent == other.parent
            && other.children.iter().all(|k| children.contains(k))
            && other.related.iter().all(|(k, meta)| {
                self.related
                    .iter()
                    .any(|(mine, my_meta)| mine == k && (!*my_meta || *meta))
            })
    }

    /// These kinds, with what `other` adds after them: what a controller watches to run both.
    /// A related kind one reads in full and the other as metadata is read in full.
    pub fn union(&self, other: &Kinds) -> Kinds {
        let mut out = self.clone();
        for k in other.all_children() {
            if !out.children.contains(&k) && !out.retired.contains(&k) {
                out.children.push(k);
            }
        }
        for (k, meta) in &other.related {
            match out.related.iter_mut().find(|(mine, _)| mine == k) {
                Some((_, my_meta)) => *my_meta = *my_meta && *meta,
                None => out.related.push((k.clone(), *meta)),
            }
        }
        out
    }

    /// The scope of a declared child or related kind, for validation.
    pub fn scope_of(&self, kind: &KindRef) -> Option<Scope> {
        self.children
            .iter()
            .chain(self.related.iter().map(|(k, _)| k))
            .chain(std::iter::once(&self.parent))
            .find(|k| &k.kind == kind)
            .map(ResolvedKind::scope)
    }
}

/// Why a manifest's kinds could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The API server does not serve these kinds (yet): a CRD is missing.
    #[error("not served by the API server: {}", .0.join(", "))]
    Missing(Vec<String>),
    /// Discovery itself failed.
    #[error("discovery of {kind}: {source}")]
    Discovery {
        /// The kind being resolved.
        kind: String,
        /// The failure.
        #[source]
        source: kube::Error,
    },
}

/// Whether an API group is Kubernetes' own (`""`, `apps`, `*.k8s.io`), whose kinds' status
/// belongs to their built-in controllers.
pub fn is_builtin_group(group: &str) -> bool {
    !group.contains('.') || group == "k8s.io" || group.ends_with(".k8s.io")
}

/// Splits `apps/v1` into (`apps`, `v1`) and `v1` into (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// Resolves one kind by discovery; `None` when it is not served.
pub async fn resolve_one(
    client: &Client,
    kind: &KindRef,
) -> Result<Option<ResolvedKind>, ResolveError> {
    let (group, version) = split_api_version(&kind.api_version);
    let gvk = GroupVersionKind::gvk(group, version, &kind.kind);
    match discovery::pinned_kind(client, &gvk).await {
        Ok((resource, caps)) => Ok(Some(ResolvedKind {
            kind: kind.clone(),
            resource,
            namespaced: caps.scope == discovery::Scope::Namespaced,
        })),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(kube::Error::Discovery(_)) => Ok(None),
        Err(source) => Err(ResolveError::Discovery {
            kind: format!("{}/{}", kind.api_version, kind.kind),
            source,
        }),
    }
}

/// Resolves every kind of `manifest`; lists all the missing ones at once.
pub async fn resolve(client: &Client, manifest: &Manifest) -> Result<Kinds, ResolveError> {
    let mut missing = Vec::new();
    let mut one = async |kind: &KindRef| -> Result<Option<ResolvedKind>, ResolveError> {
        let r = resolve_one(client, kind).await?;
        if r.is_none() {
            missing.push(format!("{}/{}", kind.api_version, kind.kind));
        }
        Ok(r)
    };
    let parent = one(&manifest.parent).await?;
    let mut children = Vec::new();
    for k in &manifest.children {
        children.push(one(k).await?);
    }
    let mut related = Vec::new();
    for r in &manifest.related {
        let k = KindRef {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
        };
        related.push(one(&k).await?.map(|k| (k, r.metadata_only)));
    }
    if !missing.is_empty() {
        return Err(ResolveError::Missing(missing));
    }
    Ok(Kinds {
        parent: parent.expect("no kind missing"),
        children: children
            .into_iter()
            .map(|k| k.expect("no kind missing"))
            .collect(),
        related: related
            .into_iter()
            .map(|k| k.expect("no kind missing"))
            .collect(),
        retired: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(group: &str) -> ResolvedKind {
        ResolvedKind {
            kind: KindRef::new("v1", "X"),
            resource: ApiResource {
                group: group.into(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "X".into(),
                plural: "xs".into(),
            },
            namespaced: true,
        }
    }

    #[test]
    fn built_in_kinds_are_told_from_custom_resources() {
        for group in ["", "apps", "batch", "networking.k8s.io", "k8s.io"] {
            assert!(kind(group).is_builtin(), "{group:?}");
        }
        for group in ["cache.example.com", "test.wasmop.io", "k8s.io.example.com"] {
            assert!(!kind(group).is_builtin(), "{group:?}");
        }
    }

    #[test]
    fn a_union_watches_what_both_versions_need() {
        let (deploy, service, pod) = (kind("apps"), kind(""), kind("x.example.com"));
        let v1 = Kinds {
            parent: kind("cache.example.com"),
            children: vec![deploy.clone()],
            related: vec![(pod.clone(), true)],
            retired: vec![],
        };
        let v2 = Kinds {
            children: vec![deploy.clone(), service.clone()],
            related: vec![(pod.clone(), false)],
            ..v1.clone()
        };
        assert!(!v1.covers(&v2) && v2.covers(&v1));
        let both = v1.union(&v2);
        assert_eq!(both.children, vec![deploy, service]);
        assert_eq!(both.related, vec![(pod, false)]);
        assert!(both.covers(&v1) && both.covers(&v2));
    }
}
