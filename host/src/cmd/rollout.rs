//! `wasmop rollout status|history|undo|promote|abort <plugin>`: the revisions of a plugin, as
//! `kubectl rollout` shows a Deployment's.
//!
//! Every verb works on what the cluster holds (the plugin's ControllerRevisions and its
//! ConfigMap), never on the host's memory, so it works after a restart or a failover. `undo`
//! copies an old revision's module, settings and limits back into the ConfigMap, as `kubectl
//! rollout undo` copies a ReplicaSet's template into its Deployment; the host makes a revision
//! that was live before live again at once. `promote` and `abort` annotate the ConfigMap with
//! the candidate's number, which the host acts on.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cli::{RolloutArgs, RolloutVerb};
use crate::plugin::revision::{Phase, Revision, Revisions};
use crate::plugin::rollout::{ABORT_ANNOTATION, PROMOTE_ANNOTATION};
use crate::plugin::source::{
    DEADLINE_ANNOTATION, MEMORY_ANNOTATION, OCI_SUFFIX, RESPONSE_ANNOTATION, RESYNC_ANNOTATION,
    SETTINGS_KEY, is_module_key,
};
use crate::sandbox::Language;

/// Runs `wasmop rollout`.
pub fn run(args: RolloutArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = crate::client::connect().await?;
        let revisions = Revisions::new(client.clone(), &args.namespace);
        let configmaps: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
        let plugin = &args.plugin;
        if plugin.is_empty() {
            bail!("name the plugin's ConfigMap: wasmop rollout <verb> <plugin>");
        }
        let all = revisions
            .list(plugin)
            .await
            .with_context(|| format!("reading the revisions of plugin {plugin}"))?;
        if all.is_empty() {
            bail!(
                "plugin {plugin} has no revisions in namespace {} (is it loaded, and is this the host's namespace?)",
                args.namespace
            );
        }
        match args.verb {
            RolloutVerb::Status => super::print(&status(plugin, &all))?,
            RolloutVerb::Diff => {
                let c = candidate(&all)
                    .with_context(|| format!("no candidate of plugin {plugin} is previewed or rolling out"))?;
                match &c.preview {
                    Some((summary, diff)) => {
                        super::print(&format!("{}: {summary}\n{diff}", describe(c)))?;
                    }
                    None => bail!(
                        "{} has no preview yet (set {}=preview on ConfigMap {plugin} to preview new revisions)",
                        describe(c),
                        crate::plugin::rollout::STRATEGY_ANNOTATION
                    ),
                }
            }
            RolloutVerb::History => super::print(&history(&all))?,
            RolloutVerb::Promote => {
                let target = candidate(&all)
                    .or_else(|| all.iter().rev().find(|r| r.phase == Phase::Aborted))
                    .with_context(|| format!("plugin {plugin} has no candidate or aborted revision to promote"))?;
                annotate(&configmaps, plugin, PROMOTE_ANNOTATION, target.number).await?;
                super::print(&format!(
                    "asked the host to make revision {} ({}) live for every parent\n",
                    target.number, target.version
                ))?;
            }
            RolloutVerb::Abort => {
                let target = candidate(&all)
                    .with_context(|| format!("no canary of plugin {plugin} is running"))?;
                annotate(&configmaps, plugin, ABORT_ANNOTATION, target.number).await?;
                super::print(&format!(
                    "asked the host to abort revision {} ({}); its parents go back to the live revision\n",
                    target.number, target.version
                ))?;
            }
            RolloutVerb::Undo { to_revision } => {
                let target = undo_target(&all, to_revision)?;
                let stored = revisions.configmap(&target.name).await?;
                let mut cm = configmaps
                    .get(plugin)
                    .await
                    .with_context(|| format!("reading ConfigMap {}/{plugin}", args.namespace))?;
                restore(&mut cm, &stored, target.number);
                configmaps
                    .replace(plugin, &PostParams::default(), &cm)
                    .await
                    .with_context(|| {
                        format!(
                            "writing ConfigMap {}/{plugin} (changed meanwhile? run undo again)",
                            args.namespace
                        )
                    })?;
                super::print(&format!(
                    "ConfigMap {plugin} holds revision {} again ({} {}); the host makes it live at once\n",
                    target.number,
                    target.version,
                    short(&target.digest)
                ))?;
            }
        }
        Ok(())
    })
}

fn candidate(all: &[Revision]) -> Option<&Revision> {
    all.iter().rev().find(|r| r.phase == Phase::Candidate)
}

/// The revision `undo` goes back to: `--to-revision`, else the live one while a canary runs,
/// else the one that was live before it.
fn undo_target(all: &[Revision], to: Option<i64>) -> anyhow::Result<&Revision> {
    if let Some(n) = to {
        return all.iter().find(|r| r.number == n).with_context(|| {
            let numbers: Vec<String> = all.iter().map(|r| r.number.to_string()).collect();
            format!("no revision {n}; there are {}", numbers.join(", "))
        });
    }
    if candidate(all).is_some()
        && let Some(live) = all.iter().rev().find(|r| r.phase == Phase::Live)
    {
        return Ok(live);
    }
    all.iter()
        .rev()
        .find(|r| r.phase == Phase::Retired)
        .context("no earlier revision to go back to (see wasmop rollout history)")
}

