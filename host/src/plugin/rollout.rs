//! How a new revision of a plugin reaches its parents: the strategy a plugin ConfigMap asks for
//! ([`Rollout`], from its annotations), what to do with a revision that just loaded ([`plan`]),
//! which parents a canary serves ([`bucket`]), and when a canary moves on, finishes or is
//! aborted ([`judge`]). Pure functions: the registry acts on their answers.
//!
//! A preview runs the candidate for every parent after the live version's reconcile and
//! records what it would change, writing nothing (see [`crate::apply::preview`]).
//!
//! A canary serves the parents whose [`bucket`] (a hash of namespace and name, 0–99) is below
//! its current step's weight, so a parent keeps its version from one step to the next and a
//! step only adds parents. The health gate is a parent whose last reconcile with the candidate
//! failed (which is also what sets its `Ready=False`): past
//! [`Rollout::max_failed_percent`] of the step's parents, the rollout is aborted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::revision::{Phase, Revision};
use crate::text::truncate;

/// Annotation: `immediate` (the default), `canary` or `preview`.
pub const STRATEGY_ANNOTATION: &str = "wasmop.io/rollout";
/// Annotation: the canary's weights in percent, increasing, ending at 100 (`10,50,100`).
pub const STEPS_ANNOTATION: &str = "wasmop.io/canary-steps";
/// Annotation: how long each step runs, once all its parents were reconciled, before the next.
pub const STEP_SECONDS_ANNOTATION: &str = "wasmop.io/canary-step-seconds";
/// Annotation: the share of a step's parents that may fail with the candidate (0: none).
pub const MAX_FAILED_ANNOTATION: &str = "wasmop.io/canary-max-failed-percent";
/// Annotation: how many revisions of the plugin are kept.
pub const HISTORY_ANNOTATION: &str = "wasmop.io/revision-history-limit";
/// Annotation: the number of a revision to make live now, skipping the rest of its canary
/// (or retrying an aborted one). Written by `wasmop rollout promote`.
pub const PROMOTE_ANNOTATION: &str = "wasmop.io/promote";
/// Annotation: the number of a candidate revision to abort. Written by `wasmop rollout abort`.
pub const ABORT_ANNOTATION: &str = "wasmop.io/abort";

/// Steps a canary takes when the ConfigMap names none.
pub const DEFAULT_STEPS: [u8; 3] = [10, 50, 100];
/// Seconds each step runs when the ConfigMap says nothing.
pub const DEFAULT_STEP_SECONDS: u64 = 30;
/// Revisions kept per plugin when the ConfigMap says nothing.
pub const DEFAULT_HISTORY: usize = 10;
/// Most steps a canary may have.
const MAX_STEPS: usize = 10;
const STEP_SECONDS_RANGE: std::ops::RangeInclusive<u64> = 0..=86_400;
const HISTORY_RANGE: std::ops::RangeInclusive<u64> = 1..=100;

/// How new revisions go live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Every parent at once.
    #[default]
    Immediate,
    /// A growing share of parents, in steps, behind a health gate.
    Canary,
    /// No parent, but every one previewed (what would change, nothing written) until the
    /// revision is promoted or aborted.
    Preview,
}

/// A plugin's rollout settings, from its ConfigMap's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// The strategy.
    pub strategy: Strategy,
    /// Canary weights, percent, increasing, the last 100.
    pub steps: Vec<u8>,
    /// How long a step runs once every parent in it has been reconciled by the candidate.
    pub step_seconds: u64,
    /// Failed parents a step tolerates, in percent of its parents.
    pub max_failed_percent: u8,
    /// Revisions kept.
    pub history: usize,
    /// A revision to make live at once.
    pub promote: Option<i64>,
    /// A candidate revision to abort.
    pub abort: Option<i64>,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            strategy: Strategy::Immediate,
            steps: DEFAULT_STEPS.to_vec(),
            step_seconds: DEFAULT_STEP_SECONDS,
            max_failed_percent: 0,
            history: DEFAULT_HISTORY,
            promote: None,
            abort: None,
        }
    }
}

/// A rollout annotation that does not hold what it must.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {name}={value:?}: expected {expected}")]
pub struct RolloutError {
    /// The annotation.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What it may be.
    pub expected: String,
}

