//! Whether the host and the plugin's identity may do everything a plugin needs, asked before
//! the plugin runs.
//!
//! Without this check, a plugin loads fine and then fails on every watch and every write, with
//! `Forbidden` errors scattered over the log. So the loader asks the API server first, one
//! SelfSubjectAccessReview per verb and resource — the host's own for what it reads, and one
//! sent as the plugin's [`Identity`] for what it writes — and refuses the plugin with one
//! message that lists every missing permission and says how to grant them. The API server
//! enforces the same rules on every request; the check only explains them early.
//!
//! [`needs`] is the single list of what is done with a plugin's kinds, and by whom: the check
//! asks for it and `wasmop rbac` prints it, so the granted rules and the checked ones agree.

use futures::stream::{self, StreamExt};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::identity::Identity;
use crate::kinds::{Kinds, ResolvedKind};

/// What the host reads with its own identity (the parent, child and related kinds, watched), and
/// what the plugin's identity must be allowed to read for the host to hand it those objects.
pub const READ_VERBS: &[&str] = &["get", "list", "watch"];
/// What the plugin's identity does to the parent: a patch adds or removes its finalizer.
pub const PARENT_VERBS: &[&str] = &["patch"];
/// On the parent's `status` subresource, written with a merge patch.
pub const STATUS_VERBS: &[&str] = &["patch"];
/// On the parent's `finalizers` subresource: a child's owner reference with
/// `blockOwnerDeletion` needs it where the `OwnerReferencesPermissionEnforcement` admission
/// plugin is on (OpenShift, hardened clusters).
pub const FINALIZERS_VERBS: &[&str] = &["update"];
/// On child kinds: server-side applied (`patch`, and `create` as well: an apply that creates
/// the object is authorized as a create), and pruned.
pub const CHILD_VERBS: &[&str] = &["create", "patch", "delete"];
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

    /// A resource as `kubectl` names it: `deployments.apps`, `secrets`.
    pub fn display_of(r: &Resource) -> String {
        Need {
            group: r.group.clone(),
            resource: r.plural.clone(),
            subresource: None,
            verbs: Vec::new(),
            namespaced: r.namespaced,
        }
        .display()
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

/// What a plugin needs, split by who needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// The host reads, with its own identity.
    pub host: Vec<Need>,
    /// The plugin's identity writes.
    pub plugin: Vec<Need>,
}

/// Adds `verbs` on `r` (and `sub`) to `all`, merging with what is there already.
fn add(all: &mut Vec<Need>, r: &Resource, sub: Option<&str>, verbs: &[&'static str]) {
    let found = all.iter().position(|n| {
        n.group == r.group && n.resource == r.plural && n.subresource.as_deref() == sub
    });
    let i = found.unwrap_or_else(|| {
        all.push(Need {
            group: r.group.clone(),
            resource: r.plural.clone(),
            subresource: sub.map(str::to_string),
            verbs: Vec::new(),
            namespaced: r.namespaced,
        });
        all.len() - 1
    });
    let need = &mut all[i];
    for verb in verbs {
        if !need.verbs.contains(verb) {
            need.verbs.push(verb);
        }
    }
    need.verbs
        .sort_by_key(|v| VERB_ORDER.iter().position(|o| o == v));
}

/// Everything needed to run a plugin with these kinds. A resource that plays two roles (a
/// child that is also related) appears once per list with the union of the verbs.
pub fn needs(parent: &Resource, children: &[Resource], related: &[Resource]) -> Needs {
    let mut host = Vec::new();
    for r in std::iter::once(parent).chain(children).chain(related) {
        add(&mut host, r, None, READ_VERBS);
    }
    // The plugin's identity reads the same kinds: the host hands it only what it may read
    // (`reads`), so its account needs the reads as well as the host.
    let mut plugin = host.clone();
    add(&mut plugin, parent, None, PARENT_VERBS);
    add(&mut plugin, parent, Some("status"), STATUS_VERBS);
    add(&mut plugin, parent, Some("finalizers"), FINALIZERS_VERBS);
    for c in children {
        add(&mut plugin, c, None, CHILD_VERBS);
    }
    let events = Resource {
        group: "events.k8s.io".into(),
        plural: "events".into(),
        namespaced: true,
    };
    add(&mut plugin, &events, None, EVENT_VERBS);
    Needs { host, plugin }
}

/// [`needs`] for resolved kinds.
pub fn needs_of(kinds: &Kinds) -> Needs {
    let children: Vec<Resource> = kinds.children.iter().map(Resource::from).collect();
    let related: Vec<Resource> = kinds.related.iter().map(|(k, _)| k.into()).collect();
    needs(&(&kinds.parent).into(), &children, &related)
}

/// Permissions one identity lacks for a plugin, all of them, in one message that says how to
/// grant them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{who} lacks permissions this plugin needs {}: it may not {}; grant them with \
     `wasmop rbac <plugin.wasm> | kubectl apply -f -`",
    .namespace.as_deref().map_or("in all namespaces".to_string(), |ns| format!("in namespace {ns}")),
    .missing.join("; ")
)]
pub struct Missing {
    /// `the host (<user>)` or `the plugin's ServiceAccount <namespace>/<name>`.
    pub who: String,
    /// The one namespace checked, or `None` for all namespaces.
    pub namespace: Option<String>,
    /// `verb, verb resource` per resource.
    pub missing: Vec<String>,
}

