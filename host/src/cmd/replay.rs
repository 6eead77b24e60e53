//! `wasmop replay --plugin new.wasm DIR`: runs a build on the requests `wasmop capture`
//! recorded and prints, per parent, how its answer differs from the recorded one; exits
//! non-zero when any does, so it fits a plugin's CI.
//!
//! Both answers go through the host's validation ([`wasmop_contract::validate`], as
//! `wasmop render` and the controller do) with the scopes the capture recorded, and are
//! compared as what the host would do: the children by kind and name, the status, the Events,
//! the requeue and, while finalizing, `finalized`. A build whose `related` asks for other
//! objects than the capture holds is warned about: it is replayed on the recorded ones.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use wasmop_contract::validate::{self, Target};
use wasmop_contract::wire::WireResponse;
use wasmop_contract::{KindRef, Scope};

use super::capture::{META_FILE, Meta, Record};
use crate::apply::preview::{FieldChange, changes};
use crate::cli::ReplayArgs;
use crate::sandbox::{Limits, Plugin};

/// Runs `wasmop replay`; an error when any answer differs.
pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let dir = &args.dir;
    let meta: Meta = read(&dir.join(META_FILE))?;
    let (_, plugin) =
        crate::plugin::offline::load_file_with(&args.plugin, Limits::from(&args.limits))?;
    let scopes = meta.namespaced.clone();
    let manifest = plugin.manifest();
    let mut differ = 0;
    for file in &meta.parents {
        if file.contains('/') || file.starts_with('.') {
            bail!("{META_FILE} names {file:?}: a capture's files are in its own directory");
        }
        let record: Record = read(&dir.join(file))?;
        let kind = KindRef::of_object(&record.request.parent);
        if !kind
            .as_ref()
            .is_some_and(|k| k.same_resource(&manifest.parent))
        {
            bail!(
                "{file}: the capture's parent is a {}, but plugin {} reconciles {}",
                kind.map_or("object without a kind".to_owned(), |k| k.to_string()),
                manifest.name,
                manifest.parent
            );
        }
        let recorded = outcome(
            &plugin,
            &scopes,
            &record,
            record.response.clone(),
            record.error.clone(),
        );
        if let Ok(selectors) = plugin.related_blocking(&record.request.parent)
            && serde_json::to_value(&selectors).expect("serialises") != record.selectors
        {
            eprintln!(
                "warning: {}: this build's related selectors differ from the capture's; replayed on the captured objects",
                record.parent
            );
        }
        let answer = plugin.reconcile_blocking(&record.request);
        let (response, error) = match answer {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let replayed = outcome(&plugin, &scopes, &record, response, error);
        let diff = changes(&recorded, &replayed);
        if diff.is_empty() {
            continue;
        }
        differ += 1;
        super::print(&describe(&record.parent, &diff))?;
    }
    let n = meta.parents.len();
    if differ > 0 {
        bail!(
            "{differ} of {n} parents answered differently from revision {} ({} {})",
            meta.revision,
            meta.version,
            &meta.digest[..meta.digest.len().min(19)]
        );
    }
    super::print(&format!(
        "all {n} parents answered as revision {} ({} {}) did\n",
        meta.revision,
        meta.version,
        &meta.digest[..meta.digest.len().min(19)]
    ))
}

/// What the host would do with an answer, as one JSON value to compare.
fn outcome(
    plugin: &Plugin,
    scopes: &BTreeMap<String, bool>,
    record: &Record,
    response: Option<WireResponse>,
    error: Option<String>,
) -> Value {
    let Some(response) = response else {
        return json!({"error": error.unwrap_or_default()});
    };
    let scope_of = |k: &KindRef| {
        scopes
            .get(&format!("{} {}", k.api_version, k.kind))
            .map(|&namespaced| {
                if namespaced {
                    Scope::Namespaced
                } else {
                    Scope::Cluster
                }
            })
    };
    let parent = &record.request.parent;
    let target = Target {
        manifest: plugin.manifest(),
        parent,
        scope_of: &scope_of,
        parent_scope: Scope::of_object(parent),
    };
    match validate::validate(&target, response) {
        Err(e) => json!({"error": format!("invalid output: {e}")}),
        Ok(v) => {
            let children: serde_json::Map<String, Value> = v
                .children
                .into_iter()
                .map(|c| {
                    let key = format!(
                        "{} {}",
                        c["kind"].as_str().unwrap_or_default(),
                        match c["metadata"]["namespace"].as_str() {
                            Some(ns) => format!(
                                "{ns}/{}",
                                c["metadata"]["name"].as_str().unwrap_or_default()
                            ),
                            None => c["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                        }
                    );
                    (key, c)
                })
                .collect();
            json!({
                "children": children,
                "status": v.status,
                "events": serde_json::to_value(&v.events).expect("serialises"),
                "requeueAfterSeconds": v.requeue_after.map(|d| d.as_secs()),
                "finalized": v.finalized,
            })
        }
    }
}

fn describe(parent: &str, diff: &[FieldChange]) -> String {
    let show = |v: &Option<Value>| v.as_ref().map_or("(none)".to_owned(), Value::to_string);
    let mut out = format!("{parent}:\n");
    for c in diff {
        out.push_str(&format!(
            "  {}: {} → {}\n",
            c.path,
            show(&c.before),
            show(&c.after)
        ));
    }
    out
}

fn read<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}
