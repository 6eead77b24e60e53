//! Checks a plugin's response before anything reaches the API server. The controller and
//! `wasmop render` call the same [`validate`], so what render shows is what the host would apply.
//!
//! A plugin may only shape its own children. Refused (each violation names the child index,
//! kind, name and rule, and all are reported at once):
//! - a child that is not an object, or lacks `apiVersion`, `kind` or a `metadata.name` that is a
//!   DNS-1123 subdomain (`generateName` doesn't work with server-side apply);
//! - a kind the manifest does not declare as a child (exact apiVersion and kind);
//! - a namespace other than the parent's (for a namespaced parent), a namespace on a
//!   cluster-scoped child, a namespaced child of a cluster-scoped parent without a namespace,
//!   and a cluster-scoped child of a namespaced parent (Kubernetes does not allow that owner
//!   reference);
//! - two children with the same group, kind, namespace and name;
//! - any `metadata.ownerReferences` (the host sets owner references itself);
//! - a `metadata.finalizers` entry other than the plugin's own finalizer (`wasmop.io/<name>`):
//!   no controller would ever remove a foreign one, so the child would outlive its prune and
//!   its parent's deletion;
//! - a Secret of type `kubernetes.io/service-account-token`, always (it would mint a token);
//! - `metadata.labels`/`annotations` that are not maps of strings, or that use the host's
//!   `wasmop.io/` keys;
//! - an event without a reason, or a reason longer than 128 characters;
//! - a `status` that is not an object;
//! - more than [`MAX_CHILDREN`] children or [`MAX_EVENTS`] events (the whole response, before
//!   any child is looked at).
//!
//! Fixed up, with a warning:
//! - an empty namespace of a namespaced child of a namespaced parent becomes the parent's;
//! - a child's `status` is removed (status belongs to the child's own controller);
//! - server-set metadata (`managedFields`, `resourceVersion`, `uid`, `creationTimestamp`,
//!   `generation`, `deletionTimestamp`, `deletionGracePeriodSeconds`, `selfLink`) is removed:
//!   plugins often copy observed objects, and these fields would turn an apply into a
//!   precondition or be refused by the server;
//! - event messages past 1024 bytes are cut;
//! - `requeueAfterSeconds: 0` becomes 1 s (0 would be a hot loop).
//!
//! `finalized` is passed through as is: the controller acts on it only while finalizing, so a
//! plugin that always says `true` is harmless.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::names::{is_dns1123_label, is_dns1123_subdomain};
use crate::wire::{WireEvent, WireResponse};
use crate::{KindRef, Manifest, Scope};
use serde_json::{Map, Value};

/// What a response is checked against.
pub struct Target<'a> {
    /// The plugin's manifest.
    pub manifest: &'a Manifest,
    /// The parent object the plugin was called for.
    pub parent: &'a Value,
    /// The scope of a kind; `None` (unknown) is treated as namespaced.
    pub scope_of: &'a dyn Fn(&KindRef) -> Option<Scope>,
    /// The scope of the parent's kind.
    pub parent_scope: Scope,
}

/// A response that passed validation, ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    /// The desired children, namespaces filled in, without owner references (the host adds
    /// them) or server-set fields.
    pub children: Vec<Value>,
    /// The parent's new status; `None` leaves it untouched.
    pub status: Option<Value>,
    /// Events to record on the parent.
    pub events: Vec<WireEvent>,
    /// Reconcile again after this long.
    pub requeue_after: Option<Duration>,
    /// The plugin says cleanup is complete (meaningful only while finalizing).
    pub finalized: bool,
    /// What was fixed up, one sentence each.
    pub warnings: Vec<String>,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What broke it: `child #2 (apps/v1 Deployment web)`, `event #0`, `status`.
    pub subject: String,
    /// The rule.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.rule)
    }
}

/// Every rule a response broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// One per broken rule, in response order.
    pub violations: Vec<Violation>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.violations.len();
        write!(
            f,
            "the plugin's response breaks {n} rule{}: ",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, violation) in self.violations.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{violation}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}