/// Why the check did not pass.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Something is not granted.
    #[error(transparent)]
    Missing(Missing),
    /// A review could not be sent; nothing is assumed, the check runs again later.
    #[error("could not check permissions ({need}): {source}")]
    Review {
        /// `verb resource` asked about.
        need: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
}

/// Asks the API server whether the host may read, and `identity` may write, everything
/// [`needs_of`] lists: cluster-wide, or in `namespace` for namespaced kinds when the host
/// watches only that one (`--watch-namespace`). Every missing permission of one identity is in
/// the error.
///
/// Refused outright when the host may not impersonate the identity or read the kinds, or when
/// the identity may not write the parent's status (its parents could not even say what went
/// wrong). Other rights the identity lacks — a child kind, Events — are an admin's choice to
/// make: the plugin runs, and they come back as `Ok(Some(withheld))`, to be reported on the
/// ConfigMap; those writes then fail on the parents with `Forbidden`.
pub async fn check(
    host: &Client,
    identity: &Identity,
    kinds: &Kinds,
    namespace: Option<&str>,
) -> Result<Option<Missing>, AccessError> {
    let who_host = || async {
        match whoami(host).await {
            Some(user) => format!("the host ({user})"),
            None => "the host".to_string(),
        }
    };
    let impersonate = Need {
        group: String::new(),
        resource: "serviceaccounts".into(),
        subresource: None,
        verbs: vec!["impersonate"],
        namespaced: true,
    };
    let granted = allowed(
        host,
        &impersonate,
        "impersonate",
        Some(identity.namespace()),
        Some(identity.service_account()),
    )
    .await?;
    if !granted {
        return Err(AccessError::Missing(Missing {
            who: who_host().await,
            namespace: Some(identity.namespace().to_string()),
            missing: vec![format!(
                "impersonate serviceaccounts/{}",
                identity.service_account()
            )],
        }));
    }
    let needs = needs_of(kinds);
    let missing = missing_of(host, &needs.host, namespace).await?;
    if !missing.is_empty() {
        return Err(AccessError::Missing(Missing {
            who: who_host().await,
            namespace: namespace.map(str::to_string),
            missing: missing.into_iter().map(|(_, m)| m).collect(),
        }));
    }
    let missing = missing_of(identity.client(), &needs.plugin, namespace).await?;
    if missing.is_empty() {
        return Ok(None);
    }
    let blocking = missing
        .iter()
        .any(|(i, _)| needs.plugin[*i].subresource.as_deref() == Some("status"));
    let missing = Missing {
        who: format!(
            "the plugin's ServiceAccount {}/{}",
            identity.namespace(),
            identity.service_account()
        ),
        namespace: namespace.map(str::to_string),
        missing: missing.into_iter().map(|(_, m)| m).collect(),
    };
    if blocking {
        Err(AccessError::Missing(missing))
    } else {
        Ok(Some(missing))
    }
}

