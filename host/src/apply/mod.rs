//! Makes the cluster match a plugin's validated output: server-side apply of every desired
//! child, then pruning of the plugin's own children that are no longer desired.
//!
//! A plugin's children are the objects its parent controls that carry [`MANAGED_BY_LABEL`]
//! with its name. Nothing else is ever written or deleted: a desired child whose name is taken
//! by any other object is a [`Conflict`], left untouched.
//!
//! Nothing is written for a child that is already as desired (see [`diff`]), so a resync at
//! steady state makes no request at all.

pub mod budget;
pub mod diff;
pub mod preview;
pub mod prune;
pub mod ssa;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use serde_json::Value;

use crate::kinds::ResolvedKind;
use crate::text::api_error;
use crate::watch::{Cache, ObjKey, Object};
use budget::Budget;

/// What one pass over the children did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Children sent with server-side apply.
    pub applied: usize,
    /// Children already as desired.
    pub unchanged: usize,
    /// Children deleted because the plugin no longer wants them.
    pub pruned: usize,
}

/// A child that could not be applied or pruned.
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind} {namespace}/{name}: {}", api_error(.source))]
pub struct ChildError {
    /// `apply` or `prune`.
    pub action: &'static str,
    /// The child's kind.
    pub kind: String,
    /// Its namespace (empty when cluster-scoped).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What the API server said.
    #[source]
    pub source: kube::Error,
}

/// A desired child whose name is taken by an object this plugin did not make for this parent:
/// it is left untouched, never overwritten or adopted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {namespace}/{name} exists and is {holder}; it is left as it is")]
pub struct Conflict {
    /// The child's kind.
    pub kind: String,
    /// Its namespace (empty when cluster-scoped).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Who holds it, as a phrase: `not controlled by this parent`, `managed by plugin x`.
    pub holder: String,
}

/// What kept the children from matching the plugin's answer (the rest was still done).
#[derive(Debug, Default)]
pub struct Failures {
    /// Writes the API server refused.
    pub errors: Vec<ChildError>,
    /// Names already taken.
    pub conflicts: Vec<Conflict>,
    /// Creates held back by the plugin's create budget, and that budget a minute.
    pub held_back: Option<(usize, u32)>,
}

/// The children of one parent: what the plugin wants and what the caches hold.
pub struct Children<'a> {
    /// The declared child kinds, resolved.
    pub kinds: &'a [ResolvedKind],
    /// Validated desired children (namespace already filled in).
    pub desired: Vec<Value>,
    /// Observed controlled children, per entry of `kinds`.
    pub observed: Vec<Vec<Arc<Object>>>,
    /// Every object of each kind, controlled or not, per entry of `kinds`: to tell a free name
    /// from a taken one.
    pub existing: &'a [Arc<Cache>],
    /// The owner reference every child gets.
    pub owner: OwnerReference,
    /// The plugin's name: the value of [`MANAGED_BY_LABEL`] on every child it writes.
    pub plugin: &'a str,
    /// `wasmop/<plugin>`.
    pub field_manager: &'a str,
}

/// The label on every child the host writes for a plugin, naming the plugin. Only children
/// carrying it with the plugin's name are the plugin's to update and prune; other objects the
/// parent controls (a Deployment's ReplicaSets, another plugin's children) are left alone. It
/// is not `wasmop.io/plugin`, which marks plugin ConfigMaps: a child must never become one.
pub const MANAGED_BY_LABEL: &str = "wasmop.io/managed-by";

/// Whether `obj` was written by the host for `plugin`.
pub fn managed_by(obj: &Object, plugin: &str) -> bool {
    obj.labels().get(MANAGED_BY_LABEL) == Some(plugin)
}

/// A child's namespace and name.
type ChildKey<'a> = (Option<&'a str>, &'a str);

/// A child to send with server-side apply, ready to send.
pub struct Apply<'a> {
    /// Its kind.
    pub kind: &'a ResolvedKind,
    /// Its namespace (`None` when cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The object, with its owner reference, label and hash.
    pub object: Value,
    /// The plugin's object of that name, if it exists.
    pub current: Option<Arc<Object>>,
}

/// What making the children match the plugin's answer takes: computed from the caches alone,
/// by [`plan`], then carried out by [`execute`] (or previewed with a dry run by [`preview`]).
#[derive(Default)]
pub struct Planned<'a> {
    /// Children to apply.
    pub apply: Vec<Apply<'a>>,
    /// Children already as desired.
    pub unchanged: usize,
    /// The plugin's children no longer desired, with their kind.
    pub prune: Vec<(&'a ResolvedKind, Arc<Object>)>,
    /// Desired names taken by other objects.
    pub conflicts: Vec<Conflict>,
    /// The plugin's name, as [`MANAGED_BY_LABEL`] carries it.
    pub plugin: &'a str,
}