impl Rollout {
    /// Reads the rollout annotations; every one is optional, and a bad one is an error naming it.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Self, RolloutError> {
        let mut r = Rollout::default();
        let bad = |name: &'static str, value: &str, expected: &str| RolloutError {
            name,
            value: value.to_owned(),
            expected: expected.to_owned(),
        };
        if let Some(v) = annotations.get(STRATEGY_ANNOTATION) {
            r.strategy = match v.trim() {
                "immediate" => Strategy::Immediate,
                "canary" => Strategy::Canary,
                "preview" => Strategy::Preview,
                _ => return Err(bad(STRATEGY_ANNOTATION, v, "immediate, canary or preview")),
            };
        }
        if let Some(v) = annotations.get(STEPS_ANNOTATION) {
            let expected = format!(
                "up to {MAX_STEPS} increasing percentages from 1 to 100, comma-separated, the last 100 (10,50,100)"
            );
            let steps: Option<Vec<u8>> = v
                .split(',')
                .map(|s| {
                    s.trim()
                        .parse::<u8>()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                })
                .collect();
            match steps {
                Some(s)
                    if !s.is_empty()
                        && s.len() <= MAX_STEPS
                        && s.last() == Some(&100)
                        && s.windows(2).all(|w| w[0] < w[1]) =>
                {
                    r.steps = s
                }
                _ => return Err(bad(STEPS_ANNOTATION, v, &expected)),
            }
        }
        let number = |name: &'static str, range: std::ops::RangeInclusive<u64>| {
            annotations
                .get(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|n| range.contains(n))
                        .ok_or_else(|| {
                            bad(
                                name,
                                v,
                                &format!("an integer from {} to {}", range.start(), range.end()),
                            )
                        })
                })
                .transpose()
        };
        if let Some(s) = number(STEP_SECONDS_ANNOTATION, STEP_SECONDS_RANGE)? {
            r.step_seconds = s;
        }
        if let Some(p) = number(MAX_FAILED_ANNOTATION, 0..=100)? {
            r.max_failed_percent = p as u8;
        }
        if let Some(h) = number(HISTORY_ANNOTATION, HISTORY_RANGE)? {
            r.history = h as usize;
        }
        r.promote = number(PROMOTE_ANNOTATION, 1..=i64::MAX as u64)?.map(|n| n as i64);
        r.abort = number(ABORT_ANNOTATION, 1..=i64::MAX as u64)?.map(|n| n as i64);
        Ok(r)
    }
}

/// Which of the 100 canary buckets a parent is in: stable across hosts, restarts and steps.
pub fn bucket(namespace: Option<&str>, name: &str) -> u8 {
    let mut h = Sha256::new();
    h.update(namespace.unwrap_or_default().as_bytes());
    h.update(b"/");
    h.update(name.as_bytes());
    let d = h.finalize();
    let n = u64::from_be_bytes(d[..8].try_into().expect("eight bytes"));
    (n % 100) as u8
}

/// Whether a canary at `weight` percent serves the parent.
pub fn serves(weight: u8, namespace: Option<&str>, name: &str) -> bool {
    bucket(namespace, name) < weight
}

/// What to do with a revision that just loaded, given the live one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Make it live for every parent now.
    Run,
    /// Keep the live revision; the reason, for the plugin's state.
    Hold(String),
    /// Abort it (it is the candidate named by [`ABORT_ANNOTATION`]).
    Abort(String),
    /// Preview it for every parent, writing nothing, until it is promoted or aborted.
    Preview,
    /// Roll it out as a canary from this step (0-based).
    Canary {
        /// The step to run.
        step: usize,
    },
}

