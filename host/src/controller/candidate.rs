//! The rollout candidate as one controller sees it: the revision a canary's weight routes some
//! parents to, or the one previewed for every parent, and what it has shown so far.
//!
//! A canary reconciles the parents its weight covers ([`serves`]), the live version the rest;
//! each of its reconciles is tallied. A previewed candidate writes nothing: after each live
//! reconcile it is asked what it would do ([`super::reconcile::preview`]), and the answer is
//! kept per parent. [`Candidate::progress`] turns both into the reports rollout judges.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::error::Error;
use super::reconcile::Outcome;
use crate::apply::preview::{Action, ParentPreview, describe};
use crate::plugin::Loaded;
use crate::plugin::rollout::{PreviewReport, Progress, Report, serves};
use crate::text::truncate;
use crate::watch::{Cache, ObjKey};

/// The candidate a controller runs beside its live version, if any.
#[derive(Default)]
pub struct Candidate {
    canary: Option<(Loaded, u8)>,
    preview: Option<Loaded>,
    seen: Arc<Mutex<Seen>>,
}

/// What the candidate's reconciles and previews have shown, shared with the reconcile tasks
/// that add to it.
#[derive(Default)]
pub struct Seen {
    // The canary's weight, and how its reconciles ended.
    tally: Option<(u8, Tally)>,
    previews: Option<Previews>,
    // Counts what was added: the progress is made again only when it moved.
    changes: u64,
}

/// How a canary's reconciles ended, per parent.
#[derive(Debug, Default)]
struct Tally {
    // A tally of another candidate is not carried over.
    digest: String,
    reconciled: BTreeSet<ObjKey>,
    // Parents whose last reconcile with it failed, and why.
    failed: BTreeMap<ObjKey, String>,
}

/// A previewed candidate's answers, per parent.
#[derive(Default)]
struct Previews {
    digest: String,
    parents: BTreeMap<ObjKey, ParentPreview>,
}

impl Candidate {
    /// The candidate's record, for the reports.
    pub fn seen(&self) -> Arc<Mutex<Seen>> {
        self.seen.clone()
    }

    /// Routes the parents `weight` covers to `canary`, or none. The tally of the same
    /// candidate carries over a change of weight. Returns whether each parent's version may
    /// have changed: `Some(before)` with the route before, for [`Candidate::moved`].
    pub fn set_canary(&mut self, canary: Option<(Loaded, u8)>) -> Option<(String, u8)> {
        let before = self.route();
        let mut seen = self.seen.lock().expect("candidate lock");
        seen.tally = canary.as_ref().map(|(loaded, weight)| {
            let digest = loaded.plugin.digest();
            let same = seen.tally.take().filter(|(_, t)| t.digest == digest);
            let tally = same.map(|(_, t)| t).unwrap_or_else(|| Tally {
                digest: digest.to_owned(),
                ..Tally::default()
            });
            (*weight, tally)
        });
        drop(seen);
        self.canary = canary;
        before
    }

    /// Previews `candidate` for every parent, or none. Returns whether it is a new one (every
    /// parent is then reconciled again, to be previewed).
    pub fn set_preview(&mut self, candidate: Option<Loaded>) -> bool {
        let fresh = match (&self.preview, &candidate) {
            (Some(old), Some(new)) => old.plugin.digest() != new.plugin.digest(),
            (None, Some(_)) => true,
            _ => false,
        };
        let mut seen = self.seen.lock().expect("candidate lock");
        seen.previews = candidate.as_ref().map(|c| {
            let digest = c.plugin.digest();
            seen.previews
                .take()
                .filter(|p| p.digest == digest)
                .unwrap_or_else(|| Previews {
                    digest: digest.to_owned(),
                    ..Previews::default()
                })
        });
        drop(seen);
        self.preview = candidate;
        fresh
    }

    /// The canary's digest and weight.
    pub fn route(&self) -> Option<(String, u8)> {
        self.canary
            .as_ref()
            .map(|(l, w)| (l.plugin.digest().to_owned(), *w))
    }

    /// The canary, if it serves `parent`.
    pub fn serving(&self, parent: &ObjKey) -> Option<&Loaded> {
        self.canary
            .as_ref()
            .filter(|(_, weight)| serves(*weight, parent.namespace(), &parent.name))
            .map(|(loaded, _)| loaded)
    }

    /// How many reconciles and previews have been recorded: it moves whenever what the
    /// candidate showed may have.
    pub fn changes(&self) -> u64 {
        self.seen.lock().expect("candidate lock").changes
    }

    /// Whether a canary or a preview runs.
    pub fn is_set(&self) -> bool {
        self.canary.is_some() || self.preview.is_some()
    }

    /// What the candidate has shown over the parents in `parents` (of kind `kind`), if one
    /// runs.
    pub fn progress(&self, parents: &Cache, kind: &str) -> Option<Progress> {
        let digest = match (&self.canary, &self.preview) {
            (Some((l, _)), _) | (None, Some(l)) => l.plugin.digest().to_owned(),
            (None, None) => return None,
        };
        let seen = self.seen.lock().expect("candidate lock");
        Some(Progress {
            digest,
            canary: seen.canary_report(parents),
            preview: seen.preview_report(parents, kind),
        })
    }

