//! Every version a plugin ConfigMap has held that loaded, kept in the cluster as an
//! `apps/v1 ControllerRevision` in the host's namespace, so history, rollback and a rollout in
//! progress survive host restarts, failover and an overwritten ConfigMap.
//!
//! A revision is named `<configmap>-<hash of its parts>` and holds those parts (module,
//! settings, limit annotations: [`super::source::Parts`]) as a ConfigMap in `data`, which the API server keeps
//! immutable. Its `revision` number orders the history: a new version gets the next number, and
//! so does an old one made live again, as a Deployment's `kubectl rollout undo` does. Labels
//! carry what `kubectl get controllerrevisions -l wasmop.io/revision-of=<configmap>
//! -L wasmop.io/phase,wasmop.io/version,wasmop.io/module,wasmop.io/canary-weight` shows: which revision is
//! live, which is a candidate and at what weight, which were retired or aborted.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Label: the plugin ConfigMap a revision belongs to.
pub const REVISION_OF_LABEL: &str = "wasmop.io/revision-of";
/// Label: the revision's [`Phase`].
pub const PHASE_LABEL: &str = "wasmop.io/phase";
/// Label: the manifest version (made a valid label value).
pub const VERSION_LABEL: &str = "wasmop.io/version";
/// Label: the first 12 hex digits of the module's digest, for `kubectl get -L`.
pub const DIGEST_LABEL: &str = "wasmop.io/module";
/// Label: the share of parents a candidate serves, in percent.
pub const WEIGHT_LABEL: &str = "wasmop.io/canary-weight";
/// Annotation: the module's digest.
pub const DIGEST_ANNOTATION: &str = "wasmop.io/digest";
/// Annotation: the canary step a candidate is at, `2/3`.
pub const STEP_ANNOTATION: &str = "wasmop.io/canary-step";
/// Annotation: when that step started (RFC 3339).
pub const STEP_STARTED_ANNOTATION: &str = "wasmop.io/canary-step-started";
/// Annotation: why a revision was aborted, or how it became live.
pub const NOTE_ANNOTATION: &str = "wasmop.io/note";
/// Annotation: a previewed candidate's summary (what would change over how many parents).
pub const PREVIEW_ANNOTATION: &str = "wasmop.io/preview";
/// Annotation: a previewed candidate's diff, parent by parent (cut at [`MAX_PREVIEW_DIFF`]).
pub const PREVIEW_DIFF_ANNOTATION: &str = "wasmop.io/preview-diff";
/// Bytes of diff kept on a revision: an object's annotations may hold 256 KiB in all.
pub const MAX_PREVIEW_DIFF: usize = 192 << 10;
/// Annotation prefix: `wasmop.io/canary-shard-<i>` holds what shard `i`'s parents showed of a
/// canary on a sharded host (a [`crate::plugin::rollout::Report`] as JSON), written by the
/// replica holding it.
pub const SHARD_REPORT_PREFIX: &str = "wasmop.io/canary-shard-";
/// Annotation prefix: `wasmop.io/preview-shard-<i>` holds what a preview would change over
/// shard `i`'s parents on a sharded host (a [`crate::plugin::rollout::PreviewReport`] as
/// JSON, without its diffs), written by the replica holding it.
pub const SHARD_PREVIEW_PREFIX: &str = "wasmop.io/preview-shard-";
/// Annotation prefix: `wasmop.io/preview-diff-<i>` holds shard `i`'s diffs, cut at
/// [`MAX_PREVIEW_DIFF`] divided by the shards. A revision's diff is these in shard order when
/// it has no [`PREVIEW_DIFF_ANNOTATION`].
pub const SHARD_DIFF_PREFIX: &str = "wasmop.io/preview-diff-";

/// Where a revision stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Recorded, not yet run.
    #[default]
    New,
    /// Reconciles every parent (but a canary's).
    Live,
    /// Rolling out as a canary.
    Candidate,
    /// Was live; replaced since. Going back to it is immediate.
    Retired,
    /// Its canary failed or was aborted; it runs again only when promoted.
    Aborted,
}