/// Gives a validated child what the host adds before applying it: the hash of the plugin's
/// object ([`diff::stamp`]), the controller `owner` reference, and [`MANAGED_BY_LABEL`]
/// naming `plugin`. `wasmop render` shows children so prepared.
pub fn prepare(child: &mut Value, owner: &OwnerReference, plugin: &str) {
    diff::stamp(child);
    ssa::set_owner(child, owner);
    child["metadata"]["labels"][MANAGED_BY_LABEL] = Value::from(plugin);
}

/// Decides what to apply and prune, from the caches, writing nothing.
pub fn plan<'a>(children: Children<'a>) -> Planned<'a> {
    let mut planned = Planned {
        plugin: children.plugin,
        ..Planned::default()
    };
    // Indexed, so matching desired to observed stays linear in the number of children. Only
    // this plugin's own children count as observed.
    let ours: Vec<HashMap<ChildKey, &Arc<Object>>> = children
        .observed
        .iter()
        .map(|objs| {
            objs.iter()
                .filter(|o| managed_by(o, children.plugin))
                .map(|o| ((o.namespace(), o.name()), o))
                .collect()
        })
        .collect();
    let mut keep = vec![HashSet::<ObjKey>::new(); children.kinds.len()];

    for mut child in children.desired {
        let api_version = child["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind_name = child["kind"].as_str().unwrap_or_default().to_string();
        let Some(idx) = children
            .kinds
            .iter()
            .position(|k| k.kind.api_version == api_version && k.kind.kind == kind_name)
        else {
            // Validation only lets declared kinds through.
            unreachable!("undeclared child kind {kind_name} passed validation");
        };
        let kind = &children.kinds[idx];
        let name = child["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = child["metadata"]["namespace"].as_str().map(str::to_string);
        keep[idx].insert(ObjKey::new(namespace.as_deref(), &name));
        let current = ours[idx]
            .get(&(namespace.as_deref(), name.as_str()))
            .map(|o| (*o).clone());
        if current.is_none()
            && let Some(taken) = children.existing[idx].get(namespace.as_deref(), &name)
        {
            planned.conflicts.push(Conflict {
                kind: kind_name,
                namespace: namespace.unwrap_or_default(),
                name,
                holder: holder(&taken, &children.owner.uid),
            });
            continue;
        }
        prepare(&mut child, &children.owner, children.plugin);
        let up_to_date = current
            .as_ref()
            .is_some_and(|c| diff::is_subset(&child, &c.value()));
        if up_to_date {
            planned.unchanged += 1;
            continue;
        }
        planned.apply.push(Apply {
            kind,
            namespace,
            name,
            object: child,
            current,
        });
    }

    for (idx, kind) in children.kinds.iter().enumerate() {
        for obj in ours[idx].values() {
            if keep[idx].contains(&obj.key()) || obj.is_deleting() {
                continue;
            }
            planned.prune.push((kind, (*obj).clone()));
        }
    }
    planned
}

/// Applies and prunes what [`plan`] decided; keeps going past a failed child and returns
/// every failure. Each create takes one from `budget`; a create it has none for is held back.
pub async fn execute(
    client: &Client,
    planned: Planned<'_>,
    field_manager: &str,
    budget: &Mutex<Budget>,
) -> Result<Report, Failures> {
    let mut report = Report {
        unchanged: planned.unchanged,
        ..Report::default()
    };
    let mut failures = Failures {
        conflicts: planned.conflicts,
        ..Failures::default()
    };
    let mut held_back = 0;
    let plugin = planned.plugin;
    for a in planned.apply {
        let creating = a.current.is_none();
        if creating && !budget.lock().expect("budget lock").take() {
            held_back += 1;
            continue;
        }
        let send = |create| {
            let ns = a.namespace.as_deref();
            ssa::apply(
                client,
                a.kind,
                ns,
                &a.name,
                &a.object,
                field_manager,
                create,
            )
        };
        let applied = match send(creating).await {
            // The cache said the name was free: something took it since, or it is this
            // plugin's own child whose watch event has not arrived yet.
            Err(kube::Error::Api(e)) if creating && e.code == 409 => {
                match taken_since(client, &a, plugin).await {
                    Ok(None) => send(false).await,
                    Ok(Some(conflict)) => {
                        failures.conflicts.push(conflict);
                        continue;
                    }
                    Err(e) => Err(e),
                }
            }
            r => r,
        };
        match applied {
            Ok(()) => report.applied += 1,
            Err(source) => failures.errors.push(ChildError {
                action: "apply",
                kind: a.kind.kind.kind.clone(),
                namespace: a.namespace.unwrap_or_default(),
                name: a.name,
                source,
            }),
        }
    }
    for (kind, obj) in planned.prune {
        match prune::delete(client, kind, &obj).await {
            Ok(()) => report.pruned += 1,
            Err(source) => failures.errors.push(ChildError {
                action: "prune",
                kind: kind.kind.kind.clone(),
                namespace: obj.namespace().unwrap_or_default().to_owned(),
                name: obj.name().to_owned(),
                source,
            }),
        }
    }
    if held_back > 0 {
        let per_minute = budget.lock().expect("budget lock").per_minute();
        failures.held_back = Some((held_back, per_minute));
    }
    if failures.errors.is_empty() && failures.conflicts.is_empty() && held_back == 0 {
        Ok(report)
    } else {
        Err(failures)
    }
}

/// Applies and prunes; keeps going past a failed child and returns every failure.
pub async fn reconcile_children(
    client: &Client,
    children: Children<'_>,
    budget: &Mutex<Budget>,
) -> Result<Report, Failures> {
    let field_manager = children.field_manager;
    execute(client, plan(children), field_manager, budget).await
}

/// After a create found its name taken: `None` when the object is this plugin's own child of
/// this parent (the cache was behind), else the [`Conflict`] to report.
async fn taken_since(
    client: &Client,
    a: &Apply<'_>,
    plugin: &str,
) -> Result<Option<Conflict>, kube::Error> {
    let api = a.kind.api(client, a.namespace.as_deref());
    let Some(found) = api.get_opt(&a.name).await? else {
        return Ok(None);
    };
    let owner = a.object.pointer("/metadata/ownerReferences/0/uid");
    let controlled = found.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && owner.and_then(serde_json::Value::as_str) == Some(&o.uid)
    });
    let ours = found
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|p| p == plugin);
    if controlled && ours {
        return Ok(None);
    }
    Ok(Some(Conflict {
        kind: a.kind.kind.kind.clone(),
        namespace: a.namespace.clone().unwrap_or_default(),
        name: a.name.clone(),
        holder: "created by someone else after the host last looked".to_string(),
    }))
}

