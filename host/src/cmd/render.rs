//! `wasmop render`: runs a plugin offline, through the same sandbox, request assembly
//! ([`crate::gather`]) and output validation ([`wasmop_contract::validate`]) as the controller, and prints
//! what the host would do.
//!
//! Inputs: the plugin module, the parent (one YAML or JSON document), observed objects
//! (multi-document YAML or JSON files, `kind: List` documents expanded; a directory means every
//! `.yaml`, `.yml` and `.json` file in it, sorted by name), optional settings (YAML) and
//! `--finalizing`.
//!
//! Output, a YAML stream on stdout:
//! 1. every desired child after validation, as the host would apply it: with the controller
//!    ownerReference to the parent, the `wasmop.io/managed-by` label and the desired-object
//!    hash the host adds ([`crate::apply::prepare`]);
//! 2. one `kind: Result` document (`apiVersion: render.wasmop.io/v1`) with the `fieldManager`
//!    the host applies as, the `status` it would write (the plugin's, with `observedGeneration`
//!    and the `Ready` condition; `null` for a built-in kind, whose status is its controller's),
//!    the plugin's own `pluginStatus` (`null` when it leaves the status untouched),
//!    `requeueAfterSeconds` when set and, with `--finalizing`, `finalized`;
//! 3. one `kind: Event` document (`apiVersion: render.wasmop.io/v1`) per event, with `type`,
//!    `reason` and `message`.
//!
//! Select the children with `yq 'select(.apiVersion != "render.wasmop.io/v1")'`. Validation
//! warnings go to stderr as `warning: …`; so do the plugin's log lines (filter with `RUST_LOG`,
//! default `wasmop::plugin=info`).
//!
//! Without a cluster render can't ask for scopes: the parent is namespaced (in `default` when
//! its file names no namespace) unless its kind is a well-known cluster-scoped one, and so are
//! children. A parent without `metadata.uid` gets a made-up one derived from its kind and name,
//! and observed children count as controlled when a controller ownerReference names the parent
//! by UID or by kind and name. An observed object of a child kind in the parent's namespace
//! with no controller is taken as the parent's child, as the host would see it after applying
//! it; no input is dropped silently: each observed object the request leaves out gets a
//! `note:` on stderr saying why (`render --help` lists the rules).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use wasmop_contract::validate::{self, Target, Validated};
use wasmop_contract::wire::WireRequest;
use wasmop_contract::{KindRef, Manifest};

use crate::cli::RenderArgs;
use crate::gather::{self, ObjectList};
use crate::kinds::Scope;
use crate::plugin::offline;
use crate::sandbox::{Limits, Plugin};

/// The output format, for `wasmop render --help` (`#[command(after_help = …)]`).
pub const AFTER_HELP: &str = "\
Output: a YAML stream on stdout.
  1. Each desired child after host validation, as the host would apply it: with the
     controller ownerReference to the parent, the wasmop.io/managed-by label and the
     wasmop.io/desired-hash annotation the host adds.
  2. One `apiVersion: render.wasmop.io/v1, kind: Result` document: the `fieldManager` the host
     applies as; the `status` it would write (the plugin's with `observedGeneration` and the
     `Ready` condition; null for a built-in kind); the plugin's own `pluginStatus` (null when it
     leaves the status untouched); `requeueAfterSeconds` when set and, with --finalizing,
     `finalized`.
  3. One `apiVersion: render.wasmop.io/v1, kind: Event` document per event (type, reason,
     message).
Validation warnings and plugin logs (RUST_LOG, default wasmop::plugin=info) go to stderr.
Without a cluster, the parent is namespaced (namespace `default` if its file has none) unless its
kind is a built-in cluster-scoped one; a parent without a uid gets a stable made-up one, and
observed children count as controlled when a controller ownerReference names the parent by uid
or by kind and name. An observed object of a child kind in the parent's namespace with no
controller at all is taken as the parent's child (a `note:` on stderr says so); every observed
object the request leaves out gets a `note:` saying why (another controller, another
namespace, no matching selector, a kind the plugin does not declare).";

/// The API group of render's own output documents.
pub const RENDER_API_VERSION: &str = "render.wasmop.io/v1";

