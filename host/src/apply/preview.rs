//! What applying a [`Planned`] would change, without changing it: every child to apply is sent
//! with server-side apply in dry-run mode (`dryRun=All`), so defaulting, admission and
//! conversion are the API server's own, and the answer is compared field by field with the
//! object as it is. Children to prune are reported as deleted; taken names as conflicts.
//!
//! The comparison leaves out what changes on every write and says nothing of intent: the
//! resource version, generation, managed fields, the desired-object hash and the status.

use std::fmt::Write;

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;

use super::Planned;
use super::diff::HASH_ANNOTATION;
use crate::text::api_error;

/// One field that would change: its path, and its value before and after (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    /// `spec.replicas`, `spec.template.spec.containers[0].image`.
    pub path: String,
    /// The value now.
    pub before: Option<Value>,
    /// The value it would have.
    pub after: Option<Value>,
}

/// What would happen to one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// It would be created.
    Created,
    /// These fields would change.
    Changed(Vec<FieldChange>),
    /// It would be deleted (pruned).
    Deleted,
    /// Its name is taken by another object: left alone, and the reconcile would fail.
    Conflict(String),
    /// The API server refused the dry run: the apply would fail.
    Refused(String),
}

/// One child's fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildDiff {
    /// Its kind.
    pub kind: String,
    /// `namespace/name`, or `name`.
    pub name: String,
    /// What would happen.
    pub action: Action,
}

/// What reconciling one parent with a candidate would do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParentPreview {
    /// Its children that would change.
    pub children: Vec<ChildDiff>,
    /// Status fields that would change.
    pub status: Vec<FieldChange>,
    /// Why the reconcile would fail, if it would.
    pub error: Option<String>,
}

impl ParentPreview {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty() && self.status.is_empty() && self.error.is_none()
    }
}

/// Dry-runs `planned` as `field_manager`; returns what would change, children in plan order.
pub async fn preview(
    client: &Client,
    planned: &Planned<'_>,
    field_manager: &str,
) -> Vec<ChildDiff> {
    let mut out = Vec::new();
    let label = |ns: Option<&str>, name: &str| match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    };
    for a in &planned.apply {
        let api: Api<DynamicObject> = a.kind.api(client, a.namespace.as_deref());
        let params = PatchParams::apply(field_manager).force().dry_run();
        let action = match api.patch(&a.name, &params, &Patch::Apply(&a.object)).await {
            Err(e) => Action::Refused(api_error(&e)),
            Ok(after) => match &a.current {
                None => Action::Created,
                Some(before) => {
                    let before = before.value();
                    let after = serde_json::to_value(&after).expect("serialises");
                    let changes = changes(&before, &after);
                    if changes.is_empty() {
                        continue;
                    }
                    Action::Changed(changes)
                }
            },
        };
        out.push(ChildDiff {
            kind: a.kind.kind.kind.clone(),
            name: label(a.namespace.as_deref(), &a.name),
            action,
        });
    }
    for (kind, obj) in &planned.prune {
        out.push(ChildDiff {
            kind: kind.kind.kind.clone(),
            name: label(obj.namespace(), obj.name()),
            action: Action::Deleted,
        });
    }
    for c in &planned.conflicts {
        out.push(ChildDiff {
            kind: c.kind.clone(),
            name: label((!c.namespace.is_empty()).then_some(&c.namespace), &c.name),
            action: Action::Conflict(c.to_string()),
        });
    }
    out
}

/// The fields of `after` that differ from `before`, leaving out bookkeeping (see the module
/// docs). Objects compare key by key; lists of the same length item by item, others whole.
pub fn changes(before: &Value, after: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    walk("", Some(before), Some(after), &mut out);
    out
}

fn ignored(path: &str) -> bool {
    matches!(
        path,
        "metadata.resourceVersion" | "metadata.generation" | "metadata.managedFields" | "status"
    ) || path == format!("metadata.annotations.{HASH_ANNOTATION}")
}

