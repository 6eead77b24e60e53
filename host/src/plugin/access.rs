//! Whether the host may do everything a plugin needs, asked before the plugin runs.
//!
//! Without this check, a plugin the host's ServiceAccount may not serve loads fine and then
//! fails on every watch and every write, with `Forbidden` errors scattered over the log. So the
//! registry asks the API server first, one SelfSubjectAccessReview per verb and resource, and
//! refuses the plugin with one message that lists every missing permission and says how to
//! grant them.
//!
//! [`needs`] is the single list of what the host does with a plugin's kinds: the check asks
//! for it and `wasmop rbac` prints it, so the granted rules and the checked ones agree.

use futures::stream::{self, StreamExt};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::kinds::{Kinds, ResolvedKind};

/// On the parent kind: watched (`list`, `watch`), read, and patched to add or remove the
/// plugin's finalizer.
pub const PARENT_VERBS: &[&str] = &["get", "list", "watch", "patch"];
/// On the parent's `status` subresource, written with a merge patch.
pub const STATUS_VERBS: &[&str] = &["patch"];
/// On the parent's `finalizers` subresource: a child's owner reference with
/// `blockOwnerDeletion` needs it where the `OwnerReferencesPermissionEnforcement` admission
/// plugin is on (OpenShift, hardened clusters).
pub const FINALIZERS_VERBS: &[&str] = &["update"];
/// On child kinds: watched, server-side applied (`patch`, and `create` as well: an apply that
/// creates the object is authorized as a create), and pruned.
pub const CHILD_VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
/// On related kinds: only watched.
pub const RELATED_VERBS: &[&str] = &["get", "list", "watch"];
/// On `events.k8s.io` Events, in the parents' namespaces: kube's recorder creates an Event and
/// patches it when it repeats.
pub const EVENT_VERBS: &[&str] = &["create", "patch"];

/// The order verbs are listed in, as `kubectl` lists them.
const VERB_ORDER: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// A kind as RBAC names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// API group, empty for the core group.
    pub group: String,
    /// Plural resource name, e.g. `deployments`.
    pub plural: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl From<&ResolvedKind> for Resource {
    fn from(kind: &ResolvedKind) -> Self {
        Resource {
            group: kind.resource.group.clone(),
            plural: kind.resource.plural.clone(),
            namespaced: kind.namespaced,
        }
    }
}

/// Verbs on one resource, or one subresource, of one API group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// API group, empty for the core group.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// `status` or `finalizers`, for the parent.
    pub subresource: Option<String>,
    /// In [`VERB_ORDER`].
    pub verbs: Vec<&'static str>,
    /// Namespaced resources are checked in the watched namespace when the host has one.
    pub namespaced: bool,
}

impl Need {
    /// The resource as an RBAC rule names it: `memcacheds/status`.
    pub fn rbac_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// The resource as `kubectl` names it: `deployments.apps`, `memcacheds.cache.example.com/status`.
    pub fn display(&self) -> String {
        let mut s = self.resource.clone();
        if !self.group.is_empty() {
            s = format!("{s}.{}", self.group);
        }
        if let Some(sub) = &self.subresource {
            s = format!("{s}/{sub}");
        }
        s
    }
}

/// Everything the host needs to run a plugin with these kinds: parent, children, related
/// kinds, and Events on parents. A resource that plays two roles (a child that is also
/// related) appears once with the union of the verbs.
pub fn needs(parent: &Resource, children: &[Resource], related: &[Resource]) -> Vec<Need> {
    let mut all: Vec<Need> = Vec::new();
    let mut add = |r: &Resource, sub: Option<&str>, verbs: &[&'static str]| {
        let found = all.iter_mut().find(|n| {
            n.group == r.group && n.resource == r.plural && n.subresource.as_deref() == sub
        });
        let need = match found {
            Some(n) => n,
            None => {
                all.push(Need {
                    group: r.group.clone(),
                    resource: r.plural.clone(),
                    subresource: sub.map(str::to_string),
                    verbs: Vec::new(),
                    namespaced: r.namespaced,
                });
                all.last_mut().expect("just pushed")
            }
        };
        for verb in verbs {
            if !need.verbs.contains(verb) {
                need.verbs.push(verb);
            }
        }
        need.verbs
            .sort_by_key(|v| VERB_ORDER.iter().position(|o| o == v));
    };
    add(parent, None, PARENT_VERBS);
    add(parent, Some("status"), STATUS_VERBS);
    add(parent, Some("finalizers"), FINALIZERS_VERBS);
    for c in children {
        add(c, None, CHILD_VERBS);
    }
    for r in related {
        add(r, None, RELATED_VERBS);
    }
    let events = Resource {
        group: "events.k8s.io".into(),
        plural: "events".into(),
        namespaced: true,
    };
    add(&events, None, EVENT_VERBS);
    all
}

/// [`needs`] for resolved kinds.
pub fn needs_of(kinds: &Kinds) -> Vec<Need> {
    let children: Vec<Resource> = kinds.children.iter().map(Resource::from).collect();
    let related: Vec<Resource> = kinds.related.iter().map(|(k, _)| k.into()).collect();
    needs(&(&kinds.parent).into(), &children, &related)
}