    /// The previewed candidate.
    pub fn previewed(&self) -> Option<&Loaded> {
        self.preview.as_ref()
    }

    /// Forgets what was seen of `parent` (it was deleted).
    pub fn forget(&self, parent: &ObjKey) {
        let mut seen = self.seen.lock().expect("candidate lock");
        if let Some(p) = seen.previews.as_mut() {
            p.parents.remove(parent);
        }
    }
}

/// Whether `parent`'s version changes when the route goes from `before` to `after`.
pub fn moved(before: &Option<(String, u8)>, after: &Option<(String, u8)>, parent: &ObjKey) -> bool {
    let on = |route: &Option<(String, u8)>| {
        route
            .as_ref()
            .is_some_and(|(_, w)| serves(*w, parent.namespace(), &parent.name))
    };
    let same = matches!((before, after), (Some((a, _)), Some((b, _))) if a == b);
    let (was, is) = (on(before), on(after));
    (same && was != is) || (!same && (was || is))
}

impl Seen {
    /// Records how a reconcile of `parent` by the canary `digest` ended.
    pub fn count(&mut self, digest: &str, parent: &ObjKey, result: &Result<Outcome, Error>) {
        self.changes += 1;
        // A reconcile by a candidate since replaced says nothing of the new one.
        let Some((_, tally)) = self.tally.as_mut().filter(|(_, t)| t.digest == digest) else {
            return;
        };
        tally.reconciled.insert(parent.clone());
        match result {
            Ok(_) => {
                tally.failed.remove(parent);
            }
            Err(e) => {
                let why = truncate(format!("{}: {}", e.error.reason(), e.error), 300);
                tally.failed.insert(parent.clone(), why);
            }
        }
    }

    /// Records what the previewed candidate `digest` would do to `parent` (`None`: nothing
    /// to say, the parent is gone or not the plugin's to read).
    pub fn previewed(&mut self, digest: &str, parent: &ObjKey, answer: Option<ParentPreview>) {
        self.changes += 1;
        let Some(p) = self.previews.as_mut().filter(|p| p.digest == digest) else {
            return;
        };
        match answer {
            Some(a) => p.parents.insert(parent.clone(), a),
            None => p.parents.remove(parent),
        };
    }

    fn canary_report(&self, parents: &Cache) -> Option<Report> {
        let (weight, tally) = self.tally.as_ref()?;
        let mut covered: Vec<ObjKey> = parents
            .list(None, |p| serves(*weight, p.namespace(), p.name()))
            .iter()
            .map(|p| p.key())
            .collect();
        // In name order, so the reasons an abort gives read the same from run to run.
        covered.sort();
        let failed: Vec<(String, String)> = covered
            .iter()
            .filter_map(|k| Some((k.to_string(), tally.failed.get(k)?.clone())))
            .collect();
        let reconciled = covered
            .iter()
            .filter(|k| tally.reconciled.contains(*k))
            .count();
        Some(Report::new(*weight, covered.len(), reconciled, &failed))
    }

    fn preview_report(&self, parents: &Cache, kind: &str) -> Option<PreviewReport> {
        let previews = self.previews.as_ref()?;
        let mut report = PreviewReport {
            parents: parents.len(),
            previewed: previews.parents.len(),
            ..PreviewReport::default()
        };
        for (key, p) in &previews.parents {
            if p.is_empty() {
                continue;
            }
            report.changed += 1;
            if p.error.is_some() {
                report.failed += 1;
            }
            if !p.status.is_empty() {
                report.status += 1;
            }
            for c in &p.children {
                match c.action {
                    Action::Created => report.created += 1,
                    Action::Changed(_) => report.modified += 1,
                    Action::Deleted => report.deleted += 1,
                    Action::Conflict(_) | Action::Refused(_) => report.refused += 1,
                }
            }
            let parent = format!("{kind} {key}");
            report.diffs.push(describe(
                &parent,
                &p.children,
                &p.status,
                p.error.as_deref(),
            ));
        }
        Some(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_moves_when_its_version_changes() {
        let p = ObjKey::new(Some("ns"), "a");
        let covered = (0..=100u8)
            .find(|w| serves(*w, p.namespace(), &p.name))
            .expect("some weight covers it");
        let at = |digest: &str, w: u8| Some((digest.to_string(), w));
        assert!(moved(&None, &at("x", 100), &p), "routed to a candidate");
        assert!(
            !moved(&None, &at("x", 0), &p),
            "a weight of 0 routes nothing"
        );
        assert!(moved(&at("x", 100), &None, &p), "back to the live version");
        assert!(moved(&at("x", 100), &at("y", 100), &p), "another candidate");
        assert!(
            !moved(&at("x", covered), &at("x", 100), &p),
            "still covered"
        );
        assert!(
            moved(&at("x", covered - 1), &at("x", covered), &p),
            "newly covered"
        );
    }
}