/// Decides what `this` revision does beside `live`.
pub fn plan(this: &Revision, live: Option<&Revision>, rollout: &Rollout) -> Plan {
    if rollout.promote == Some(this.number) {
        return Plan::Run;
    }
    let Some(live) = live.filter(|l| l.name != this.name) else {
        // The first revision, or the live one loaded again.
        return Plan::Run;
    };
    if this.phase == Phase::Aborted {
        return Plan::Hold(format!(
            "revision {} was aborted ({}); revision {} stays live",
            this.number,
            this.note.as_deref().unwrap_or("no reason recorded"),
            live.number
        ));
    }
    // A revision that was live before is a way back: it is never staged.
    if this.phase == Phase::Retired || rollout.strategy == Strategy::Immediate {
        return Plan::Run;
    }
    if rollout.abort == Some(this.number) {
        return Plan::Abort(format!("aborted by request ({ABORT_ANNOTATION})"));
    }
    if rollout.strategy == Strategy::Preview {
        return Plan::Preview;
    }
    let step = match this.phase {
        Phase::Candidate => this.step.unwrap_or(0).min(rollout.steps.len() - 1),
        _ => 0,
    };
    Plan::Canary { step }
}

/// What one canary step has seen so far, of one controller's parents or, added up
/// ([`Report::add`]), of every shard's. A sharded host's replicas write their shards' reports
/// on the candidate's revision as JSON, for the replica that judges the canary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The candidate's weight when it was seen, in percent.
    pub weight: u8,
    /// Parents the step's weight covers.
    pub share: usize,
    /// Of those, how many the candidate has reconciled at least once.
    pub reconciled: usize,
    /// Parents whose last reconcile with the candidate failed.
    pub failed: usize,
    /// The first few of those in name order, with why (`ns/name: reason`).
    pub examples: Vec<String>,
}

/// Failed parents a [`Report`] names.
pub const REPORT_EXAMPLES: usize = 3;
/// Bytes of one example kept: reports of hundreds of shards share one object's annotations.
const EXAMPLE_BYTES: usize = 160;

impl Report {
    /// A report at `weight` over `share` parents, of which `reconciled` were reconciled by
    /// the candidate, and `failed` (`ns/name`, reason, in name order) failed.
    pub fn new(weight: u8, share: usize, reconciled: usize, failed: &[(String, String)]) -> Self {
        Report {
            weight,
            share,
            reconciled,
            failed: failed.len(),
            examples: failed
                .iter()
                .take(REPORT_EXAMPLES)
                .map(|(parent, why)| truncate(format!("{parent}: {why}"), EXAMPLE_BYTES))
                .collect(),
        }
    }

    /// Adds another controller's (another shard's) parents to these. A shard's report is read
    /// back from an annotation, so its counts saturate and its examples are cut again.
    pub fn add(&mut self, other: &Report) {
        self.share = self.share.saturating_add(other.share);
        self.reconciled = self.reconciled.saturating_add(other.reconciled);
        self.failed = self.failed.saturating_add(other.failed);
        let examples = other.examples.iter().take(REPORT_EXAMPLES);
        self.examples
            .extend(examples.map(|e| truncate(e.clone(), EXAMPLE_BYTES)));
        self.examples.sort();
        self.examples.truncate(REPORT_EXAMPLES);
    }
}

/// What a candidate has shown one controller (one shard's, on a sharded host): controllers
/// publish it, rollout judges it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The candidate's digest.
    pub digest: String,
    /// A canary's report at its current weight.
    pub canary: Option<Report>,
    /// What a previewed candidate would change.
    pub preview: Option<PreviewReport>,
}

/// Where controllers post what their candidates have shown and rollout reads it: the latest
/// [`Progress`] of each plugin's controller on each shard (shard 0 on a host that is not
/// sharded). A controller posts; nothing asks it.
#[derive(Clone, Default)]
pub struct Board {
    posts: Arc<Mutex<BTreeMap<(String, u32), Progress>>>,
}

impl Board {
    /// Where the controller of `configmap` on `shard` posts.
    pub fn post(&self, configmap: &str, shard: u32) -> Post {
        Post {
            board: self.clone(),
            key: (configmap.to_owned(), shard),
        }
    }

    /// What the candidate `digest` of `configmap` has shown, per shard that posted.
    pub fn progress(&self, configmap: &str, digest: &str) -> Vec<(u32, Progress)> {
        let posts = self.posts.lock().expect("board lock");
        posts
            .range((configmap.to_owned(), 0)..=(configmap.to_owned(), u32::MAX))
            .filter(|(_, p)| p.digest == digest)
            .map(|((_, shard), p)| (*shard, p.clone()))
            .collect()
    }
}