/// Runs `wasmop render`.
pub fn run(args: RenderArgs) -> anyhow::Result<()> {
    init_logging();
    let (_, plugin) = offline::load_file_with(&args.plugin, Limits::from(&args.limits))?;
    let mut parent = read_one(&args.parent)?;
    let observed = read_observed(&args.observed)?;
    let settings = match &args.settings {
        Some(path) => read_one(path)?,
        None => Value::Null,
    };

    let parent_kind = KindRef::of_object(&parent).with_context(|| {
        format!(
            "parent {}: apiVersion and kind are required",
            args.parent.display()
        )
    })?;
    let manifest = plugin.manifest();
    if !parent_kind.same_resource(&manifest.parent) {
        bail!(
            "parent {} is a {parent_kind}, but plugin {} reconciles {}",
            args.parent.display(),
            manifest.name,
            manifest.parent
        );
    }
    let parent_scope = known_scope(&parent_kind).unwrap_or(Scope::Namespaced);
    let parent_name = prepare_parent(&mut parent, parent_scope)
        .with_context(|| format!("parent {}", args.parent.display()))?;
    let mut observed = observed;
    for note in adopt(manifest, &parent, parent_scope, &mut observed) {
        eprintln!("note: {note}");
    }
    let objects = ObjectList::new(observed).with_owner_fallback(parent_kind, &parent_name);

    let (validated, request) = render(
        &plugin,
        &parent,
        parent_scope,
        &objects,
        &settings,
        args.finalizing,
    )?;
    for note in left_out(manifest, &parent, parent_scope, objects.objects(), &request) {
        eprintln!("note: {note}");
    }
    for warning in &validated.warnings {
        eprintln!("warning: {warning}");
    }
    super::print(&to_yaml_stream(
        &plugin,
        &parent,
        &validated,
        args.finalizing,
    )?)?;
    Ok(())
}

/// The part of render shared with tests: related → gather → reconcile → validate; with the
/// request it sent.
fn render(
    plugin: &Plugin,
    parent: &Value,
    parent_scope: Scope,
    observed: &ObjectList,
    settings: &Value,
    finalizing: bool,
) -> anyhow::Result<(Validated, WireRequest)> {
    let manifest = plugin.manifest();
    let selectors = plugin.related_blocking(parent)?;
    let mut request = gather::request(
        manifest,
        parent,
        parent_scope,
        &selectors,
        observed,
        settings,
        finalizing,
    );
    gather::stamp(&mut request, manifest, k8s_openapi::jiff::Timestamp::now());
    let response = plugin.reconcile_blocking(&request)?;
    let target = Target {
        manifest,
        parent,
        scope_of: &known_scope,
        parent_scope,
    };
    Ok((validate::validate(&target, response)?, request))
}

/// Observed objects of a declared child kind, in the parent's namespace, with no controller
/// at all are taken as the parent's children, given the controller reference the host would
/// see once it had applied them; one note each.
fn adopt(manifest: &Manifest, parent: &Value, scope: Scope, observed: &mut [Value]) -> Vec<String> {
    let mut notes = Vec::new();
    let parent_ns = parent
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    for obj in observed.iter_mut() {
        let Some(kind) = KindRef::of_object(obj) else {
            continue;
        };
        let declared = manifest.children.iter().any(|c| c.same_resource(&kind));
        let same_ns = scope == Scope::Cluster
            || obj.pointer("/metadata/namespace").and_then(Value::as_str) == parent_ns;
        let controlled = obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|refs| refs.iter().any(|r| r["controller"] == true));
        if !declared || !same_ns || controlled {
            continue;
        }
        let owner = json!({
            "apiVersion": parent["apiVersion"],
            "kind": parent["kind"],
            "name": parent["metadata"]["name"],
            "uid": parent["metadata"]["uid"],
            "controller": true,
            "blockOwnerDeletion": true,
        });
        let refs = obj["metadata"]
            .as_object_mut()
            .map(|m| m.entry("ownerReferences").or_insert_with(|| json!([])));
        if let Some(Value::Array(refs)) = refs {
            refs.push(owner);
        }
        notes.push(format!(
            "observed {} has no controller ownerReference: taken as a child of {}, as the host sees a child once it applied it",
            describe_object(obj, scope),
            describe_object(parent, scope)
        ));
    }
    notes
}

/// A note for each observed object the request does not hold, saying why.
fn left_out(
    manifest: &Manifest,
    parent: &Value,
    scope: Scope,
    observed: &[Value],
    request: &WireRequest,
) -> Vec<String> {
    let parent_ns = parent
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    let mut notes = Vec::new();
    for obj in observed {
        let Some(kind) = KindRef::of_object(obj) else {
            continue;
        };
        let key = wasmop_contract::wire::object_key(obj, scope);
        let held = |map: &std::collections::BTreeMap<String, wasmop_contract::wire::ByName>| {
            map.get(&kind.key()).is_some_and(|m| m.contains_key(&key))
        };
        if held(&request.children) || held(&request.related) {
            continue;
        }
        let in_ns = scope == Scope::Cluster
            || obj.pointer("/metadata/namespace").and_then(Value::as_str) == parent_ns;
        let why = if manifest.children.iter().any(|c| c.same_resource(&kind)) {
            if in_ns {
                "another object controls it, not the parent".to_owned()
            } else {
                "it is not in the parent's namespace".to_owned()
            }
        } else if manifest.related_kind(&kind).is_some() {
            if in_ns {
                "no selector the plugin's related() returned matches its labels".to_owned()
            } else {
                "it is not in the parent's namespace".to_owned()
            }
        } else {
            format!(
                "{} is neither a child nor a related kind of plugin {}",
                kind, manifest.name
            )
        };
        notes.push(format!(
            "observed {} left out of the request: {why}",
            describe_object(obj, scope)
        ));
    }
    notes
}

