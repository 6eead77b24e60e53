//! Makes the cluster match a plugin's validated output: server-side apply of every desired
//! child, then pruning of controlled children that are no longer desired.
//!
//! Nothing is written for a child that is already as desired (see [`diff`]), so a resync at
//! steady state makes no request at all.

pub mod diff;
pub mod prune;
pub mod ssa;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::kinds::ResolvedKind;

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
#[error("{action} {kind} {namespace}/{name}: {source}")]
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

/// The children of one parent: what the plugin wants and what the caches hold.
pub struct Children<'a> {
    /// The declared child kinds, resolved.
    pub kinds: &'a [ResolvedKind],
    /// Validated desired children (namespace already filled in).
    pub desired: Vec<Value>,
    /// Observed controlled children, per entry of `kinds`.
    pub observed: Vec<Vec<Arc<DynamicObject>>>,
    /// The owner reference every child gets.
    pub owner: OwnerReference,
    /// `wasmop/<plugin>`.
    pub field_manager: &'a str,
}

/// A child's namespace and name.
type ChildKey<'a> = (Option<&'a str>, &'a str);

/// Applies and prunes; keeps going past a failed child and returns every failure.
pub async fn reconcile_children(
    client: &Client,
    children: Children<'_>,
) -> Result<Report, Vec<ChildError>> {
    let mut report = Report::default();
    let mut errors = Vec::new();
    // Indexed, so matching desired to observed stays linear in the number of children.
    let observed: Vec<HashMap<ChildKey, &Arc<DynamicObject>>> = children
        .observed
        .iter()
        .map(|objs| {
            objs.iter()
                .map(|o| {
                    let key = (
                        o.metadata.namespace.as_deref(),
                        o.metadata.name.as_deref().unwrap_or_default(),
                    );
                    (key, o)
                })
                .collect()
        })
        .collect();
    let mut keep = vec![HashSet::<(Option<String>, String)>::new(); children.kinds.len()];

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
        diff::stamp(&mut child);
        ssa::set_owner(&mut child, &children.owner);

        let current = observed[idx]
            .get(&(namespace.as_deref(), name.as_str()))
            .map(|o| serde_json::to_value(o.as_ref()).expect("object serialises"));
        keep[idx].insert((namespace.clone(), name.clone()));
        if current.is_some_and(|c| diff::is_subset(&child, &c)) {
            report.unchanged += 1;
            continue;
        }
        match ssa::apply(
            client,
            kind,
            namespace.as_deref(),
            &name,
            &child,
            children.field_manager,
        )
        .await
        {
            Ok(()) => report.applied += 1,
            Err(source) => errors.push(ChildError {
                action: "apply",
                kind: kind_name,
                namespace: namespace.unwrap_or_default(),
                name,
                source,
            }),
        }
    }

    for (idx, kind) in children.kinds.iter().enumerate() {
        for obj in &children.observed[idx] {
            let key = (
                obj.metadata.namespace.clone(),
                obj.metadata.name.clone().unwrap_or_default(),
            );
            if keep[idx].contains(&key) || obj.metadata.deletion_timestamp.is_some() {
                continue;
            }
            match prune::delete(client, kind, obj).await {
                Ok(()) => report.pruned += 1,
                Err(source) => errors.push(ChildError {
                    action: "prune",
                    kind: kind.kind.kind.clone(),
                    namespace: key.0.unwrap_or_default(),
                    name: key.1,
                    source,
                }),
            }
        }
    }

    if errors.is_empty() {
        Ok(report)
    } else {
        Err(errors)
    }
}