/// Metadata fields only the API server sets.
const SERVER_SET: &[&str] = &[
    "managedFields",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// The most children one response may hold: each is an apply, and a flood of them is refused
/// whole rather than half applied.
pub const MAX_CHILDREN: usize = 500;

/// The most Events one response may ask for.
pub const MAX_EVENTS: usize = 50;

/// The most related selectors `related` may return for one parent.
pub const MAX_SELECTORS: usize = 32;

/// Label and annotation keys only the host sets: a child that carried `wasmop.io/plugin` in the
/// host's namespace would be loaded as a plugin, and `wasmop.io/managed-by` decides what a
/// plugin may prune.
pub const RESERVED_PREFIX: &str = "wasmop.io/";

/// The Secret type the token controller fills with a ServiceAccount's token.
pub const TOKEN_SECRET_TYPE: &str = "kubernetes.io/service-account-token";

/// Longest event reason the API server accepts.
const MAX_REASON: usize = 128;
/// Event messages are cut to this many bytes.
const MAX_MESSAGE: usize = 1024;

/// Checks `resp` against `target`; see the module docs for the rules.
pub fn validate(target: &Target, resp: WireResponse) -> Result<Validated, ValidationError> {
    check_counts(&resp)?;
    let parent_ns = target
        .parent
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|ns| !ns.is_empty());
    let mut violations = Vec::new();
    let mut warnings = Vec::new();
    let mut seen: HashMap<(String, String, String, String), usize> = HashMap::new();
    let mut children = Vec::with_capacity(resp.children.len());
    for (index, mut child) in resp.children.into_iter().enumerate() {
        let mut v = ChildCheck {
            subject: describe(index, &child),
            violations: &mut violations,
            warnings: &mut warnings,
        };
        if let Some(id) = check_child(target, parent_ns, &mut child, &mut v) {
            if let Some(first) = seen.get(&id) {
                v.refuse(format!(
                    "duplicates child #{first} (same group, kind, namespace and name)"
                ));
            } else {
                seen.insert(id, index);
            }
        }
        children.push(child);
    }
    let status = check_status(resp.status, &mut violations);
    let events = check_events(resp.events, &mut violations, &mut warnings);
    let requeue_after = resp.requeue_after_seconds.map(|secs| {
        if secs == 0 {
            warnings.push("requeueAfterSeconds 0 raised to 1".into());
        }
        Duration::from_secs(secs.max(1))
    });

    if !violations.is_empty() {
        return Err(ValidationError { violations });
    }
    Ok(Validated {
        children,
        status,
        events,
        requeue_after,
        finalized: resp.finalized,
        warnings,
    })
}

/// Applies the namespace rules to one child; returns its namespace after defaulting.
fn check_namespace(
    target: &Target,
    kind: &KindRef,
    parent_ns: Option<&str>,
    meta: &mut Map<String, Value>,
    v: &mut ChildCheck,
) -> Option<String> {
    let ns = match meta.get("namespace") {
        None | Some(Value::Null) => None,
        Some(Value::String(ns)) if ns.is_empty() => None,
        Some(Value::String(ns)) => Some(ns.clone()),
        Some(_) => {
            v.refuse("metadata.namespace must be a string");
            return None;
        }
    };
    let child_scope = (target.scope_of)(kind).unwrap_or(Scope::Namespaced);
    match (target.parent_scope, child_scope) {
        (Scope::Namespaced, Scope::Cluster) => {
            v.refuse(format!(
                "{kind} is cluster-scoped and cannot be owned by a namespaced parent"
            ));
            None
        }
        (Scope::Cluster, Scope::Cluster) => {
            if ns.is_some() {
                v.refuse(format!(
                    "{kind} is cluster-scoped: metadata.namespace must be empty"
                ));
            }
            meta.remove("namespace");
            None
        }
        (Scope::Namespaced, Scope::Namespaced) => {
            let parent_ns = parent_ns.unwrap_or_default();
            match ns {
                None => {
                    meta.insert("namespace".into(), Value::String(parent_ns.to_owned()));
                    Some(parent_ns.to_owned())
                }
                Some(ns) if ns == parent_ns => Some(ns),
                Some(ns) => {
                    v.refuse(format!(
                        "namespace {ns:?} is not the parent's ({parent_ns:?}): children live in their parent's namespace"
                    ));
                    Some(ns)
                }
            }
        }
        (Scope::Cluster, Scope::Namespaced) => match ns {
            None => {
                v.refuse("a namespaced child of a cluster-scoped parent needs metadata.namespace");
                None
            }
            Some(ns) if !is_dns1123_label(&ns) => {
                v.refuse(format!("namespace {ns:?} is not a DNS-1123 label"));
                Some(ns)
            }
            Some(ns) => Some(ns),
        },
    }
}