fn walk(path: &str, before: Option<&Value>, after: Option<&Value>, out: &mut Vec<FieldChange>) {
    if ignored(path) || before == after {
        return;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (before, after) {
        (Some(Value::Object(b)), Some(Value::Object(a))) => {
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                walk(&join(k), b.get(k), a.get(k), out);
            }
        }
        (Some(Value::Array(b)), Some(Value::Array(a))) if a.len() == b.len() => {
            for (i, (bv, av)) in b.iter().zip(a).enumerate() {
                walk(&format!("{path}[{i}]"), Some(bv), Some(av), out);
            }
        }
        _ => out.push(FieldChange {
            path: path.to_owned(),
            before: before.cloned(),
            after: after.cloned(),
        }),
    }
}

/// One parent's preview as text: each child's fate, then the status fields that would change.
pub fn describe(
    parent: &str,
    children: &[ChildDiff],
    status: &[FieldChange],
    error: Option<&str>,
) -> String {
    let mut out = format!("{parent}:\n");
    if let Some(e) = error {
        let _ = writeln!(out, "  the reconcile would fail: {e}");
    }
    let show = |v: &Option<Value>| match v {
        Some(v) => v.to_string(),
        None => "(none)".to_owned(),
    };
    for c in children {
        match &c.action {
            Action::Created => {
                let _ = writeln!(out, "  {} {} would be created", c.kind, c.name);
            }
            Action::Deleted => {
                let _ = writeln!(out, "  {} {} would be deleted", c.kind, c.name);
            }
            Action::Conflict(why) | Action::Refused(why) => {
                let _ = writeln!(out, "  {} {} would fail: {why}", c.kind, c.name);
            }
            Action::Changed(fields) => {
                let _ = writeln!(out, "  {} {} would change:", c.kind, c.name);
                for f in fields {
                    let _ = writeln!(
                        out,
                        "    {}: {} → {}",
                        f.path,
                        show(&f.before),
                        show(&f.after)
                    );
                }
            }
        }
    }
    for f in status {
        let _ = writeln!(
            out,
            "  status.{}: {} → {}",
            f.path,
            show(&f.before),
            show(&f.after)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn changes_name_the_fields_and_leave_out_bookkeeping() {
        let before = json!({
            "metadata": {"name": "mc", "resourceVersion": "7", "generation": 2,
                "annotations": {HASH_ANNOTATION: "a"}, "managedFields": [{"manager": "x"}]},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "memcached", "image": "memcached:1.6"}]}}},
            "status": {"replicas": 3},
        });
        let after = json!({
            "metadata": {"name": "mc", "resourceVersion": "8", "generation": 3,
                "annotations": {HASH_ANNOTATION: "b"}, "labels": {"tier": "cache"}},
            "spec": {"replicas": 0, "template": {"spec": {"containers": [
                {"name": "memcached", "image": "memcached:1.7"}]}}},
            "status": {"replicas": 0},
        });
        let paths: Vec<(String, Option<Value>, Option<Value>)> = changes(&before, &after)
            .into_iter()
            .map(|c| (c.path, c.before, c.after))
            .collect();
        assert_eq!(
            paths,
            [
                (
                    "metadata.labels".into(),
                    None,
                    Some(json!({"tier": "cache"}))
                ),
                ("spec.replicas".into(), Some(json!(3)), Some(json!(0))),
                (
                    "spec.template.spec.containers[0].image".into(),
                    Some(json!("memcached:1.6")),
                    Some(json!("memcached:1.7"))
                ),
            ]
        );
        assert!(changes(&before, &before).is_empty());
        // Lists of another length change whole.
        let grown = changes(&json!({"a": [1]}), &json!({"a": [1, 2]}));
        assert_eq!(grown[0].path, "a");
    }

    #[test]
    fn a_parent_reads_as_what_would_happen() {
        let text = describe(
            "Memcached default/mc",
            &[
                ChildDiff {
                    kind: "Deployment".into(),
                    name: "default/mc".into(),
                    action: Action::Changed(vec![FieldChange {
                        path: "spec.replicas".into(),
                        before: Some(json!(3)),
                        after: Some(json!(0)),
                    }]),
                },
                ChildDiff {
                    kind: "Service".into(),
                    name: "default/mc".into(),
                    action: Action::Created,
                },
            ],
            &[FieldChange {
                path: "nodes".into(),
                before: Some(json!(["a"])),
                after: Some(json!([])),
            }],
            None,
        );
        assert_eq!(
            text,
            "Memcached default/mc:\n  Deployment default/mc would change:\n    spec.replicas: 3 → 0\n  Service default/mc would be created\n  status.nodes: [\"a\"] → []\n"
        );
    }
}