/// Who holds an object whose name a child wants, for the conflict's message.
fn holder(obj: &Object, parent_uid: &str) -> String {
    match obj.controller() {
        Some(o) if o.uid == parent_uid => match obj.labels().get(MANAGED_BY_LABEL) {
            Some(plugin) => format!("managed by plugin {plugin}"),
            None => "controlled by this parent, but not written by this plugin".to_string(),
        },
        Some(o) => format!("controlled by {} {}", o.kind, o.name),
        None => "not controlled by this parent".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(owner: Option<(&str, &str)>, plugin: Option<&str>) -> Object {
        let owners: Vec<Value> = owner
            .map(|(kind, uid)| {
                json!({"apiVersion": "v1", "kind": kind, "name": "cache", "uid": uid, "controller": true})
            })
            .into_iter()
            .collect();
        let labels: serde_json::Map<String, Value> = plugin
            .map(|p| (MANAGED_BY_LABEL.to_string(), json!(p)))
            .into_iter()
            .collect();
        Object::from_value(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "cache", "ownerReferences": owners, "labels": labels},
        }))
        .unwrap()
    }

    #[test]
    fn only_the_plugins_own_children_are_its_to_touch() {
        assert!(managed_by(
            &deployment(Some(("Memcached", "u1")), Some("memcached")),
            "memcached"
        ));
        assert!(!managed_by(
            &deployment(Some(("Memcached", "u1")), Some("rival")),
            "memcached"
        ));
        assert!(!managed_by(
            &deployment(Some(("Memcached", "u1")), None),
            "memcached"
        ));
    }

    #[test]
    fn a_conflict_says_who_holds_the_name() {
        let holder = |d: Object| holder(&d, "u1");
        assert_eq!(
            holder(deployment(None, None)),
            "not controlled by this parent"
        );
        assert_eq!(
            holder(deployment(Some(("Rollout", "u2")), None)),
            "controlled by Rollout cache"
        );
        assert_eq!(
            holder(deployment(Some(("Memcached", "u1")), Some("rival"))),
            "managed by plugin rival"
        );
        assert_eq!(
            holder(deployment(Some(("Memcached", "u1")), None)),
            "controlled by this parent, but not written by this plugin"
        );
    }
}