/// Checks one child, fixing what may be fixed; returns its identity (group, kind, namespace,
/// name) for the duplicate check when it has a name.
fn check_child(
    target: &Target,
    parent_ns: Option<&str>,
    child: &mut Value,
    v: &mut ChildCheck,
) -> Option<(String, String, String, String)> {
    let Some(obj) = child.as_object_mut() else {
        v.refuse("a child must be a JSON object");
        return None;
    };
    let string = |field: &str| obj.get(field).and_then(Value::as_str).unwrap_or_default();
    let kind = match (string("apiVersion"), string("kind")) {
        (api_version, kind) if !api_version.is_empty() && !kind.is_empty() => {
            KindRef::new(api_version, kind)
        }
        _ => {
            v.refuse("apiVersion and kind must be non-empty strings");
            return None;
        }
    };
    if target.manifest.child_kind(&kind).is_none() {
        v.refuse(format!(
            "{kind} is not a child kind of plugin {} (declared: {})",
            target.manifest.name,
            list_kinds(&target.manifest.children)
        ));
    }
    // Whatever RBAC allows: the token controller would fill it with a ServiceAccount's token,
    // which the plugin could then read back as an observed child.
    if kind.group().is_empty()
        && kind.kind == "Secret"
        && obj.get("type").and_then(Value::as_str) == Some(TOKEN_SECRET_TYPE)
    {
        v.refuse(format!(
            "a Secret of type {TOKEN_SECRET_TYPE} is never a child: it would hand the plugin a ServiceAccount's token"
        ));
    }
    if obj.contains_key("status") {
        obj.remove("status");
        v.warn("status removed: a child's status belongs to its own controller");
    }
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        v.refuse("metadata must be an object with a name");
        return None;
    };
    let name = check_metadata(meta, v);
    let namespace = check_namespace(target, &kind, parent_ns, meta, v);
    check_finalizers(target.manifest, &kind, namespace.as_deref(), &name, meta, v);
    (!name.is_empty()).then(|| {
        (
            kind.group().to_owned(),
            kind.kind.clone(),
            namespace.unwrap_or_default(),
            name,
        )
    })
}