/// Permissions the host lacks for a plugin, all of them, in one message that says how to grant
/// them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} lacks permissions this plugin needs {}: it may not {}; grant them with \
     `wasmop rbac <plugin.wasm> | kubectl apply -f -`",
    .who.as_deref().map_or("the host".to_string(), |u| format!("the host ({u})")),
    .namespace.as_deref().map_or("in all namespaces".to_string(), |ns| format!("in namespace {ns}")),
    .missing.join("; ")
)]
pub struct Missing {
    /// The user the host authenticates as, when it could be found out.
    pub who: Option<String>,
    /// The one namespace checked, or `None` for all namespaces.
    pub namespace: Option<String>,
    /// `verb, verb resource` per resource.
    pub missing: Vec<String>,
}

/// Asks the API server whether the host may do everything [`needs_of`] lists: cluster-wide, or
/// in `namespace` for namespaced kinds when the host watches only that one
/// (`--watch-namespace`). Every missing permission is in the error.
///
/// A review that cannot be sent is logged and counted as allowed: the check is there to explain
/// failures early, and an API hiccup should not fail a plugin that may well be permitted.
pub async fn check(client: &Client, kinds: &Kinds, namespace: Option<&str>) -> Result<(), Missing> {
    let needs = needs_of(kinds);
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    // Owned futures, a handful at a time: a plugin has a few kinds, so a few round trips.
    let mut asks = Vec::new();
    for (i, need) in needs.iter().enumerate() {
        let ns = namespace.filter(|_| need.namespaced).map(str::to_string);
        for verb in need.verbs.iter().copied() {
            let (api, need, ns) = (api.clone(), need.clone(), ns.clone());
            asks.push(async move { (i, verb, allowed(&api, &need, verb, ns.as_deref()).await) });
        }
    }
    let answers: Vec<(usize, &'static str, bool)> = stream::iter(asks).buffered(8).collect().await;

    let mut missing: Vec<(usize, Vec<&str>)> = Vec::new();
    for (i, verb, ok) in answers {
        if ok {
            continue;
        }
        match missing.iter_mut().find(|(j, _)| *j == i) {
            Some((_, verbs)) => verbs.push(verb),
            None => missing.push((i, vec![verb])),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Missing {
        who: whoami(client).await,
        namespace: namespace.map(str::to_string),
        missing: missing
            .iter()
            .map(|(i, verbs)| format!("{} {}", verbs.join(", "), needs[*i].display()))
            .collect(),
    })
}

/// One SelfSubjectAccessReview; `true` when allowed or when the review itself failed.
async fn allowed(
    api: &Api<SelfSubjectAccessReview>,
    need: &Need,
    verb: &str,
    namespace: Option<&str>,
) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(need.group.clone()),
                resource: Some(need.resource.clone()),
                subresource: need.subresource.clone(),
                verb: Some(verb.to_string()),
                namespace: namespace.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => r.status.is_some_and(|s| s.allowed),
        Err(e) => {
            tracing::warn!(resource = %need.display(), verb, error = %e, "could not check a permission; assuming it is granted");
            true
        }
    }
}

/// The user the host authenticates as, for the message; best effort.
async fn whoami(client: &Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    review.status?.user_info?.username
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_permissions_say_who_where_and_how_to_grant() {
        let m = Missing {
            who: Some("system:serviceaccount:wasmop-system:wasmop".into()),
            namespace: None,
            missing: vec!["create, patch apps/deployments".into(), "list pods".into()],
        };
        assert_eq!(
            m.to_string(),
            "the host (system:serviceaccount:wasmop-system:wasmop) lacks permissions this plugin \
             needs in all namespaces: it may not create, patch apps/deployments; list pods; grant \
             them with `wasmop rbac <plugin.wasm> | kubectl apply -f -`"
        );
        let m = Missing {
            who: None,
            namespace: Some("team-a".into()),
            ..m
        };
        assert!(
            m.to_string()
                .starts_with("the host lacks permissions this plugin needs in namespace team-a:")
        );
    }

    fn res(group: &str, plural: &str) -> Resource {
        Resource {
            group: group.into(),
            plural: plural.into(),
            namespaced: true,
        }
    }

    #[test]
    fn parent_children_related_and_events() {
        let all = needs(
            &res("cache.example.com", "memcacheds"),
            &[res("apps", "deployments")],
            &[res("", "pods")],
        );
        let shown: Vec<String> = all
            .iter()
            .map(|n| format!("{} {}", n.display(), n.verbs.join(",")))
            .collect();
        assert_eq!(
            shown,
            [
                "memcacheds.cache.example.com get,list,watch,patch",
                "memcacheds.cache.example.com/status patch",
                "memcacheds.cache.example.com/finalizers update",
                "deployments.apps get,list,watch,create,patch,delete",
                "pods get,list,watch",
                "events.events.k8s.io create,patch",
            ]
        );
        assert_eq!(all[1].rbac_resource(), "memcacheds/status");
    }

    #[test]
    fn a_kind_in_two_roles_is_listed_once() {
        let all = needs(
            &res("x.io", "things"),
            &[res("", "pods")],
            &[res("", "pods")],
        );
        let pods: Vec<&Need> = all.iter().filter(|n| n.resource == "pods").collect();
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[0].verbs,
            ["get", "list", "watch", "create", "patch", "delete"]
        );
    }
}