/// One controller's place on the [`Board`].
#[derive(Clone)]
pub struct Post {
    board: Board,
    key: (String, u32),
}

impl Post {
    /// Posts `progress`, or, with `None`, takes down what was posted.
    pub fn publish(&self, progress: Option<Progress>) {
        let mut posts = self.board.posts.lock().expect("board lock");
        match progress {
            Some(p) => posts.insert(self.key.clone(), p),
            None => posts.remove(&self.key),
        };
    }

    /// Takes down what was posted.
    pub fn clear(&self) {
        self.publish(None);
    }
}

/// What a previewed candidate would change, over every parent (or, on a sharded host, one
/// shard's parents: replicas write their shards' reports on the revision as JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewReport {
    /// Parents there are.
    pub parents: usize,
    /// Parents previewed so far.
    pub previewed: usize,
    /// Parents something of which would change (or whose reconcile would fail).
    pub changed: usize,
    /// Children that would be created.
    pub created: usize,
    /// Children that would change.
    pub modified: usize,
    /// Children that would be deleted.
    pub deleted: usize,
    /// Children whose apply would fail (a taken name, a refusal).
    pub refused: usize,
    /// Parents whose status would change.
    pub status: usize,
    /// Parents whose reconcile would fail.
    pub failed: usize,
    /// One text per parent that would change, in parent order.
    pub diffs: Vec<String>,
}

impl PreviewReport {
    /// Adds another shard's parents to these (counts saturate: a shard's report is read back
    /// from an annotation); its diffs come after these.
    pub fn add(&mut self, other: &PreviewReport) {
        for (mine, theirs) in [
            (&mut self.parents, other.parents),
            (&mut self.previewed, other.previewed),
            (&mut self.changed, other.changed),
            (&mut self.created, other.created),
            (&mut self.modified, other.modified),
            (&mut self.deleted, other.deleted),
            (&mut self.refused, other.refused),
            (&mut self.status, other.status),
            (&mut self.failed, other.failed),
        ] {
            *mine = mine.saturating_add(theirs);
        }
        self.diffs.extend(other.diffs.iter().cloned());
    }

    /// The same counts, with the diffs cut at about `max` bytes into one text (as
    /// [`PreviewReport::diff`]): what one shard's replica writes on the revision.
    pub fn cut(&self, max: usize) -> PreviewReport {
        let diff = self.diff(max);
        PreviewReport {
            diffs: if diff.is_empty() { vec![] } else { vec![diff] },
            ..self.clone()
        }
    }

    /// One line for kubectl: how far the preview got and what would change.
    pub fn summary(&self) -> String {
        format!(
            "{} of {} parents previewed: {} would change (children: {} created, {} changed, {} deleted, {} refused; status of {}), {} would fail",
            self.previewed,
            self.parents,
            self.changed,
            self.created,
            self.modified,
            self.deleted,
            self.refused,
            self.status,
            self.failed
        )
    }

    /// Every parent's diff, cut at about `max` bytes with a count of what was left out.
    pub fn diff(&self, max: usize) -> String {
        let mut out = String::new();
        for (i, d) in self.diffs.iter().enumerate() {
            if out.len() + d.len() > max {
                out.push_str(&format!(
                    "… and {} more parents that would change\n",
                    self.diffs.len() - i
                ));
                break;
            }
            out.push_str(d);
        }
        out
    }
}

/// What a running canary should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep going at this step.
    Wait,
    /// Move on to this step (0-based).
    Next(usize),
    /// The last step passed: make the candidate live.
    Promote,
    /// Roll back, for this reason.
    Abort(String),
}