/// Checks a child's name, owner references, labels and annotations, and strips server-set
/// fields; returns the name (empty when missing).
fn check_metadata(meta: &mut Map<String, Value>, v: &mut ChildCheck) -> String {
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if let Some(other) = meta.get("name").filter(|n| !n.is_string()) {
        v.refuse(format!("metadata.name must be a string, not {other}"));
    } else if name.is_empty() {
        v.refuse("metadata.name is required (generateName does not work with server-side apply)");
    } else if !is_dns1123_subdomain(&name) {
        v.refuse(format!(
            "metadata.name {name:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
        ));
    }
    if let Some(refs) = meta.get("ownerReferences") {
        let empty = refs.is_null() || refs.as_array().is_some_and(Vec::is_empty);
        if empty {
            meta.remove("ownerReferences");
        } else {
            v.refuse(
                "metadata.ownerReferences must be empty: the host sets owner references itself",
            );
        }
    }
    for field in ["labels", "annotations"] {
        if let Some(map) = meta.get(field).filter(|m| !m.is_null()) {
            let strings = map
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string));
            if !strings {
                v.refuse(format!("metadata.{field} must be a map of strings"));
            }
            // The host's own keys: which plugin manages a child, which ConfigMap is a plugin.
            let reserved: Vec<&str> = map
                .as_object()
                .into_iter()
                .flat_map(|m| m.keys())
                .filter(|k| k.starts_with(RESERVED_PREFIX))
                .map(String::as_str)
                .collect();
            if !reserved.is_empty() {
                v.refuse(format!(
                    "metadata.{field} {} are the host's ({RESERVED_PREFIX}* is reserved)",
                    reserved.join(", ")
                ));
            }
        }
    }
    let stripped: Vec<&str> = SERVER_SET
        .iter()
        .copied()
        .filter(|field| meta.remove(*field).is_some())
        .collect();
    if !stripped.is_empty() {
        v.warn(format!(
            "server-set metadata removed: {}",
            stripped.join(", ")
        ));
    }
    name
}

/// A child may carry no finalizer but the plugin's own: nothing would remove another one, so
/// the child would hang in deletion after its prune and its parent's deletion.
fn check_finalizers(
    manifest: &Manifest,
    kind: &KindRef,
    namespace: Option<&str>,
    name: &str,
    meta: &Map<String, Value>,
    v: &mut ChildCheck,
) {
    let Some(finalizers) = meta.get("finalizers").filter(|f| !f.is_null()) else {
        return;
    };
    let Some(finalizers) = finalizers.as_array() else {
        v.refuse("metadata.finalizers must be a list of strings");
        return;
    };
    let own = manifest.finalizer_name();
    let foreign: Vec<String> = finalizers
        .iter()
        .filter(|f| f.as_str() != Some(own.as_str()))
        .map(|f| match f.as_str() {
            Some(text) => format!("{text:?}"),
            None => f.to_string(),
        })
        .collect();
    if !foreign.is_empty() {
        let at = match namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_owned(),
        };
        v.refuse(format!(
            "{kind} {at} carries finalizer {}: a child may carry only its plugin's own ({own}), as nothing would remove another and the child would survive its prune and its parent's deletion",
            foreign.join(", ")
        ));
    }
}

/// A response over the caps is refused before any child is looked at, so the work stays
/// bounded whatever the plugin returns.
fn check_counts(resp: &WireResponse) -> Result<(), ValidationError> {
    let mut violations = Vec::new();
    if resp.children.len() > MAX_CHILDREN {
        violations.push(Violation {
            subject: "children".into(),
            rule: format!(
                "{} children; at most {MAX_CHILDREN} per response",
                resp.children.len()
            ),
        });
    }
    if resp.events.len() > MAX_EVENTS {
        violations.push(Violation {
            subject: "events".into(),
            rule: format!(
                "{} events; at most {MAX_EVENTS} per response",
                resp.events.len()
            ),
        });
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(ValidationError { violations })
    }
}

/// The parent's new status must be an object (or absent).
fn check_status(status: Option<Value>, violations: &mut Vec<Violation>) -> Option<Value> {
    match status {
        Some(Value::Object(status)) => Some(Value::Object(status)),
        None => None,
        Some(other) => {
            violations.push(Violation {
                subject: "status".into(),
                rule: format!("must be an object, not {}", type_name(&other)),
            });
            None
        }
    }
}

/// Events need a reason the API server accepts; long messages are cut.
fn check_events(
    events: Vec<WireEvent>,
    violations: &mut Vec<Violation>,
    warnings: &mut Vec<String>,
) -> Vec<WireEvent> {
    let mut kept = Vec::with_capacity(events.len());
    for (index, mut event) in events.into_iter().enumerate() {
        let subject = format!("event #{index}");
        if event.reason.trim().is_empty() {
            violations.push(Violation {
                subject,
                rule: "reason must not be empty".into(),
            });
            continue;
        }
        if event.reason.len() > MAX_REASON {
            violations.push(Violation {
                subject,
                rule: format!("reason must be at most {MAX_REASON} characters"),
            });
            continue;
        }
        if event.message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !event.message.is_char_boundary(end) {
                end -= 1;
            }
            event.message.truncate(end);
            warnings.push(format!(
                "{subject} ({}): message cut to {MAX_MESSAGE} bytes",
                event.reason
            ));
        }
        kept.push(event);
    }
    kept
}