/// `verb, verb resource` for every need `client` is not granted, with the need's index.
async fn missing_of(
    client: &Client,
    needs: &[Need],
    namespace: Option<&str>,
) -> Result<Vec<(usize, String)>, AccessError> {
    // Owned futures, a handful at a time: a plugin has a few kinds, so a few round trips.
    let mut asks = Vec::new();
    for (i, need) in needs.iter().enumerate() {
        let ns = namespace.filter(|_| need.namespaced).map(str::to_string);
        for verb in need.verbs.iter().copied() {
            let (client, need, ns) = (client.clone(), need.clone(), ns.clone());
            asks.push(async move {
                let ok = allowed(&client, &need, verb, ns.as_deref(), None).await;
                ok.map(|ok| (i, verb, ok))
            });
        }
    }
    let answers: Vec<Result<(usize, &'static str, bool), AccessError>> =
        stream::iter(asks).buffered(8).collect().await;

    let mut missing: Vec<(usize, Vec<&str>)> = Vec::new();
    for answer in answers {
        let (i, verb, ok) = answer?;
        if ok {
            continue;
        }
        match missing.iter_mut().find(|(j, _)| *j == i) {
            Some((_, verbs)) => verbs.push(verb),
            None => missing.push((i, vec![verb])),
        }
    }
    Ok(missing
        .iter()
        .map(|(i, verbs)| (*i, format!("{} {}", verbs.join(", "), needs[*i].display())))
        .collect())
}

/// One SelfSubjectAccessReview, answered for whoever `client` authenticates as.
pub(crate) async fn allowed(
    client: &Client,
    need: &Need,
    verb: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<bool, AccessError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(need.group.clone()),
                resource: Some(need.resource.clone()),
                subresource: need.subresource.clone(),
                verb: Some(verb.to_string()),
                namespace: namespace.map(str::to_string),
                name: name.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => Ok(r.status.is_some_and(|s| s.allowed)),
        Err(source) => Err(AccessError::Review {
            need: format!("{verb} {}", need.display()),
            source,
        }),
    }
}

/// Whether whoever `client` authenticates as may `verb` the resource `kind` (in `namespace`,
/// or everywhere for `None`).
pub async fn may(
    client: &Client,
    kind: &ResolvedKind,
    verb: &'static str,
    namespace: Option<&str>,
) -> Result<bool, AccessError> {
    let need = Need {
        group: kind.resource.group.clone(),
        resource: kind.resource.plural.clone(),
        subresource: None,
        verbs: vec![verb],
        namespaced: kind.namespaced,
    };
    let namespace = namespace.filter(|_| kind.namespaced);
    allowed(client, &need, verb, namespace, None).await
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
            who: "the host (system:serviceaccount:wasmop-system:wasmop)".into(),
            namespace: None,
            missing: vec!["list, watch deployments.apps".into(), "list pods".into()],
        };
        assert_eq!(
            m.to_string(),
            "the host (system:serviceaccount:wasmop-system:wasmop) lacks permissions this plugin \
             needs in all namespaces: it may not list, watch deployments.apps; list pods; grant \
             them with `wasmop rbac <plugin.wasm> | kubectl apply -f -`"
        );
        let m = Missing {
            who: "the plugin's ServiceAccount wasmop-system/wasmop-plugin-x".into(),
            namespace: Some("team-a".into()),
            ..m
        };
        assert!(m.to_string().starts_with(
            "the plugin's ServiceAccount wasmop-system/wasmop-plugin-x lacks permissions this \
             plugin needs in namespace team-a:"
        ));
    }

    fn res(group: &str, plural: &str) -> Resource {
        Resource {
            group: group.into(),
            plural: plural.into(),
            namespaced: true,
        }
    }

    fn shown(needs: &[Need]) -> Vec<String> {
        needs
            .iter()
            .map(|n| format!("{} {}", n.display(), n.verbs.join(",")))
            .collect()
    }

    #[test]
    fn the_host_and_the_plugin_read_and_the_plugin_writes() {
        let all = needs(
            &res("cache.example.com", "memcacheds"),
            &[res("apps", "deployments")],
            &[res("", "pods")],
        );
        assert_eq!(
            shown(&all.host),
            [
                "memcacheds.cache.example.com get,list,watch",
                "deployments.apps get,list,watch",
                "pods get,list,watch",
            ]
        );
        assert_eq!(
            shown(&all.plugin),
            [
                "memcacheds.cache.example.com get,list,watch,patch",
                "deployments.apps get,list,watch,create,patch,delete",
                "pods get,list,watch",
                "memcacheds.cache.example.com/status patch",
                "memcacheds.cache.example.com/finalizers update",
                "events.events.k8s.io create,patch",
            ]
        );
        assert_eq!(all.plugin[3].rbac_resource(), "memcacheds/status");
    }

    #[test]
    fn a_kind_in_two_roles_is_listed_once() {
        let all = needs(
            &res("x.io", "things"),
            &[res("", "pods")],
            &[res("", "pods")],
        );
        let pods: Vec<&Need> = all.host.iter().filter(|n| n.resource == "pods").collect();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].verbs, ["get", "list", "watch"]);
    }
}