impl Phase {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::New => "new",
            Phase::Live => "live",
            Phase::Candidate => "candidate",
            Phase::Retired => "retired",
            Phase::Aborted => "aborted",
        }
    }

    fn parse(s: &str) -> Phase {
        match s {
            "live" => Phase::Live,
            "candidate" => Phase::Candidate,
            "retired" => Phase::Retired,
            "aborted" => Phase::Aborted,
            _ => Phase::New,
        }
    }
}

/// One revision, as read from its ControllerRevision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revision {
    /// The ControllerRevision's name.
    pub name: String,
    /// Its number.
    pub number: i64,
    /// Its phase.
    pub phase: Phase,
    /// The manifest version.
    pub version: String,
    /// The module digest.
    pub digest: String,
    /// A candidate's step (0-based), of how many, and its weight in percent.
    pub step: Option<usize>,
    /// How many steps its canary has.
    pub steps: Option<usize>,
    /// The share of parents it serves.
    pub weight: Option<u8>,
    /// When that step started.
    pub step_started: Option<Timestamp>,
    /// The note.
    pub note: Option<String>,
    /// When the revision was recorded.
    pub created: Option<Timestamp>,
    /// A previewed candidate's summary and diff.
    pub preview: Option<(String, String)>,
    /// A sharded host's canary reports, by shard index, as written (JSON).
    pub shard_reports: BTreeMap<u32, String>,
    /// A sharded host's preview reports, by shard index, as written (JSON).
    pub shard_previews: BTreeMap<u32, String>,
}

impl Revision {
    fn from_object(cr: &ControllerRevision) -> Revision {
        let labels = cr.labels();
        let annotations = cr.annotations();
        let (step, steps) = annotations
            .get(STEP_ANNOTATION)
            .and_then(|s| s.split_once('/'))
            .map(|(a, b)| {
                (
                    a.parse::<usize>().ok().and_then(|n| n.checked_sub(1)),
                    b.parse().ok(),
                )
            })
            .unwrap_or_default();
        Revision {
            name: cr.name_any(),
            number: cr.revision.unwrap_or_default(),
            phase: labels
                .get(PHASE_LABEL)
                .map(|p| Phase::parse(p))
                .unwrap_or_default(),
            version: labels.get(VERSION_LABEL).cloned().unwrap_or_default(),
            digest: annotations
                .get(DIGEST_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            step,
            steps,
            weight: labels.get(WEIGHT_LABEL).and_then(|w| w.parse().ok()),
            step_started: annotations
                .get(STEP_STARTED_ANNOTATION)
                .and_then(|t| t.parse().ok()),
            note: annotations.get(NOTE_ANNOTATION).cloned(),
            created: cr.metadata.creation_timestamp.as_ref().map(|t| t.0),
            preview: annotations.get(PREVIEW_ANNOTATION).map(|summary| {
                let diff = match annotations.get(PREVIEW_DIFF_ANNOTATION) {
                    Some(diff) => diff.clone(),
                    None => by_shard(annotations, SHARD_DIFF_PREFIX)
                        .into_values()
                        .collect(),
                };
                (summary.clone(), diff)
            }),
            shard_reports: by_shard(annotations, SHARD_REPORT_PREFIX),
            shard_previews: by_shard(annotations, SHARD_PREVIEW_PREFIX),
        }
    }
}

/// The annotations named `<prefix><shard index>`, by index.
fn by_shard(annotations: &BTreeMap<String, String>, prefix: &str) -> BTreeMap<u32, String> {
    annotations
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.parse().ok()?, v.clone())))
        .collect()
}

/// A change to a revision's phase and what goes with it.
#[derive(Debug, Clone, Default)]
pub struct Mark {
    /// The new phase.
    pub phase: Option<Phase>,
    /// A new number (a retired revision made live again).
    pub number: Option<i64>,
    /// The canary step (0-based) of `steps` total at `weight`, started at this time; `None`
    /// clears them.
    pub step: Option<(usize, usize, u8, Timestamp)>,
    /// A note; an empty one clears it.
    pub note: Option<String>,
}

impl Mark {
    /// A move to `phase` that clears any canary step, with `note` (`Some("")` clears it).
    pub fn to(phase: Phase, note: Option<String>) -> Mark {
        Mark {
            phase: Some(phase),
            note,
            ..Mark::default()
        }
    }
}