/// `Kind namespace/name`, or `Kind name`.
fn describe_object(obj: &Value, scope: Scope) -> String {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if scope == Scope::Namespaced || !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// Gives the parent what the API server would: a namespace and a UID. Returns its name.
fn prepare_parent(parent: &mut Value, scope: Scope) -> anyhow::Result<String> {
    let Some(meta) = parent.get_mut("metadata").and_then(Value::as_object_mut) else {
        bail!("metadata.name is required");
    };
    let name = match meta.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => bail!("metadata.name is required"),
    };
    if scope == Scope::Namespaced
        && meta
            .get("namespace")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        meta.insert("namespace".into(), json!("default"));
    }
    if meta
        .get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        let namespace = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
        meta.insert("uid".into(), json!(made_up_uid(namespace, &name)));
    }
    Ok(name)
}

/// A UUID-shaped, deterministic UID, so render's output is stable from run to run.
fn made_up_uid(namespace: &str, name: &str) -> String {
    let h = Sha256::digest(format!("wasmop-render/{namespace}/{name}"));
    let hex = crate::text::hex(&h[..16]);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Scopes render knows without a cluster: built-in cluster-scoped kinds. Everything else is
/// unknown, which validation treats as namespaced.
fn known_scope(kind: &KindRef) -> Option<Scope> {
    const CLUSTER: &[(&str, &str)] = &[
        ("", "Namespace"),
        ("", "Node"),
        ("", "PersistentVolume"),
        ("rbac.authorization.k8s.io", "ClusterRole"),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
        ("storage.k8s.io", "StorageClass"),
        ("storage.k8s.io", "CSIDriver"),
        ("storage.k8s.io", "VolumeAttachment"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
        (
            "admissionregistration.k8s.io",
            "ValidatingWebhookConfiguration",
        ),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration",
        ),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
        (
            "admissionregistration.k8s.io",
            "ValidatingAdmissionPolicyBinding",
        ),
        ("apiregistration.k8s.io", "APIService"),
        ("scheduling.k8s.io", "PriorityClass"),
        ("networking.k8s.io", "IngressClass"),
        ("node.k8s.io", "RuntimeClass"),
        ("certificates.k8s.io", "CertificateSigningRequest"),
    ];
    CLUSTER
        .iter()
        .any(|(group, k)| kind.group() == *group && kind.kind == *k)
        .then_some(Scope::Cluster)
}

/// Reads a file holding exactly one YAML or JSON document.
fn read_one(path: &Path) -> anyhow::Result<Value> {
    let mut docs = read_documents(path)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        0 => bail!("{}: no YAML document", path.display()),
        n => bail!("{}: {n} YAML documents, expected one", path.display()),
    }
}

/// Reads every object from files and directories (see the module docs).
fn read_observed(paths: &[PathBuf]) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for path in paths {
        let meta =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        let files = if meta.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading directory {}", path.display()))?
                .map(|entry| entry.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .with_context(|| format!("reading directory {}", path.display()))?;
            files.retain(|f| {
                f.is_file()
                    && matches!(
                        f.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
            });
            files.sort();
            files
        } else {
            vec![path.clone()]
        };
        for file in files {
            for doc in read_documents(&file)? {
                expand_list(doc, &mut objects);
            }
        }
    }
    Ok(objects)
}

/// `kind: List` (and `…List` with `items`, as `kubectl get -o yaml` prints) becomes its items.
fn expand_list(doc: Value, out: &mut Vec<Value>) {
    let is_list = doc
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"));
    match doc {
        Value::Object(mut map) if is_list && map.get("items").is_some_and(Value::is_array) => {
            if let Some(Value::Array(items)) = map.remove("items") {
                out.extend(items);
            }
        }
        doc => out.push(doc),
    }
}

/// The non-empty YAML documents of a file, as JSON values.
fn read_documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = Value::deserialize(doc)
            .with_context(|| format!("{}: YAML document {}", path.display(), i + 1))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The YAML stream described in the module docs.
