//! What the registry does with a revision that loaded, as its ConfigMap's rollout asks: make
//! it live for every parent, preview it, or roll it out as a canary, then judge the canary's
//! steps and end it (promoted or rolled back). Every decision is recorded on the revisions
//! (see [`crate::plugin::revision`]) before or as it is acted on, so another host carries on.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::{Candidate, PREVIEW_PUBLISH, Published, Registry, State};
use crate::config;
use crate::kinds::Kinds;
use crate::plugin::Loaded;
use crate::plugin::notice::Notice;
use crate::plugin::registry::Canary;
use crate::plugin::revision::{MAX_PREVIEW_DIFF, Mark, Phase, Revision, RevisionError, Revisions};
use crate::plugin::rollout::{self, PreviewReport, Report, Rollout, Strategy, Verdict};
use crate::plugin::source;

impl Registry {
    /// A version whose revision could not be recorded still goes live at once when that is
    /// its strategy; a staged one waits, since nothing would keep its progress.
    pub(super) async fn unrecorded(
        &mut self,
        configmap: &str,
        loaded: Loaded,
        kinds: Kinds,
        rollout: &Rollout,
        error: RevisionError,
    ) {
        if rollout.strategy == Strategy::Immediate {
            let msg = format!(
                "{error}; {} goes live without a revision (no history or undo for it)",
                loaded.describe()
            );
            tracing::warn!(configmap, "{msg}");
            self.notify(configmap, Notice::RevisionFailed, &msg);
            self.run_live(configmap, loaded, kinds).await;
            return;
        }
        let Some(slot) = self.slots.get_mut(configmap) else {
            return;
        };
        let msg = format!(
            "{error}; a canary needs its revision recorded: checking again every {}s",
            config::ACCESS_RETRY.as_secs()
        );
        let first = slot.state != State::Waiting(msg.clone());
        slot.state = State::Waiting(msg.clone());
        let seq = slot.seq;
        if first {
            tracing::warn!(configmap, "{msg}");
            self.notify(configmap, Notice::RevisionFailed, &msg);
        }
        self.retry(configmap, seq, config::ACCESS_RETRY);
    }