/// Puts the module, settings and limit annotations of `stored` into `cm`, keeping the rest
/// (its labels, its rollout annotations), and asks for revision `number` to go live at once
/// (an undo is never staged, even to a revision once aborted).
fn restore(cm: &mut ConfigMap, stored: &ConfigMap, number: i64) {
    // The module (or script) and settings are the stored ones, wherever either was kept. A
    // revision holds a script or a registry reference as bytes; it goes back as text, where
    // people read it.
    let mut binary = cm.binary_data.take().unwrap_or_default();
    binary.retain(|k, _| !is_module_key(k));
    let mut data = cm.data.take().unwrap_or_default();
    data.retain(|k, _| !is_module_key(k) && k != SETTINGS_KEY);
    data.extend(stored.data.clone().unwrap_or_default());
    for (key, bytes) in stored.binary_data.clone().unwrap_or_default() {
        let text = Language::of_key(&key).is_some() || key.ends_with(OCI_SUFFIX);
        match (text, String::from_utf8(bytes.0.clone())) {
            (true, Ok(text)) => {
                data.insert(key, text);
            }
            _ => {
                binary.insert(key, bytes);
            }
        }
    }
    cm.binary_data = (!binary.is_empty()).then_some(binary);
    cm.data = (!data.is_empty()).then_some(data);
    let annotations = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for key in [
        DEADLINE_ANNOTATION,
        MEMORY_ANNOTATION,
        RESPONSE_ANNOTATION,
        RESYNC_ANNOTATION,
        PROMOTE_ANNOTATION,
        ABORT_ANNOTATION,
    ] {
        annotations.remove(key);
    }
    if let Some(kept) = &stored.metadata.annotations {
        annotations.extend(kept.clone());
    }
    annotations.insert(PROMOTE_ANNOTATION.to_owned(), number.to_string());
}