/// Judges step `step` of a canary that has run for `elapsed`, from its `report`.
pub fn judge(rollout: &Rollout, step: usize, elapsed: Duration, report: &Report) -> Verdict {
    let failed = report.failed;
    let allowed = report
        .share
        .saturating_mul(rollout.max_failed_percent as usize);
    if failed > 0 && failed.saturating_mul(100) > allowed {
        let examples = &report.examples;
        return Verdict::Abort(format!(
            "{failed} of {} parents failed at step {} ({}%), more than the {}% allowed: {}",
            report.share,
            step + 1,
            rollout.steps[step],
            rollout.max_failed_percent,
            examples.join("; ")
        ));
    }
    if report.reconciled < report.share || elapsed < Duration::from_secs(rollout.step_seconds) {
        return Verdict::Wait;
    }
    if step + 1 >= rollout.steps.len() {
        Verdict::Promote
    } else {
        Verdict::Next(step + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn revision(number: i64, phase: Phase) -> Revision {
        Revision {
            name: format!("memcached-{number}"),
            number,
            phase,
            ..Revision::default()
        }
    }

    #[test]
    fn annotations_are_read_and_bounded() {
        let r = Rollout::from_annotations(&annotations(&[
            (STRATEGY_ANNOTATION, "canary"),
            (STEPS_ANNOTATION, "5, 25,100"),
            (STEP_SECONDS_ANNOTATION, "0"),
            (MAX_FAILED_ANNOTATION, "20"),
            (PROMOTE_ANNOTATION, "7"),
        ]))
        .unwrap();
        assert_eq!(r.strategy, Strategy::Canary);
        assert_eq!(r.steps, vec![5, 25, 100]);
        assert_eq!((r.step_seconds, r.max_failed_percent), (0, 20));
        assert_eq!((r.promote, r.abort, r.history), (Some(7), None, 10));
        assert_eq!(
            Rollout::from_annotations(&BTreeMap::new()).unwrap(),
            Rollout::default()
        );
        for (name, value) in [
            (STRATEGY_ANNOTATION, "blue-green"),
            (STEPS_ANNOTATION, "50,10,100"),
            (STEPS_ANNOTATION, "10,50"),
            (STEPS_ANNOTATION, "0,100"),
            (STEPS_ANNOTATION, ""),
            (STEPS_ANNOTATION, "1,2,3,4,5,6,7,8,9,10,100"),
            (STEP_SECONDS_ANNOTATION, "86401"),
            (MAX_FAILED_ANNOTATION, "101"),
            (HISTORY_ANNOTATION, "0"),
            (ABORT_ANNOTATION, "-1"),
        ] {
            let err = Rollout::from_annotations(&annotations(&[(name, value)])).unwrap_err();
            assert_eq!((err.name, err.value.as_str()), (name, value));
            assert!(
                err.to_string()
                    .starts_with(&format!("annotation {name}={value:?}: expected ")),
                "{err}"
            );
        }
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(
            bucket(Some("default"), "mc-1"),
            bucket(Some("default"), "mc-1")
        );
        let mut counts = [0usize; 10];
        for i in 0..1000 {
            counts[bucket(Some("default"), &format!("mc-{i}")) as usize / 10] += 1;
        }
        // 100 expected in each tenth; a hash far off that would make steps meaningless.
        assert!(
            counts.iter().all(|&c| (60..=140).contains(&c)),
            "{counts:?}"
        );
        // A bigger weight serves a superset.
        for i in 0..100 {
            let name = format!("mc-{i}");
            if serves(10, None, &name) {
                assert!(serves(50, None, &name));
            }
        }
        assert!(!serves(0, None, "x") && serves(100, None, "x"));
    }

    #[test]
    fn plans_follow_the_phase_and_the_strategy() {
        let live = revision(3, Phase::Live);
        let canary = Rollout {
            strategy: Strategy::Canary,
            ..Rollout::default()
        };
        let new = revision(4, Phase::New);
        assert_eq!(plan(&new, Some(&live), &Rollout::default()), Plan::Run);
        assert_eq!(plan(&new, Some(&live), &canary), Plan::Canary { step: 0 });
        let preview = Rollout {
            strategy: Strategy::Preview,
            ..Rollout::default()
        };
        assert_eq!(plan(&new, Some(&live), &preview), Plan::Preview);
        assert_eq!(plan(&new, None, &preview), Plan::Run);
        assert_eq!(plan(&new, None, &canary), Plan::Run);
        assert_eq!(plan(&live, Some(&live), &canary), Plan::Run);
        let resumed = Revision {
            step: Some(1),
            ..revision(4, Phase::Candidate)
        };
        assert_eq!(
            plan(&resumed, Some(&live), &canary),
            Plan::Canary { step: 1 }
        );
        assert_eq!(
            plan(&revision(2, Phase::Retired), Some(&live), &canary),
            Plan::Run
        );
        let aborted = Revision {
            note: Some("3 of 10 parents failed".into()),
            ..revision(4, Phase::Aborted)
        };
        assert_eq!(
            plan(&aborted, Some(&live), &canary),
            Plan::Hold(
                "revision 4 was aborted (3 of 10 parents failed); revision 3 stays live".into()
            )
        );
        let promote = Rollout {
            promote: Some(4),
            ..canary.clone()
        };
        assert_eq!(plan(&aborted, Some(&live), &promote), Plan::Run);
        let abort = Rollout {
            abort: Some(4),
            ..canary
        };
        assert!(matches!(
            plan(&resumed, Some(&live), &abort),
            Plan::Abort(_)
        ));
    }

    #[test]
    fn a_step_waits_for_its_parents_and_its_time_then_moves_on() {
        let r = Rollout {
            strategy: Strategy::Canary,
            step_seconds: 30,
            ..Rollout::default()
        };
        let half = Report::new(10, 10, 5, &[]);
        let all = Report {
            reconciled: 10,
            ..half.clone()
        };
        let long = Duration::from_secs(31);
        assert_eq!(judge(&r, 0, long, &half), Verdict::Wait);
        assert_eq!(judge(&r, 0, Duration::from_secs(5), &all), Verdict::Wait);
        assert_eq!(judge(&r, 0, long, &all), Verdict::Next(1));
        assert_eq!(judge(&r, 2, long, &all), Verdict::Promote);
        let one_failed = Report::new(
            10,
            10,
            5,
            &[("default/mc-3".into(), "InvalidOutput".into())],
        );
        assert_eq!(
            judge(&r, 0, Duration::ZERO, &one_failed),
            Verdict::Abort(
                "1 of 10 parents failed at step 1 (10%), more than the 0% allowed: default/mc-3: InvalidOutput".into()
            )
        );
        let tolerant = Rollout {
            max_failed_percent: 10,
            ..r
        };
        assert_eq!(judge(&tolerant, 0, long, &one_failed), Verdict::Wait);
    }

    #[test]
    fn shard_reports_add_up_and_name_the_first_failures() {
        let a = Report::new(10, 4, 4, &[("b/x".into(), "boom".into())]);
        let long = "why ".repeat(100);
        let b = Report::new(
            10,
            6,
            2,
            &[
                ("a/y".into(), "bad".into()),
                ("c/z".into(), long.clone()),
                ("d/w".into(), "worse".into()),
                ("e/v".into(), "worst".into()),
            ],
        );
        assert_eq!((b.failed, b.examples.len()), (4, REPORT_EXAMPLES));
        let mut all = Report {
            weight: 10,
            ..Report::default()
        };
        all.add(&a);
        all.add(&b);
        assert_eq!((all.share, all.reconciled, all.failed), (10, 6, 5));
        assert_eq!(all.examples[..2], ["a/y: bad", "b/x: boom"]);
        assert!(all.examples[2].starts_with("c/z: why"));
        assert!(all.examples[2].len() < long.len(), "a long reason is cut");
        // As a replica writes it on the revision and the judging replica reads it back.
        let text = serde_json::to_string(&all).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), all);
        // A report written by anyone else with rights on the revision cannot overflow a sum.
        let forged = Report {
            share: usize::MAX,
            failed: usize::MAX,
            examples: vec!["x".repeat(10_000); 50],
            ..Report::default()
        };
        all.add(&forged);
        assert_eq!((all.share, all.failed), (usize::MAX, usize::MAX));
        assert!(
            all.examples
                .iter()
                .all(|e| e.len() <= EXAMPLE_BYTES + '…'.len_utf8())
        );
        let r = Rollout {
            max_failed_percent: 100,
            ..Rollout::default()
        };
        assert_eq!(
            judge(&r, 0, Duration::ZERO, &all),
            Verdict::Wait,
            "100% may fail, and the sums saturate instead of wrapping"
        );
    }
}