fn to_yaml_stream(
    plugin: &Plugin,
    parent: &Value,
    validated: &Validated,
    finalizing: bool,
) -> anyhow::Result<String> {
    let manifest = plugin.manifest();
    let field_manager = manifest.field_manager();
    let mut out = format!(
        "# wasmop render: plugin {} {} ({})\n\
         # {} child(ren) as the host would apply them, with server-side apply as field manager {field_manager}\n",
        manifest.name,
        manifest.version,
        plugin.digest(),
        validated.children.len()
    );
    let mut push = |doc: &Value| -> anyhow::Result<()> {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(doc)?);
        Ok(())
    };
    let parent_obj = crate::watch::Object::from_value(parent).context("the parent as an object")?;
    let owner = crate::apply::ssa::owner_reference(
        &parent_obj,
        parent["apiVersion"].as_str().unwrap_or_default(),
        parent["kind"].as_str().unwrap_or_default(),
    );
    for child in &validated.children {
        let mut child = child.clone();
        crate::apply::prepare(&mut child, &owner, &manifest.name);
        push(&child)?;
    }
    // What the host writes to the status subresource: the plugin's status with
    // `observedGeneration` and `Ready`; nothing for a built-in kind, whose status is its own
    // controller's. The transition time is now, as the host's would be.
    let builtin =
        KindRef::of_object(parent).is_some_and(|k| crate::kinds::is_builtin_group(k.group()));
    let status = (!builtin).then(|| {
        let ready = crate::status::reconciled(&format!(
            "{} {} ({})",
            manifest.name,
            manifest.version,
            &plugin.digest()[..plugin.digest().len().min(19)]
        ));
        crate::status::desired(
            parent.get("status"),
            validated.status.as_ref(),
            parent
                .pointer("/metadata/generation")
                .and_then(Value::as_i64),
            &ready,
            &crate::status::now(),
        )
    });
    let mut result = json!({
        "apiVersion": RENDER_API_VERSION,
        "kind": "Result",
        "fieldManager": field_manager,
        "status": status,
        "pluginStatus": validated.status,
    });
    if let Some(after) = validated.requeue_after {
        result["requeueAfterSeconds"] = json!(after.as_secs());
    }
    if finalizing {
        result["finalized"] = json!(validated.finalized);
    }
    push(&result)?;
    for event in &validated.events {
        push(&json!({
            "apiVersion": RENDER_API_VERSION,
            "kind": "Event",
            "type": event.type_,
            "reason": event.reason,
            "message": event.message,
        }))?;
    }
    Ok(out)
}

/// Plugin log lines to stderr; a no-op if a subscriber is already installed.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("wasmop::plugin=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_uids_are_stable_and_uuid_shaped() {
        let uid = made_up_uid("default", "mc");
        assert_eq!(uid, made_up_uid("default", "mc"));
        assert_ne!(uid, made_up_uid("other", "mc"));
        assert_eq!(uid.len(), 36);
        assert_eq!(uid.matches('-').count(), 4);
    }

    #[test]
    fn parent_gets_namespace_and_uid() {
        let mut parent = json!({"metadata": {"name": "mc"}});
        assert_eq!(
            prepare_parent(&mut parent, Scope::Namespaced).unwrap(),
            "mc"
        );
        assert_eq!(parent["metadata"]["namespace"], "default");
        assert!(parent["metadata"]["uid"].is_string());
        let mut keep = json!({"metadata": {"name": "mc", "namespace": "x", "uid": "u"}});
        prepare_parent(&mut keep, Scope::Namespaced).unwrap();
        assert_eq!(
            keep["metadata"],
            json!({"name": "mc", "namespace": "x", "uid": "u"})
        );
        assert!(prepare_parent(&mut json!({"metadata": {}}), Scope::Namespaced).is_err());
    }

    #[test]
    fn lists_are_expanded() {
        let mut out = Vec::new();
        expand_list(
            json!({"apiVersion": "v1", "kind": "List", "items": [{"kind": "Pod"}, {"kind": "Pod"}]}),
            &mut out,
        );
        expand_list(json!({"kind": "Pod"}), &mut out);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn scopes() {
        assert_eq!(
            known_scope(&KindRef::new("v1", "Namespace")),
            Some(Scope::Cluster)
        );
        assert_eq!(
            known_scope(&KindRef::new("rbac.authorization.k8s.io/v1", "ClusterRole")),
            Some(Scope::Cluster)
        );
        assert_eq!(known_scope(&KindRef::new("v1", "Pod")), None);
    }
}