struct ChildCheck<'a> {
    subject: String,
    violations: &'a mut Vec<Violation>,
    warnings: &'a mut Vec<String>,
}

impl ChildCheck<'_> {
    fn refuse(&mut self, rule: impl Into<String>) {
        self.violations.push(Violation {
            subject: self.subject.clone(),
            rule: rule.into(),
        });
    }

    fn warn(&mut self, what: impl fmt::Display) {
        self.warnings.push(format!("{}: {what}", self.subject));
    }
}

/// `child #2 (apps/v1 Deployment web)`, with whatever of kind and name the child has.
fn describe(index: usize, child: &Value) -> String {
    let field = |ptr: &str| child.pointer(ptr).and_then(Value::as_str).unwrap_or("?");
    format!(
        "child #{index} ({} {} {})",
        field("/apiVersion"),
        field("/kind"),
        field("/metadata/name")
    )
}

fn list_kinds(kinds: &[KindRef]) -> String {
    if kinds.is_empty() {
        return "none".into();
    }
    kinds
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::EventType;
    use serde_json::json;

    use super::*;
    use crate::RelatedKind;

    fn manifest() -> Manifest {
        Manifest {
            name: "demo".into(),
            version: "1".into(),
            parent: KindRef::new("example.com/v1", "Demo"),
            children: vec![
                KindRef::new("apps/v1", "Deployment"),
                KindRef::new("v1", "ConfigMap"),
                KindRef::new("rbac.authorization.k8s.io/v1", "ClusterRole"),
            ],
            related: vec![RelatedKind {
                api_version: "v1".into(),
                kind: "Pod".into(),
                metadata_only: true,
            }],
            finalizer: false,
            clock_seconds: None,
        }
    }

    fn scope(kind: &KindRef) -> Option<Scope> {
        (kind.kind == "ClusterRole").then_some(Scope::Cluster)
    }

    fn run(parent_scope: Scope, resp: WireResponse) -> Result<Validated, ValidationError> {
        let m = manifest();
        let parent = match parent_scope {
            Scope::Namespaced => json!({"metadata": {"name": "p", "namespace": "ns1"}}),
            Scope::Cluster => json!({"metadata": {"name": "p"}}),
        };
        validate(
            &Target {
                manifest: &m,
                parent: &parent,
                scope_of: &scope,
                parent_scope,
            },
            resp,
        )
    }

    fn children(children: Vec<Value>) -> WireResponse {
        WireResponse {
            children,
            ..WireResponse::default()
        }
    }

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    }

    fn rules(err: ValidationError) -> Vec<String> {
        err.violations.iter().map(ToString::to_string).collect()
    }

    fn refused(parent_scope: Scope, resp: WireResponse, needle: &str) {
        let err = run(parent_scope, resp).expect_err("should be refused");
        let text = err.to_string();
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }

    #[test]
    fn a_good_response_passes_and_gets_the_parents_namespace() {
        let v = run(
            Scope::Namespaced,
            WireResponse {
                children: vec![cm("a")],
                status: Some(json!({"nodes": []})),
                requeue_after_seconds: Some(30),
                events: vec![WireEvent {
                    type_: EventType::Normal,
                    reason: "Created".into(),
                    message: "ok".into(),
                }],
                finalized: false,
            },
        )
        .unwrap();
        assert_eq!(v.children[0]["metadata"]["namespace"], "ns1");
        assert_eq!(v.status, Some(json!({"nodes": []})));
        assert_eq!(v.requeue_after, Some(Duration::from_secs(30)));
        assert_eq!(v.events.len(), 1);
        assert!(v.warnings.is_empty());
    }

    #[test]
    fn missing_api_version_kind_or_name() {
        refused(
            Scope::Namespaced,
            children(vec![
                json!({"kind": "ConfigMap", "metadata": {"name": "a"}}),
            ]),
            "child #0 (? ConfigMap a): apiVersion and kind",
        );
        refused(
            Scope::Namespaced,
            children(vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "a-"}}),
            ]),
            "metadata.name is required",
        );
        refused(
            Scope::Namespaced,
            children(vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 5}}),
            ]),
            "metadata.name must be a string, not 5",
        );
        refused(
            Scope::Namespaced,
            children(vec![cm("Not_Valid")]),
            "not a DNS-1123 subdomain",
        );
        refused(
            Scope::Namespaced,
            children(vec![cm(&"a".repeat(254))]),
            "not a DNS-1123 subdomain",
        );
        refused(
            Scope::Namespaced,
            children(vec![json!(3)]),
            "must be a JSON object",
        );
    }

    #[test]
    fn token_secrets_are_refused_even_when_secrets_are_children() {
        let m = Manifest::new("demo", "1")
            .parent_raw("example.com/v1", "Demo")
            .child_raw("v1", "Secret");
        let parent = json!({"metadata": {"name": "p", "namespace": "ns1"}});
        let check = |child: Value| {
            let scope_of = |_: &KindRef| None;
            let target = Target {
                manifest: &m,
                parent: &parent,
                scope_of: &scope_of,
                parent_scope: Scope::Namespaced,
            };
            validate(&target, children(vec![child]))
        };
        let token = json!({"apiVersion": "v1", "kind": "Secret", "type": TOKEN_SECRET_TYPE,
            "metadata": {"name": "t", "annotations": {"kubernetes.io/service-account.name": "admin"}}});
        let err = check(token).unwrap_err().to_string();
        assert!(
            err.contains("child #0 (v1 Secret t): a Secret of type kubernetes.io/service-account-token is never a child"),
            "{err}"
        );
        let opaque = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": "o"}});
        check(opaque).expect("other Secrets stay allowed");
    }

    #[test]
    fn a_flood_is_refused_whole() {
        let many: Vec<Value> = (0..=MAX_CHILDREN).map(|i| cm(&format!("c{i}"))).collect();
        let err = run(Scope::Namespaced, children(many)).unwrap_err();
        assert_eq!(
            err.violations,
            [Violation {
                subject: "children".into(),
                rule: "501 children; at most 500 per response".into(),
            }],
            "one violation, not one per child"
        );
        let events = WireResponse {
            events: (0..=MAX_EVENTS)
                .map(|_| WireEvent {
                    type_: EventType::Normal,
                    reason: "R".into(),
                    message: String::new(),
                })
                .collect(),
            ..WireResponse::default()
        };
        let err = run(Scope::Namespaced, events).unwrap_err().to_string();
        assert!(
            err.contains("events: 51 events; at most 50 per response"),
            "{err}"
        );
        let at_cap: Vec<Value> = (0..MAX_CHILDREN).map(|i| cm(&format!("c{i}"))).collect();
        assert_eq!(
            run(Scope::Namespaced, children(at_cap))
                .unwrap()
                .children
                .len(),
            MAX_CHILDREN
        );
    }

    #[test]
    fn the_hosts_keys_are_reserved() {
        let mut child = cm("a");
        child["metadata"]["labels"] = json!({"wasmop.io/plugin": "", "app": "x"});
        child["metadata"]["annotations"] = json!({"wasmop.io/managed-by": "other"});
        let err = rules(run(Scope::Namespaced, children(vec![child])).unwrap_err());
        assert_eq!(
            err,
            [
                "child #0 (v1 ConfigMap a): metadata.labels wasmop.io/plugin are the host's (wasmop.io/* is reserved)",
                "child #0 (v1 ConfigMap a): metadata.annotations wasmop.io/managed-by are the host's (wasmop.io/* is reserved)",
            ]
        );
    }

    #[test]
    fn undeclared_kind() {
        refused(
            Scope::Namespaced,
            children(vec![
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}),
            ]),
            "child #0 (v1 Secret s): v1 Secret is not a child kind of plugin demo",
        );
        // The exact apiVersion counts: the host watches the declared version.
        refused(
            Scope::Namespaced,
            children(vec![
                json!({"apiVersion": "apps/v1beta1", "kind": "Deployment", "metadata": {"name": "d"}}),
            ]),
            "is not a child kind",
        );
    }

    #[test]
    fn namespaces() {
        let mut other = cm("a");
        other["metadata"]["namespace"] = json!("elsewhere");
        refused(
            Scope::Namespaced,
            children(vec![other]),
            "namespace \"elsewhere\" is not the parent's",
        );

        let mut same = cm("a");
        same["metadata"]["namespace"] = json!("ns1");
        run(Scope::Namespaced, children(vec![same])).unwrap();

        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}});
        refused(
            Scope::Namespaced,
            children(vec![role.clone()]),
            "cannot be owned by a namespaced parent",
        );
        let v = run(Scope::Cluster, children(vec![role.clone()])).unwrap();
        assert!(v.children[0]["metadata"].get("namespace").is_none());

        let mut role_ns = role;
        role_ns["metadata"]["namespace"] = json!("ns1");
        refused(
            Scope::Cluster,
            children(vec![role_ns]),
            "metadata.namespace must be empty",
        );

        refused(
            Scope::Cluster,
            children(vec![cm("a")]),
            "needs metadata.namespace",
        );
        let mut anywhere = cm("a");
        anywhere["metadata"]["namespace"] = json!("team-b");
        run(Scope::Cluster, children(vec![anywhere])).unwrap();
    }

    #[test]
    fn duplicates() {
        let mut explicit = cm("a");
        explicit["metadata"]["namespace"] = json!("ns1");
        refused(
            Scope::Namespaced,
            children(vec![cm("a"), cm("b"), explicit]),
            "child #2 (v1 ConfigMap a): duplicates child #0",
        );
    }

    #[test]
    fn owner_references_are_refused() {
        let mut child = cm("a");
        child["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "1"}]);
        refused(
            Scope::Namespaced,
            children(vec![child]),
            "the host sets owner references itself",
        );
        let mut empty = cm("a");
        empty["metadata"]["ownerReferences"] = json!([]);
        let v = run(Scope::Namespaced, children(vec![empty])).unwrap();
        assert!(v.children[0]["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn only_the_plugins_own_finalizer_is_allowed_on_a_child() {
        let mut foreign = cm("a");
        foreign["metadata"]["finalizers"] = json!(["wasmop.io/demo", "example.com/keep"]);
        let err = run(Scope::Namespaced, children(vec![foreign])).unwrap_err();
        assert_eq!(
            rules(err),
            [
                "child #0 (v1 ConfigMap a): v1 ConfigMap ns1/a carries finalizer \"example.com/keep\": a child may carry only its plugin's own (wasmop.io/demo), as nothing would remove another and the child would survive its prune and its parent's deletion"
            ]
        );
        // Another plugin's finalizer is foreign too, and a cluster-scoped child is named
        // without a namespace.
        let mut role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "r", "finalizers": ["wasmop.io/other"]}});
        refused(
            Scope::Cluster,
            children(vec![role.clone()]),
            "ClusterRole r carries finalizer \"wasmop.io/other\"",
        );
        let mut odd = cm("b");
        odd["metadata"]["finalizers"] = json!("example.com/keep");
        refused(
            Scope::Namespaced,
            children(vec![odd]),
            "child #0 (v1 ConfigMap b): metadata.finalizers must be a list of strings",
        );
        let mut number = cm("c");
        number["metadata"]["finalizers"] = json!([7]);
        refused(
            Scope::Namespaced,
            children(vec![number]),
            "ConfigMap ns1/c carries finalizer 7",
        );

        // The plugin's own, none, an empty list or null pass.
        role["metadata"]["finalizers"] = json!(["wasmop.io/demo"]);
        run(Scope::Cluster, children(vec![role])).expect("its own finalizer");
        let mut own = cm("a");
        own["metadata"]["finalizers"] = json!(["wasmop.io/demo"]);
        let mut empty = cm("b");
        empty["metadata"]["finalizers"] = json!([]);
        let mut null = cm("c");
        null["metadata"]["finalizers"] = Value::Null;
        run(Scope::Namespaced, children(vec![own, empty, null, cm("d")]))
            .expect("no foreign finalizer");
    }

    #[test]
    fn status_and_server_fields_are_stripped_with_warnings() {
        let mut child = cm("a");
        child["status"] = json!({"ready": true});
        child["metadata"]["resourceVersion"] = json!("42");
        child["metadata"]["uid"] = json!("u");
        child["metadata"]["managedFields"] = json!([]);
        child["metadata"]["creationTimestamp"] = json!(null);
        let v = run(Scope::Namespaced, children(vec![child])).unwrap();
        let out = &v.children[0];
        assert!(out.get("status").is_none());
        for field in [
            "resourceVersion",
            "uid",
            "managedFields",
            "creationTimestamp",
        ] {
            assert!(out["metadata"].get(field).is_none(), "{field} kept");
        }
        assert_eq!(v.warnings.len(), 2, "{:?}", v.warnings);
        assert!(v.warnings[0].contains("status removed"));
        assert!(v.warnings[1].contains("resourceVersion, uid, creationTimestamp"));
    }

    #[test]
    fn labels_must_be_strings() {
        let mut child = cm("a");
        child["metadata"]["labels"] = json!({"replicas": 3});
        refused(
            Scope::Namespaced,
            children(vec![child]),
            "metadata.labels must be a map of strings",
        );
    }

    #[test]
    fn events_need_a_reason() {
        let event = |reason: &str, message: String| WireEvent {
            type_: EventType::Warning,
            reason: reason.into(),
            message,
        };
        let resp = WireResponse {
            events: vec![event(" ", "m".into()), event(&"R".repeat(129), "m".into())],
            ..WireResponse::default()
        };
        let err = run(Scope::Namespaced, resp).unwrap_err();
        assert_eq!(
            rules(err),
            [
                "event #0: reason must not be empty",
                "event #1: reason must be at most 128 characters"
            ]
        );
        let v = run(
            Scope::Namespaced,
            WireResponse {
                events: vec![event("Long", "é".repeat(600))],
                ..WireResponse::default()
            },
        )
        .unwrap();
        assert_eq!(v.events[0].message.len(), 1024);
        assert_eq!(v.warnings.len(), 1);
    }

    #[test]
    fn status_must_be_an_object() {
        let resp = WireResponse {
            status: Some(json!("ready")),
            ..WireResponse::default()
        };
        refused(
            Scope::Namespaced,
            resp,
            "status: must be an object, not a string",
        );
    }

    #[test]
    fn every_violation_is_listed() {
        let mut owned = cm("b");
        owned["metadata"]["ownerReferences"] = json!([{"uid": "x"}]);
        let resp = WireResponse {
            children: vec![
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}}),
                owned,
            ],
            status: Some(json!([])),
            ..WireResponse::default()
        };
        let err = run(Scope::Namespaced, resp).unwrap_err();
        assert_eq!(err.violations.len(), 3, "{err}");
        assert!(
            err.to_string()
                .starts_with("the plugin's response breaks 3 rules: child #0")
        );
    }

    #[test]
    fn zero_requeue_and_finalized_pass_through() {
        let v = run(
            Scope::Namespaced,
            WireResponse {
                requeue_after_seconds: Some(0),
                finalized: true,
                ..WireResponse::default()
            },
        )
        .unwrap();
        assert_eq!(v.requeue_after, Some(Duration::from_secs(1)));
        assert!(v.finalized);
    }
}
