//! `wasmop capture <plugin> --out DIR`: records, from a live cluster, the exact requests the
//! host would send a plugin's live revision for its parents (all, or those named with
//! `--parent`), and that revision's answers, one JSON file per parent, for `wasmop replay`.
//!
//! The requests are assembled by the host's own code ([`crate::gather`]) from objects listed
//! with the caller's credentials, as the host's caches hold them; the module, settings and
//! limits come from the live revision (see [`crate::plugin::revision`]), or from the ConfigMap
//! when it has none. Each file holds the revision's number and digest, the related selectors,
//! the request and the raw response (or the error). `capture.json` holds the scopes of the
//! plugin's kinds, so that replay validates as the host would.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasmop_contract::Scope;
use wasmop_contract::wire::{WireRequest, WireResponse};

use crate::cli::CaptureArgs;
use crate::gather::{self, ObjectList};
use crate::kinds::{Kinds, ResolvedKind};
use crate::plugin::revision::{Phase, Revisions};
use crate::plugin::source;
use crate::sandbox::Limits;

/// The file of a capture that describes it as a whole.
pub const META_FILE: &str = "capture.json";

/// What `capture.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    /// The plugin's ConfigMap.
    pub plugin: String,
    /// The revision that answered (0 when the plugin has none).
    pub revision: i64,
    /// Its module digest.
    pub digest: String,
    /// Its manifest version.
    pub version: String,
    /// `apiVersion Kind` → namespaced, for every kind of its manifest.
    pub namespaced: BTreeMap<String, bool>,
    /// The parents captured, as file names.
    pub parents: Vec<String>,
}

/// One parent's capture.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// `namespace/name`, or `name`.
    pub parent: String,
    /// What `related` returned.
    pub selectors: Value,
    /// The request.
    pub request: WireRequest,
    /// The response, when the plugin answered.
    pub response: Option<WireResponse>,
    /// Why it did not.
    pub error: Option<String>,
}

/// Runs `wasmop capture`.
pub fn run(args: CaptureArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(capture(args))
}

async fn capture(args: CaptureArgs) -> anyhow::Result<()> {
    let client = crate::client::connect().await?;
    let plugin_name = &args.plugin;
    let revisions = Revisions::new(client.clone(), &args.namespace);
    let all = revisions
        .list(plugin_name)
        .await
        .with_context(|| format!("reading the revisions of plugin {plugin_name}"))?;
    let (cm, revision) = match all.iter().rev().find(|r| r.phase == Phase::Live) {
        Some(live) => (revisions.configmap(&live.name).await?, live.number),
        None => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
            let cm = api
                .get(plugin_name)
                .await
                .with_context(|| format!("reading ConfigMap {}/{plugin_name}", args.namespace))?;
            (cm, 0)
        }
    };
    let src = source::read(&cm, &Limits::default())
        .with_context(|| format!("reading plugin {plugin_name}"))?;
    let plugin = crate::plugin::offline::load(&src.key, &src.wasm, src.limits)
        .with_context(|| format!("loading plugin {plugin_name}"))?;
    let manifest = plugin.manifest().clone();
    let kinds = crate::kinds::resolve(&client, &manifest)
        .await
        .with_context(|| format!("resolving the kinds of plugin {}", manifest.name))?;

    let ns = args.watch_namespace.as_deref();
    let mut observed = Vec::new();
    for kind in kinds
        .children
        .iter()
        .chain(kinds.related.iter().map(|(k, _)| k))
    {
        observed.extend(list(&client, kind, ns).await?);
    }
    let parents = list(&client, &kinds.parent, ns).await?;
    let wanted: Vec<&Value> = if args.parents.is_empty() {
        parents.iter().collect()
    } else {
        let mut chosen = Vec::new();
        for p in &args.parents {
            let found = parents.iter().find(|o| label(o) == *p).with_context(|| {
                format!("no {} {p} (name it as namespace/name)", manifest.parent)
            })?;
            chosen.push(found);
        }
        chosen
    };
    if wanted.is_empty() {
        bail!("no {} to capture", manifest.parent);
    }
    let objects = ObjectList::new(observed);
    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let scope = if kinds.parent.namespaced {
        Scope::Namespaced
    } else {
        Scope::Cluster
    };
    let mut files = Vec::new();
    for parent in wanted {
        let deleting = parent.pointer("/metadata/deletionTimestamp").is_some();
        let (selectors, request, answer) = match plugin.related_blocking(parent) {
            Ok(selectors) => {
                let mut request = gather::request(
                    &manifest,
                    parent,
                    scope,
                    &selectors,
                    &objects,
                    &src.settings,
                    deleting,
                );
                gather::stamp(&mut request, &manifest, k8s_openapi::jiff::Timestamp::now());
                let answer = plugin.reconcile_blocking(&request);
                let selectors = serde_json::to_value(&selectors).expect("serialises");
                (selectors, request, answer.map_err(|e| e.to_string()))
            }
            Err(e) => (Value::Null, WireRequest::default(), Err(e.to_string())),
        };
        let record = Record {
            parent: label(parent),
            selectors,
            request,
            error: answer.as_ref().err().cloned(),
            response: answer.ok(),
        };
        let file = format!("{}.json", record.parent.replace('/', "_"));
        write_json(&out.join(&file), &record)?;
        files.push(file);
    }
    let meta = Meta {
        plugin: plugin_name.clone(),
        revision,
        digest: src.digest.clone(),
        version: manifest.version.clone(),
        namespaced: namespaced(&kinds),
        parents: files.clone(),
    };
    write_json(&out.join(META_FILE), &meta)?;
    super::print(&format!(
        "captured {} parents of plugin {plugin_name} (revision {revision}, {} {}) into {}\n",
        files.len(),
        manifest.name,
        manifest.version,
        out.display()
    ))
}

/// `apiVersion Kind` → namespaced, for every kind.
fn namespaced(kinds: &Kinds) -> BTreeMap<String, bool> {
    std::iter::once(&kinds.parent)
        .chain(&kinds.children)
        .chain(kinds.related.iter().map(|(k, _)| k))
        .map(|k| {
            (
                format!("{} {}", k.kind.api_version, k.kind.kind),
                k.namespaced,
            )
        })
        .collect()
}

async fn list(
    client: &Client,
    kind: &ResolvedKind,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<Value>> {
    let api: Api<DynamicObject> = match (kind.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &kind.resource),
        _ => Api::all_with(client.clone(), &kind.resource),
    };
    let list = api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {}", kind.resource.plural))?;
    Ok(list
        .items
        .into_iter()
        .map(|mut o| {
            // A list's items carry no kind; the request's objects do.
            o.types = Some(kube::api::TypeMeta {
                api_version: kind.resource.api_version.clone(),
                kind: kind.resource.kind.clone(),
            });
            o.managed_fields_mut().clear();
            serde_json::to_value(o).expect("serialises")
        })
        .collect())
}

fn label(obj: &Value) -> String {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).expect("serialises");
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}