async fn annotate(api: &Api<ConfigMap>, plugin: &str, key: &str, n: i64) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {key: n.to_string()}}});
    api.patch(plugin, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating ConfigMap {plugin} with {key}={n}"))?;
    Ok(())
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

fn describe(r: &Revision) -> String {
    format!(
        "revision {} ({} {})",
        r.number,
        if r.version.is_empty() {
            "?"
        } else {
            &r.version
        },
        short(&r.digest)
    )
}

/// What `status` prints.
pub fn status(plugin: &str, all: &[Revision]) -> String {
    let mut out = format!("plugin {plugin}\n");
    match all.iter().rev().find(|r| r.phase == Phase::Live) {
        Some(live) => out.push_str(&format!("  live:      {}\n", describe(live))),
        None => out.push_str("  live:      none\n"),
    }
    match candidate(all) {
        Some(c) if c.step.is_none() => {
            let summary = c.preview.as_ref().map_or("not yet", |(s, _)| s.as_str());
            out.push_str(&format!(
                "  candidate: {}, previewed (nothing written): {summary}\n",
                describe(c)
            ));
        }
        Some(c) => {
            let since = c
                .step_started
                .map(|t| format!(", for {}s", age(t)))
                .unwrap_or_default();
            let of = |n: Option<usize>| n.map_or("?".to_string(), |n| n.to_string());
            out.push_str(&format!(
                "  candidate: {}, step {} of {} at {}% of parents{since}\n",
                describe(c),
                of(c.step.map(|s| s + 1)),
                of(c.steps),
                c.weight.map_or("?".to_string(), |w| w.to_string()),
            ));
        }
        None => out.push_str("  candidate: none\n"),
    }
    if let Some(last) = all.iter().max_by_key(|r| r.number)
        && let Some(note) = &last.note
        && last.phase != Phase::Candidate
    {
        out.push_str(&format!(
            "  revision {} ({}): {note}\n",
            last.number,
            last.phase.as_str()
        ));
    }
    out
}

/// What `history` prints: one line per revision, oldest first.
pub fn history(all: &[Revision]) -> String {
    let mut out = format!(
        "{:<9} {:<10} {:<12} {:<20} {:<6} NOTE\n",
        "REVISION", "PHASE", "VERSION", "DIGEST", "AGE"
    );
    for r in all {
        out.push_str(&format!(
            "{:<9} {:<10} {:<12} {:<20} {:<6} {}\n",
            r.number,
            r.phase.as_str(),
            r.version,
            short(&r.digest),
            r.created
                .map(|t| format!("{}s", age(t)))
                .unwrap_or_default(),
            r.note.as_deref().unwrap_or("")
        ));
    }
    out
}

fn age(t: Timestamp) -> i64 {
    Timestamp::now().duration_since(t).as_secs().max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn rev(number: i64, phase: Phase) -> Revision {
        Revision {
            name: format!("memcached-{number}"),
            number,
            phase,
            version: format!("0.{number}.0"),
            digest: format!("sha256:{number:064}"),
            ..Revision::default()
        }
    }

    #[test]
    fn undo_goes_to_the_previous_live_revision() {
        let all = vec![
            rev(1, Phase::Retired),
            rev(2, Phase::Retired),
            rev(3, Phase::Live),
        ];
        assert_eq!(undo_target(&all, None).unwrap().number, 2);
        assert_eq!(undo_target(&all, Some(1)).unwrap().number, 1);
        assert_eq!(
            undo_target(&all, Some(9)).unwrap_err().to_string(),
            "no revision 9; there are 1, 2, 3"
        );
        let canary = vec![
            rev(1, Phase::Retired),
            rev(2, Phase::Live),
            rev(3, Phase::Candidate),
        ];
        assert_eq!(undo_target(&canary, None).unwrap().number, 2);
        assert!(undo_target(&[rev(1, Phase::Live)], None).is_err());
    }

    #[test]
    fn restore_puts_a_registry_reference_back_as_text() {
        let reference = "oci://reg.example/team/memcached:1@sha256:00";
        let stored = ConfigMap {
            binary_data: Some(BTreeMap::from([(
                "plugin.oci".into(),
                ByteString(reference.as_bytes().to_vec()),
            )])),
            ..Default::default()
        };
        let mut cm = ConfigMap {
            data: Some(BTreeMap::from([("plugin.oci".into(), "oci://x".into())])),
            ..Default::default()
        };
        restore(&mut cm, &stored, 3);
        assert_eq!(cm.binary_data, None);
        assert_eq!(
            cm.data,
            Some(BTreeMap::from([("plugin.oci".into(), reference.into())]))
        );
    }

    #[test]
    fn restore_swaps_a_module_for_a_script_and_back() {
        let module = ConfigMap {
            binary_data: Some(BTreeMap::from([(
                "memcached.wasm.gz".into(),
                ByteString(vec![2]),
            )])),
            ..Default::default()
        };
        // As a revision stores it: the script in binaryData.
        let script = ConfigMap {
            binary_data: Some(BTreeMap::from([(
                "plugin.star".into(),
                ByteString(b"x = 1\n".to_vec()),
            )])),
            data: Some(BTreeMap::from([(SETTINGS_KEY.into(), "a: 1\n".into())])),
            ..Default::default()
        };
        let mut cm = module.clone();
        restore(&mut cm, &script, 2);
        assert_eq!(cm.binary_data, None);
        assert_eq!(
            cm.data,
            Some(BTreeMap::from([
                ("plugin.star".into(), "x = 1\n".into()),
                (SETTINGS_KEY.into(), "a: 1\n".into()),
            ]))
        );
        restore(&mut cm, &module, 1);
        assert_eq!(cm.binary_data, module.binary_data);
        assert_eq!(cm.data, None);
    }

    #[test]
    fn restore_swaps_the_module_and_settings_and_keeps_the_rest() {
        let mut cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                annotations: Some(BTreeMap::from([
                    ("wasmop.io/rollout".into(), "canary".into()),
                    (DEADLINE_ANNOTATION.into(), "50".into()),
                    (PROMOTE_ANNOTATION.into(), "3".into()),
                ])),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(
                "memcached.wasm.gz".into(),
                ByteString(vec![2]),
            )])),
            data: Some(BTreeMap::from([(SETTINGS_KEY.into(), "image: bad".into())])),
            ..Default::default()
        };
        let stored = ConfigMap {
            binary_data: Some(BTreeMap::from([(
                "memcached.wasm".into(),
                ByteString(vec![1]),
            )])),
            ..Default::default()
        };
        restore(&mut cm, &stored, 2);
        assert_eq!(
            cm.binary_data.unwrap().into_keys().collect::<Vec<_>>(),
            ["memcached.wasm"]
        );
        assert_eq!(cm.data, None);
        let ann = cm.metadata.annotations.unwrap();
        assert_eq!(
            ann.get("wasmop.io/rollout").map(String::as_str),
            Some("canary")
        );
        assert!(!ann.contains_key(DEADLINE_ANNOTATION));
        assert_eq!(ann.get(PROMOTE_ANNOTATION).map(String::as_str), Some("2"));
    }

    #[test]
    fn status_names_the_live_and_candidate_revisions() {
        let c = Revision {
            step: Some(0),
            steps: Some(3),
            weight: Some(10),
            ..rev(4, Phase::Candidate)
        };
        let text = status("memcached", &[rev(3, Phase::Live), c]);
        assert!(
            text.contains("live:      revision 3 (0.3.0 sha256:000000000000)"),
            "{text}"
        );
        assert!(
            text.contains(
                "candidate: revision 4 (0.4.0 sha256:000000000000), step 1 of 3 at 10% of parents"
            ),
            "{text}"
        );
        let h = history(&[rev(3, Phase::Live)]);
        assert!(
            h.lines()
                .nth(1)
                .unwrap()
                .starts_with("3         live       0.3.0"),
            "{h}"
        );
    }
}