    /// Makes `this` revision live for every parent: ends any canary, records the phases
    /// (the old live revision retired, one made live again renumbered) and prunes the history.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn go_live(
        &mut self,
        configmap: &str,
        mut loaded: Loaded,
        kinds: Kinds,
        this: Revision,
        all: &[Revision],
        rollout: &Rollout,
        note: Option<String>,
    ) {
        let top = all.iter().map(|r| r.number).max().unwrap_or(this.number);
        let renumber = matches!(this.phase, Phase::Retired | Phase::Aborted) && this.number < top;
        let number = if renumber {
            top.saturating_add(1)
        } else {
            this.number
        };
        loaded.revision = Some(number);
        let slot = self.slots.get_mut(configmap).expect("slot exists");
        let candidate = slot.candidate.take();
        // A paused plugin's controller is stopped: the same version must start it again.
        let unchanged = !slot.paused && slot.running.as_ref().is_some_and(|r| r.same_as(&loaded));
        if unchanged {
            slot.state = State::Running;
        } else {
            self.run_live(configmap, loaded, kinds).await;
        }
        if candidate.is_some() {
            self.supervisor.route(configmap, None).await;
        }
        // The others first: a host that stops between the two sees one live revision or none
        // (and then runs what the ConfigMap holds, which is this one), never two.
        let mut marks = Vec::new();
        for r in all.iter().filter(|r| r.name != this.name) {
            let phase = match r.phase {
                Phase::Live => Phase::Retired,
                Phase::Candidate => Phase::Aborted,
                _ => continue,
            };
            let note = (phase == Phase::Aborted)
                .then(|| format!("superseded by revision {number} before its canary ended"));
            marks.push((r.name.clone(), Mark::to(phase, note)));
        }
        if this.phase != Phase::Live || renumber || note.is_some() {
            marks.push((
                this.name.clone(),
                Mark {
                    number: renumber.then_some(number),
                    ..Mark::to(Phase::Live, Some(note.unwrap_or_default()))
                },
            ));
        }
        self.write_marks(configmap, marks).await;
        let mut after = all.to_vec();
        for r in after.iter_mut() {
            if r.name == this.name {
                r.phase = Phase::Live;
                r.number = number;
            } else if matches!(r.phase, Phase::Live | Phase::Candidate) {
                r.phase = Phase::Retired;
            }
        }
        if let Err(e) = self.revisions.prune(&after, rollout.history).await {
            tracing::warn!(configmap, error = %e, "could not prune old revisions");
        }
    }

    pub(super) async fn write_marks(&mut self, configmap: &str, marks: Vec<(String, Mark)>) {
        for (name, mark) in marks {
            if let Err(e) = self.revisions.mark(&name, mark).await {
                let msg = e.to_string();
                tracing::warn!(configmap, error = %msg, "could not record a revision's phase");
                self.notify(configmap, Notice::RevisionFailed, &msg);
            }
        }
    }

    /// Makes sure the `live` revision is what runs for `configmap`, loading it from the
    /// cluster when the ConfigMap holds another (a canary, or an aborted revision, after a
    /// restart). `false` when it could not be loaded: nothing runs then, and the state says why.
    pub(super) async fn ensure_live(&mut self, configmap: &str, live: &Revision) -> bool {
        let slot = self.slots.get(configmap).expect("slot exists");
        if !slot.paused
            && slot.running.as_ref().is_some_and(|r| {
                r.revision == Some(live.number) && r.plugin.digest() == live.digest
            })
        {
            return true;
        }
        let loaded = match self.revisions.configmap(&live.name).await {
            // The stored form: the load inflates it under the budget.
            Ok(cm) => match source::read_stored(&cm, &self.defaults, None) {
                Ok(source) => self.loader.load(source).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        match loaded {
            Ok((mut loaded, kinds)) => {
                loaded.revision = Some(live.number);
                self.run_live(configmap, loaded, kinds).await;
                true
            }
            Err(e) => {
                let msg = format!("the live revision {} could not be loaded: {e}", live.number);
                self.fail(configmap, Notice::RevisionFailed, msg);
                false
            }
        }
    }

    /// Runs `this` revision as a canary at `step`, beside the live one.
    pub(super) async fn canary(
        &mut self,
        configmap: &str,
        mut loaded: Loaded,
        kinds: Kinds,
        this: Revision,
        rollout: Rollout,
        step: usize,
    ) {
        self.drop_candidate(configmap, &this).await;
        loaded.revision = Some(this.number);
        let slot = self.slots.get_mut(configmap).expect("slot exists");
        let same_step = slot
            .candidate
            .as_ref()
            .is_some_and(|c| c.revision.name == this.name && c.step == step && c.preview.is_none());
        let resumed = this.phase == Phase::Candidate && this.step == Some(step);
        let started = match (&slot.candidate, resumed, this.step_started) {
            (Some(c), _, _) if same_step => c.started,
            (_, true, Some(t)) => t,
            _ => Timestamp::now(),
        };
        slot.candidate = Some(Candidate {
            loaded,
            kinds,
            revision: this,
            rollout,
            step,
            started,
            preview: None,
            shard_reports: BTreeMap::new(),
        });
        slot.state = State::Running;
        if !same_step {
            self.step(configmap, step, started, resumed).await;
        }
    }

    /// Previews `this` revision for every parent beside the live one, writing nothing.
    pub(super) async fn preview(
        &mut self,
        configmap: &str,
        mut loaded: Loaded,
        kinds: Kinds,
        this: Revision,
        rollout: Rollout,
    ) {
        self.drop_candidate(configmap, &this).await;
        loaded.revision = Some(this.number);
        let slot = self.slots.get_mut(configmap).expect("slot exists");
        slot.state = State::Running;
        if let Some(c) = slot.candidate.as_mut()
            && c.revision.name == this.name
            && c.preview.is_some()
        {
            c.rollout = rollout;
            return;
        }
        let canary = Canary {
            loaded: loaded.clone(),
            kinds: kinds.clone(),
            weight: 0,
            preview: true,
        };
        let msg = format!(
            "previewing {} for every parent: nothing is written until it is promoted (wasmop rollout promote {configmap}); see wasmop rollout diff {configmap}",
            loaded.describe()
        );
        let name = this.name.clone();
        slot.candidate = Some(Candidate {
            loaded,
            kinds,
            revision: this,
            rollout,
            step: 0,
            started: Timestamp::now(),
            preview: Some(Published::default()),
            shard_reports: BTreeMap::new(),
        });
        self.supervisor.route(configmap, Some(canary)).await;
        let mark = Mark::to(Phase::Candidate, Some(String::new()));
        self.write_marks(configmap, vec![(name, mark)]).await;
        tracing::info!(configmap, "{msg}");
        if self.supervisor.judges() {
            self.notify(configmap, Notice::Canary, &msg);
        }
    }

    /// What the controllers of `configmap` posted of its canary at its current weight, by
    /// shard (shard 0 alone on a host that is not sharded).
    fn shard_reports(&self, configmap: &str) -> Vec<(u32, Report)> {
        let Some(c) = self.slots.get(configmap).and_then(|s| s.candidate.as_ref()) else {
            return Vec::new();
        };
        let weight = c.rollout.steps[c.step];
        let posted = self.board.progress(configmap, c.loaded.plugin.digest());
        posted
            .into_iter()
            .filter_map(|(shard, p)| Some((shard, p.canary.filter(|r| r.weight == weight)?)))
            .collect()
    }

    /// What the controllers of `configmap` posted of its previewed candidate, by shard.
    fn shard_previews(&self, configmap: &str) -> Vec<(u32, PreviewReport)> {
        let Some(c) = self.slots.get(configmap).and_then(|s| s.candidate.as_ref()) else {
            return Vec::new();
        };
        let posted = self.board.progress(configmap, c.loaded.plugin.digest());
        posted
            .into_iter()
            .filter_map(|(shard, p)| Some((shard, p.preview?)))
            .collect()
    }

    /// The plugins with a candidate that is previewed (`preview`) or a canary.
    fn candidates(&self, preview: bool) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(_, s)| {
                s.candidate
                    .as_ref()
                    .is_some_and(|c| c.preview.is_some() == preview)
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Writes what each preview would change to its revision, when it changed, at most every
    /// [`PREVIEW_PUBLISH`].
    pub(super) async fn publish_previews(&mut self) {
        let names = self.candidates(true);
        for configmap in names {
            if !self.supervisor.is_synced(&configmap) {
                continue;
            }
            let report = match self.supervisor.shards() {
                None => self.shard_previews(&configmap).pop().map(|(_, r)| {
                    let whole = r.previewed >= r.parents;
                    (r.summary(), Some(r.diff(MAX_PREVIEW_DIFF)), whole)
                }),
                Some(count) => self.shared_preview(&configmap, count).await,
            };
            let Some((summary, diff, whole)) = report else {
                continue;
            };
            let Some(c) = self.slots[&configmap].candidate.as_ref() else {
                continue;
            };
            let published = c.preview.as_ref().expect("listed");
            let due = published
                .at
                .is_none_or(|at| at.elapsed() >= PREVIEW_PUBLISH);
            if !due || (published.summary == summary && published.diff == diff) {
                continue;
            }
            let name = c.revision.name.clone();
            let complete = whole && !published.complete;
            let written = self
                .revisions
                .publish_preview(&name, &summary, diff.as_deref())
                .await;
            if let Err(e) = written {
                tracing::warn!(configmap, error = %e, "could not publish the preview");
                continue;
            }
            let c = self
                .slots
                .get_mut(&configmap)
                .and_then(|s| s.candidate.as_mut())
                .expect("listed");
            let what = c.loaded.describe();
            let published = c.preview.as_mut().expect("listed");
            published.summary = summary.clone();
            published.diff = diff;
            published.at = Some(std::time::Instant::now());
            if complete {
                published.complete = true;
                let msg = format!("preview of {what}: {summary}");
                tracing::info!(configmap, "{msg}");
                self.notify(&configmap, Notice::Previewed, &msg);
            }
        }
    }

    /// A sharded host's preview of `configmap`: writes what this replica's shards would
    /// change on the candidate's revision (each shard's diffs cut at its part of
    /// [`MAX_PREVIEW_DIFF`]), at most every [`PREVIEW_PUBLISH`]; on the replica that judges,
    /// adds up every shard's counts into the summary, and whether every shard reported and
    /// every parent was previewed. The diff stays in the shards' annotations.
    async fn shared_preview(
        &mut self,
        configmap: &str,
        count: u32,
    ) -> Option<(String, Option<String>, bool)> {
        let c = self.slots.get(configmap)?.candidate.as_ref()?;
        let name = c.revision.name.clone();
        let published = c.preview.as_ref()?;
        let due = published
            .shards_at
            .is_none_or(|at| at.elapsed() >= PREVIEW_PUBLISH);
        // The board's copy holds every parent's diff: taken only when one may be written.
        let previews = if due {
            self.shard_previews(configmap)
        } else {
            Vec::new()
        };
        let budget = MAX_PREVIEW_DIFF / count.max(1) as usize;
        let fresh: Vec<(u32, (String, String))> = previews
            .into_iter()
            .map(|(shard, report)| {
                let diff = report.diff(budget);
                let counts = PreviewReport {
                    diffs: Vec::new(),
                    ..report
                };
                let text = serde_json::to_string(&counts).expect("a report serialises");
                (shard, (text, diff))
            })
            .filter(|(shard, written)| published.shards.get(shard) != Some(written))
            .collect();
        for (shard, (text, diff)) in fresh {
            let written = self
                .revisions
                .publish_shard_preview(&name, shard, &text, &diff)
                .await;
            match written {
                Ok(()) => {
                    let c = self.slots.get_mut(configmap)?.candidate.as_mut()?;
                    let published = c.preview.as_mut()?;
                    published.shards.insert(shard, (text, diff));
                    published.shards_at = Some(std::time::Instant::now());
                }
                Err(e) => {
                    tracing::warn!(configmap, shard, error = %e, "could not write the shard's preview")
                }
            }
        }
        if !self.supervisor.judges() {
            return None;
        }
        let this = current(&self.revisions, configmap, &name).await?;
        let mut total = PreviewReport::default();
        let mut reported = 0;
        for shard in 0..count {
            let report = this.shard_previews.get(&shard);
            if let Some(r) = report.and_then(|t| serde_json::from_str::<PreviewReport>(t).ok()) {
                total.add(&r);
                reported += 1;
            }
        }
        if reported == 0 {
            return None;
        }
        let mut summary = total.summary();
        if reported < count {
            summary.push_str(&format!(" ({reported} of {count} shards reported so far)"));
        }
        let whole = reported == count && total.previewed >= total.parents;
        Some((summary, None, whole))
    }

    /// Sends the candidate's weight for `step` to its controller, records it on its revision
    /// and says so in an Event.
    pub(super) async fn step(
        &mut self,
        configmap: &str,
        step: usize,
        started: Timestamp,
        resumed: bool,
    ) {
        let Some(c) = self
            .slots
            .get_mut(configmap)
            .and_then(|s| s.candidate.as_mut())
        else {
            return;
        };
        c.step = step;
        c.started = started;
        let weight = c.rollout.steps[step];
        let steps = c.rollout.steps.len();
        let canary = Canary {
            loaded: c.loaded.clone(),
            kinds: c.kinds.clone(),
            weight,
            preview: false,
        };
        let name = c.revision.name.clone();
        let msg = format!(
            "{} {} {weight}% of parents (step {} of {steps}); the rest stay on {}",
            c.loaded.describe(),
            if resumed { "still serves" } else { "serves" },
            step + 1,
            self.slots[configmap]
                .running
                .as_ref()
                .map(Loaded::describe)
                .unwrap_or_default(),
        );
        self.supervisor.route(configmap, Some(canary)).await;
        tracing::info!(configmap, "{msg}");
        // On a sharded host the judging replica records and announces each step; the others
        // follow its revision (see `shared_report`).
        if !self.supervisor.judges() {
            return;
        }
        if !resumed {
            let mark = Mark {
                step: Some((step, steps, weight, started)),
                ..Mark::to(Phase::Candidate, Some(String::new()))
            };
            self.write_marks(configmap, vec![(name, mark)]).await;
        }
        self.notify(configmap, Notice::Canary, &msg);
    }

    /// Moves every canary on, promotes it or aborts it, as its health gate says.
    pub(super) async fn judge_canaries(&mut self) {
        let names = self.candidates(false);
        for configmap in names {
            // Before its caches are synced a controller sees no parents: no evidence either way.
            if !self.supervisor.is_synced(&configmap) {
                continue;
            }
            let report = match self.supervisor.shards() {
                None => self.shard_reports(&configmap).pop().map(|(_, r)| r),
                Some(count) => self.shared_report(&configmap, count).await,
            };
            let Some(report) = report else {
                continue;
            };
            let Some(c) = self.slots[&configmap].candidate.as_ref() else {
                continue;
            };
            let elapsed = Timestamp::now()
                .duration_since(c.started)
                .try_into()
                .unwrap_or_default();
            match rollout::judge(&c.rollout, c.step, elapsed, &report) {
                Verdict::Wait => {}
                Verdict::Next(step) => self.step(&configmap, step, Timestamp::now(), false).await,
                Verdict::Promote => self.promote(&configmap).await,
                Verdict::Abort(why) => self.abort(&configmap, None, why).await,
            }
        }
    }

    /// A sharded host's canary of `configmap`: writes what this replica's shards showed on the
    /// candidate's revision, catches up with what the revision says (a step taken, the
    /// candidate made live or rolled back, by the judging replica), and, on the replica that
    /// judges, adds up every shard's report at the current weight. `None` while some shard
    /// has none (its replica has not caught up, or the shard has no holder), and on a replica
    /// that does not judge.
    async fn shared_report(&mut self, configmap: &str, count: u32) -> Option<Report> {
        let reports = self.shard_reports(configmap);
        let c = self.slots.get(configmap)?.candidate.as_ref()?;
        let (name, weight) = (c.revision.name.clone(), c.rollout.steps[c.step]);
        let fresh: Vec<(u32, Report)> = reports
            .into_iter()
            .filter(|(shard, r)| r.weight == weight && c.shard_reports.get(shard) != Some(r))
            .collect();
        for (shard, report) in fresh {
            let text = serde_json::to_string(&report).expect("a report serialises");
            match self
                .revisions
                .publish_shard_report(&name, shard, &text)
                .await
            {
                Ok(()) => {
                    if let Some(c) = self.slots.get_mut(configmap)?.candidate.as_mut() {
                        c.shard_reports.insert(shard, report);
                    }
                }
                Err(e) => {
                    tracing::warn!(configmap, shard, error = %e, "could not write the shard's canary report")
                }
            }
        }
        let this = current(&self.revisions, configmap, &name).await?;
        if !self.follow(configmap, &this).await || !self.supervisor.judges() {
            return None;
        }
        let c = self.slots.get(configmap)?.candidate.as_ref()?;
        let weight = c.rollout.steps[c.step];
        let mut total = Report {
            weight,
            ..Report::default()
        };
        for shard in 0..count {
            let report = this
                .shard_reports
                .get(&shard)
                .and_then(|text| serde_json::from_str::<Report>(text).ok())
                .filter(|r| r.weight == weight)?;
            total.add(&report);
        }
        Some(total)
    }

    /// Catches up with `this`, the candidate's revision as the judging replica recorded it:
    /// its step, or its end. `false` once the candidate is no longer a canary here.
    async fn follow(&mut self, configmap: &str, this: &Revision) -> bool {
        let Some(c) = self.slots.get(configmap).and_then(|s| s.candidate.as_ref()) else {
            return false;
        };
        match this.phase {
            Phase::Candidate => {
                let recorded = this.step.filter(|s| *s < c.rollout.steps.len());
                if let Some(step) = recorded.filter(|s| *s != c.step) {
                    let started = this.step_started.unwrap_or_else(Timestamp::now);
                    self.step(configmap, step, started, true).await;
                }
                true
            }
            Phase::Live => {
                let c = self
                    .slots
                    .get_mut(configmap)
                    .and_then(|s| s.candidate.take())
                    .expect("checked above");
                let mut loaded = c.loaded;
                loaded.revision = Some(this.number);
                tracing::info!(
                    configmap,
                    "{} was made live by the replica that judges the canary",
                    loaded.describe()
                );
                self.run_live(configmap, loaded, c.kinds).await;
                self.supervisor.route(configmap, None).await;
                false
            }
            Phase::Aborted => {
                let slot = self.slots.get_mut(configmap).expect("checked above");
                let c = slot.candidate.take().expect("checked above");
                let msg = format!(
                    "rolled back {}: {}; revision {} runs again only when promoted (wasmop rollout promote {configmap})",
                    c.loaded.describe(),
                    this.note.as_deref().unwrap_or("aborted"),
                    this.number
                );
                tracing::warn!(configmap, "{msg}");
                slot.state = State::Failed(msg);
                self.supervisor.route(configmap, None).await;
                false
            }
            Phase::New | Phase::Retired => true,
        }
    }

    /// Makes the candidate live after its last step.
    pub(super) async fn promote(&mut self, configmap: &str) {
        let Some(c) = self.slots.get(configmap).and_then(|s| s.candidate.as_ref()) else {
            return;
        };
        let (loaded, kinds, revision, rollout) = (
            c.loaded.clone(),
            c.kinds.clone(),
            c.revision.clone(),
            c.rollout.clone(),
        );
        let all = match self.revisions.list(configmap).await {
            Ok(all) => all,
            Err(e) => {
                // The canary goes on as it is; the next tick tries again.
                tracing::warn!(configmap, error = %e, "could not read the revisions to promote the candidate");
                return;
            }
        };
        let this = all
            .iter()
            .find(|r| r.name == revision.name)
            .cloned()
            .unwrap_or(revision);
        let steps: Vec<String> = rollout.steps.iter().map(|w| format!("{w}%")).collect();
        let note = format!(
            "promoted after {} canary steps ({})",
            steps.len(),
            steps.join(", ")
        );
        self.go_live(configmap, loaded, kinds, this, &all, &rollout, Some(note))
            .await;
    }

    /// Rolls the candidate back (or marks `this` aborted when no canary of it runs): the
    /// parents it reconciled are reconciled again by the live revision.
    pub(super) async fn abort(&mut self, configmap: &str, this: Option<&Revision>, why: String) {
        let candidate = self
            .slots
            .get_mut(configmap)
            .and_then(|s| s.candidate.take());
        let (name, number, what, step) = match (&candidate, this) {
            (Some(c), _) if c.preview.is_some() => (
                c.revision.name.clone(),
                c.revision.number,
                c.loaded.describe(),
                " (a preview: nothing of it was written)".to_owned(),
            ),
            (Some(c), _) => (
                c.revision.name.clone(),
                c.revision.number,
                c.loaded.describe(),
                format!(" at step {} ({}%)", c.step + 1, c.rollout.steps[c.step]),
            ),
            (None, Some(t)) => (
                t.name.clone(),
                t.number,
                format!("revision {}", t.number),
                String::new(),
            ),
            (None, None) => return,
        };
        if candidate.is_some() {
            self.supervisor.route(configmap, None).await;
        }
        let mark = Mark::to(Phase::Aborted, Some(why.clone()));
        self.write_marks(configmap, vec![(name, mark)]).await;
        let live = self.slots[configmap]
            .running
            .as_ref()
            .map(Loaded::describe)
            .unwrap_or_default();
        let msg = format!(
            "rolled back {what}{step}: {why}; the parents it reconciled are reconciled again with {live}. Revision {number} runs again only when promoted (wasmop rollout promote {configmap})"
        );
        self.fail(configmap, Notice::RolloutAborted, msg);
    }

    /// Ends the canary of a revision other than `this` (the ConfigMap moved on from it).
    pub(super) async fn drop_candidate(&mut self, configmap: &str, this: &Revision) {
        let Some(slot) = self.slots.get_mut(configmap) else {
            return;
        };
        if slot
            .candidate
            .as_ref()
            .is_none_or(|c| c.revision.name == this.name)
        {
            return;
        }
        let c = slot.candidate.take().expect("checked");
        self.supervisor.route(configmap, None).await;
        let note = format!(
            "superseded by revision {} before its canary ended",
            this.number
        );
        let mark = Mark::to(Phase::Aborted, Some(note));
        self.write_marks(configmap, vec![(c.revision.name, mark)])
            .await;
    }
}

/// Revision `name` of `configmap` as the cluster holds it now.
async fn current(revisions: &Revisions, configmap: &str, name: &str) -> Option<Revision> {
    match revisions.list(configmap).await {
        Ok(all) => all.into_iter().find(|r| r.name == name),
        Err(e) => {
            tracing::warn!(configmap, error = %e, "could not read the candidate's revision");
            None
        }
    }
}