/// Why revisions could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    /// The API server refused or failed.
    #[error("revision {name}: {}", crate::text::api_error(.source))]
    Api {
        /// The revision (or the plugin, for a list).
        name: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
    /// A revision's data is not a plugin ConfigMap.
    #[error("revision {name} does not hold a plugin: {reason}")]
    Corrupt {
        /// The revision.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// An API failure on the revision `name` (or list of one plugin's).
fn api_error(name: impl Into<String>) -> impl FnOnce(kube::Error) -> RevisionError {
    let name = name.into();
    move |source| RevisionError::Api { name, source }
}

/// The revisions of the plugins of one namespace.
#[derive(Clone)]
pub struct Revisions {
    api: Api<ControllerRevision>,
}

impl Revisions {
    /// The revisions in `namespace`, read and written with `client`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Revisions {
            api: Api::namespaced(client, namespace),
        }
    }

    /// Every revision of `configmap`, oldest number first.
    pub async fn list(&self, configmap: &str) -> Result<Vec<Revision>, RevisionError> {
        let lp = ListParams::default().labels(&format!("{REVISION_OF_LABEL}={configmap}"));
        let list = self
            .api
            .list(&lp)
            .await
            .map_err(api_error(format!("list of {configmap}")))?;
        // Only the host names revisions; one labelled for this plugin under another name is
        // not one of its own.
        let prefix = format!("{configmap}-");
        let mut all: Vec<Revision> = list
            .items
            .iter()
            .filter(|cr| cr.name_any().starts_with(&prefix))
            .map(Revision::from_object)
            .collect();
        all.sort_by_key(|r| r.number);
        Ok(all)
    }

    /// The revision named by `hash` (of the parts of a plugin ConfigMap that make a version),
    /// recorded now with `stored` (those parts, as a ConfigMap) and the next number if it is
    /// new; and every revision of `configmap`, it included.
    pub async fn record(
        &self,
        configmap: &str,
        (hash, stored): (&str, &ConfigMap),
        version: &str,
        digest: &str,
    ) -> Result<(Revision, Vec<Revision>), RevisionError> {
        let name = format!("{configmap}-{hash}");
        let mut all = self.list(configmap).await?;
        if let Some(found) = all.iter().find(|r| r.name == name) {
            if found.digest != digest {
                return Err(RevisionError::Corrupt {
                    name,
                    reason: format!(
                        "it names module {}, not the one loaded ({digest})",
                        found.digest
                    ),
                });
            }
            return Ok((found.clone(), all));
        }
        let number = all.last().map_or(1, |r| r.number.saturating_add(1));
        let data = serde_json::to_value(stored).expect("serialises");
        let cr = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    (REVISION_OF_LABEL.to_owned(), configmap.to_owned()),
                    (PHASE_LABEL.to_owned(), Phase::New.as_str().to_owned()),
                    (VERSION_LABEL.to_owned(), label_value(version)),
                    (DIGEST_LABEL.to_owned(), short_digest(digest)),
                ])),
                annotations: Some(BTreeMap::from([(
                    DIGEST_ANNOTATION.to_owned(),
                    digest.to_owned(),
                )])),
                ..Default::default()
            },
            data: RawExtension(data),
            revision: Some(number),
        };
        let created = match self.api.create(&PostParams::default(), &cr).await {
            Ok(created) => created,
            // Another replica recorded the same version first (sharded hosts all load it).
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let all = self.list(configmap).await?;
                if let Some(found) = all.iter().find(|r| r.name == name) {
                    return Ok((found.clone(), all));
                }
                return Err(api_error(name)(kube::Error::Api(s)));
            }
            Err(e) => return Err(api_error(name)(e)),
        };
        let revision = Revision::from_object(&created);
        all.push(revision.clone());
        Ok((revision, all))
    }

    /// Changes a revision's phase, number, step or note.
    pub async fn mark(&self, name: &str, mark: Mark) -> Result<(), RevisionError> {
        let mut labels = serde_json::Map::new();
        let mut annotations = serde_json::Map::new();
        if let Some(phase) = mark.phase {
            labels.insert(PHASE_LABEL.into(), phase.as_str().into());
        }
        match mark.step {
            Some((step, steps, weight, started)) => {
                labels.insert(WEIGHT_LABEL.into(), weight.to_string().into());
                annotations.insert(
                    STEP_ANNOTATION.into(),
                    format!("{}/{steps}", step + 1).into(),
                );
                annotations.insert(STEP_STARTED_ANNOTATION.into(), started.to_string().into());
            }
            None => {
                labels.insert(WEIGHT_LABEL.into(), Value::Null);
                annotations.insert(STEP_ANNOTATION.into(), Value::Null);
                annotations.insert(STEP_STARTED_ANNOTATION.into(), Value::Null);
            }
        }
        // A diff is kept only while it is being looked at; the summary stays with the history.
        if matches!(
            mark.phase,
            Some(Phase::Live | Phase::Retired | Phase::Aborted)
        ) {
            annotations.insert(PREVIEW_DIFF_ANNOTATION.into(), Value::Null);
        }
        if let Some(note) = mark.note {
            let note = crate::text::truncate(note, 1024);
            annotations.insert(
                NOTE_ANNOTATION.into(),
                if note.is_empty() {
                    Value::Null
                } else {
                    note.into()
                },
            );
        }
        let mut patch = json!({"metadata": {"labels": labels, "annotations": annotations}});
        if let Some(n) = mark.number {
            patch["revision"] = n.into();
        }
        self.api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(api_error(name.to_owned()))
    }

    /// Writes what shard `shard`'s parents showed of the candidate `name` (`report`, JSON),
    /// leaving the other shards' reports as they are.
    pub async fn publish_shard_report(
        &self,
        name: &str,
        shard: u32,
        report: &str,
    ) -> Result<(), RevisionError> {
        self.annotate(
            name,
            json!({ format!("{SHARD_REPORT_PREFIX}{shard}"): report }),
        )
        .await
    }

    /// Writes what a preview would change over shard `shard`'s parents on the candidate
    /// `name`: `report` (JSON counts) and `diff`, leaving the other shards' as they are.
    pub async fn publish_shard_preview(
        &self,
        name: &str,
        shard: u32,
        report: &str,
        diff: &str,
    ) -> Result<(), RevisionError> {
        let annotations = json!({
            format!("{SHARD_PREVIEW_PREFIX}{shard}"): report,
            format!("{SHARD_DIFF_PREFIX}{shard}"): diff,
        });
        self.annotate(name, annotations).await
    }

    /// Records a previewed candidate's summary and diff on its revision; with no diff, the
    /// shards' diffs are the revision's.
    pub async fn publish_preview(
        &self,
        name: &str,
        summary: &str,
        diff: Option<&str>,
    ) -> Result<(), RevisionError> {
        let annotations = json!({
            PREVIEW_ANNOTATION: summary,
            PREVIEW_DIFF_ANNOTATION: diff,
        });
        self.annotate(name, annotations).await
    }

    /// Merges `annotations` into revision `name`'s (a null removes one).
    async fn annotate(&self, name: &str, annotations: Value) -> Result<(), RevisionError> {
        let patch = json!({ "metadata": { "annotations": annotations } });
        self.api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(api_error(name.to_owned()))
    }

    /// The plugin ConfigMap revision `name` holds.
    pub async fn configmap(&self, name: &str) -> Result<ConfigMap, RevisionError> {
        let cr = self
            .api
            .get(name)
            .await
            .map_err(api_error(name.to_owned()))?;
        let data = cr.data.0;
        serde_json::from_value(data).map_err(|e| RevisionError::Corrupt {
            name: name.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Deletes the oldest revisions past `limit`, never one that is live or a candidate.
    pub async fn prune(&self, all: &[Revision], limit: usize) -> Result<(), RevisionError> {
        for r in doomed(all, limit) {
            match self.api.delete(&r.name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => return Err(api_error(r.name.clone())(source)),
            }
        }
        Ok(())
    }
}

/// The revisions to delete so that at most `limit` remain (oldest number first), sparing live
/// and candidate ones.
pub fn doomed(all: &[Revision], limit: usize) -> Vec<&Revision> {
    let mut sorted: Vec<&Revision> = all.iter().collect();
    sorted.sort_by_key(|r| r.number);
    let excess = sorted.len().saturating_sub(limit);
    sorted
        .into_iter()
        .filter(|r| !matches!(r.phase, Phase::Live | Phase::Candidate))
        .take(excess)
        .collect()
}

/// The first 12 hex digits of a `sha256:` digest.
pub fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    label_value(&hex[..hex.len().min(12)])
}

/// `version` as a label value: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both
/// ends (a semver's `+build` becomes `_build`).
pub fn label_value(version: &str) -> String {
    let mapped: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(number: i64, phase: Phase) -> Revision {
        Revision {
            name: format!("r{number}"),
            number,
            phase,
            ..Revision::default()
        }
    }

    #[test]
    fn history_keeps_the_newest_and_never_the_live_or_candidate() {
        let all = vec![
            rev(1, Phase::Live),
            rev(2, Phase::Retired),
            rev(3, Phase::Aborted),
            rev(4, Phase::Retired),
            rev(5, Phase::Candidate),
        ];
        let names = |v: Vec<&Revision>| v.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(doomed(&all, 3)), ["r2", "r3"]);
        assert_eq!(names(doomed(&all, 5)), Vec::<String>::new());
        assert_eq!(names(doomed(&all, 1)), ["r2", "r3", "r4"]);
    }

    #[test]
    fn versions_become_label_values() {
        assert_eq!(label_value("0.2.0"), "0.2.0");
        assert_eq!(label_value("1.0.0+build.7"), "1.0.0_build.7");
        assert_eq!(label_value("-x-"), "x");
        assert_eq!(label_value(&"9".repeat(80)).len(), 63);
        assert_eq!(
            short_digest(&format!("sha256:{}", "ab".repeat(32))),
            "abababababab"
        );
    }

    #[test]
    fn a_revision_reads_its_phase_and_step() {
        let started: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let cr = ControllerRevision {
            metadata: ObjectMeta {
                name: Some("memcached-0123456789".into()),
                labels: Some(BTreeMap::from([
                    (PHASE_LABEL.into(), "candidate".into()),
                    (VERSION_LABEL.into(), "0.2.0".into()),
                ])),
                annotations: Some(BTreeMap::from([
                    (STEP_ANNOTATION.into(), "2/3".into()),
                    (STEP_STARTED_ANNOTATION.into(), started.to_string()),
                ])),
                ..Default::default()
            },
            data: RawExtension(Value::Null),
            revision: Some(4),
        };
        let r = Revision::from_object(&cr);
        assert_eq!(
            (r.number, r.phase, r.step, r.step_started),
            (4, Phase::Candidate, Some(1), Some(started))
        );
        assert_eq!(r.steps, Some(3));
    }

    #[test]
    fn a_revision_reads_each_shards_reports_and_joins_their_diffs_in_shard_order() {
        let annotation = |k: String, v: &str| (k, v.to_string());
        let cr = ControllerRevision {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([
                    (
                        PREVIEW_ANNOTATION.to_string(),
                        "2 of 2 parents previewed".into(),
                    ),
                    annotation(format!("{SHARD_REPORT_PREFIX}0"), "{}"),
                    annotation(format!("{SHARD_REPORT_PREFIX}11"), "{}"),
                    annotation(format!("{SHARD_REPORT_PREFIX}x"), "{}"),
                    annotation(format!("{SHARD_PREVIEW_PREFIX}2"), "{\"parents\":1}"),
                    annotation(format!("{SHARD_DIFF_PREFIX}10"), "b/y:\n"),
                    annotation(format!("{SHARD_DIFF_PREFIX}2"), "a/x:\n"),
                ])),
                ..Default::default()
            },
            data: RawExtension(Value::Null),
            revision: Some(4),
        };
        let r = Revision::from_object(&cr);
        assert_eq!(r.shard_reports.keys().collect::<Vec<_>>(), [&0, &11]);
        assert_eq!(r.shard_previews[&2], "{\"parents\":1}");
        let (summary, diff) = r.preview.unwrap();
        assert_eq!(summary, "2 of 2 parents previewed");
        assert_eq!(
            diff, "a/x:\nb/y:\n",
            "shard 2 before shard 10, not in text order"
        );
    }
}
