//! When each parent is reconciled next: the [`Queue`] and one record per parent.
//!
//! The schedule does no I/O and reads the time only as it is given: the runner asks it what is
//! due, tells it what started and how it ended, and it decides the rest — a parent never runs
//! twice at once (a change while it runs reconciles it again right after), failures back off,
//! a status left to the next reconcile is written by it, and a status-only update of a parent
//! (our own write, usually) triggers nothing.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::error::Error;
use super::queue::{Queue, Reason};
use super::reconcile::Outcome;
use super::{Config, config};
use crate::watch::ObjKey;

/// What the controller keeps about one parent between reconciles.
#[derive(Debug, Default)]
struct Record {
    /// A reconcile of it is running.
    in_flight: bool,
    /// A change came while it ran: reconcile again right after, for this reason.
    dirty: Option<Reason>,
    /// Failed reconciles in a row.
    failures: u32,
    /// Its last reconcile left the status to the next one, which writes it.
    status_deferred: bool,
    /// What of it, besides its status, we last saw (see [`super::triggers::fingerprint`]).
    fingerprint: Option<u64>,
}

/// A reconcile to start now.
#[derive(Debug, PartialEq, Eq)]
pub struct Due {
    /// The parent.
    pub parent: ObjKey,
    /// Why.
    pub reason: Reason,
    /// Whether it may leave the status to the next reconcile (the last one did not).
    pub may_defer_status: bool,
}

/// The queue and the parents' records of one controller.
#[derive(Debug)]
pub struct Schedule {
    queue: Queue,
    parents: HashMap<ObjKey, Record>,
    config: Config,
}

impl Schedule {
    /// An empty schedule, timed by `config` (its debounce and backoff).
    pub fn new(config: Config) -> Self {
        Schedule {
            queue: Queue::default(),
            parents: HashMap::new(),
            config,
        }
    }

    /// Parents waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no parent waits.
    pub fn is_empty(&self) -> bool {
        self.queue.len() == 0
    }

    /// When the next parent falls due, if any waits.
    pub fn next_due(&self) -> Option<Instant> {
        self.queue.next_due()
    }

    /// Asks for `parent` to be reconciled at `at`.
    pub fn schedule(&mut self, parent: ObjKey, at: Instant, reason: Reason) {
        self.queue.schedule(parent, at, reason);
    }

    /// Asks for `parent` to be reconciled after the debounce: a burst of changes to its
    /// children or related objects becomes one reconcile.
    pub fn touched(&mut self, parent: ObjKey, now: Instant, reason: Reason) {
        self.queue
            .schedule(parent, now + self.config.debounce, reason);
    }

    /// The parent was seen, as it is now (`fingerprint`): reconciled at once if anything but
    /// its status changed since it was last seen.
    pub fn parent_seen(&mut self, parent: ObjKey, fingerprint: u64, now: Instant) {
        let record = self.parents.entry(parent.clone()).or_default();
        if record.fingerprint.replace(fingerprint) != Some(fingerprint) {
            self.queue.schedule(parent, now, Reason::ParentChanged);
        }
    }

    /// Forgets `parent` (it was deleted). A reconcile of it in flight still reports back.
    pub fn forget(&mut self, parent: &ObjKey) {
        self.queue.remove(parent);
        if let Some(record) = self.parents.remove(parent)
            && record.in_flight
        {
            let record = Record {
                in_flight: true,
                dirty: record.dirty,
                ..Record::default()
            };
            self.parents.insert(parent.clone(), record);
        }
    }

    /// The next parent due at `now` that is not already being reconciled, marked as running.
    /// One that is running is marked to run again when it ends.
    pub fn start_next(&mut self, now: Instant) -> Option<Due> {
        loop {
            let (parent, reason) = self.queue.pop_due(now)?;
            let record = self.parents.entry(parent.clone()).or_default();
            if record.in_flight {
                record.dirty = Some(reason);
                continue;
            }
            record.in_flight = true;
            return Some(Due {
                parent,
                reason,
                may_defer_status: !record.status_deferred,
            });
        }
    }

    /// A reconcile of `parent` ended with `result` at `now`: schedules the next one (`resync`
    /// is the plugin's).
    pub fn ended(
        &mut self,
        parent: ObjKey,
        result: &Result<Outcome, Error>,
        resync: Duration,
        now: Instant,
    ) {
        let record = self.parents.entry(parent.clone()).or_default();
        record.in_flight = false;
        let next = after_reconcile(result, record.failures, &self.config, resync);
        record.failures = next.failures;
        record.status_deferred = next.status_deferred;
        let dirty = record.dirty.take();
        if let Some((after, reason)) = next.again {
            self.queue.schedule(parent.clone(), now + after, reason);
        }
        if let Some(reason) = dirty {
            let at = match reason {
                Reason::ParentChanged => now,
                _ => now + self.config.debounce,
            };
            self.queue.schedule(parent, at, reason);
        }
    }
}

/// What the queue should do after a reconcile.
#[derive(Debug, PartialEq, Eq)]
struct Next {
    /// Failed reconciles in a row, this one counted.
    failures: u32,
    /// The status was left to the next reconcile.
    status_deferred: bool,
    /// When (from now) to reconcile again, and why; `None` when the parent is gone.
    again: Option<(Duration, Reason)>,
}

/// Decides when a parent is reconciled next, given how its reconcile ended and how many
/// failed before it.
fn after_reconcile(
    result: &Result<Outcome, Error>,
    failures: u32,
    config: &Config,
    resync: Duration,
) -> Next {
    match result {
        Ok(outcome) if outcome.gone => Next {
            failures: 0,
            status_deferred: false,
            again: None,
        },
        // The children's watch events normally ask first; this is in case none comes.
        Ok(outcome) if outcome.status_deferred => Next {
            failures: 0,
            status_deferred: true,
            again: Some((config.debounce, Reason::Settle)),
        },
        Ok(outcome) => Next {
            failures: 0,
            status_deferred: false,
            again: Some(match outcome.requeue_after {
                Some(after) if after < resync => (after, Reason::Requeue),
                _ => (resync, Reason::Resync),
            }),
        },
        Err(e) => {
            let n = failures + 1;
            // The same plugin on the same input fails the same way: wait for a change (of the
            // parent, a child, a related object or the plugin), or the resync.
            let delay = if e.error.is_guest_fault() {
                resync
            } else if e.error.is_transient() {
                // Failures piled up during an outage must not push the retry long past its end.
                config.backoff.delay(n).min(config::TRANSIENT_RETRY_MAX)
            } else {
                config.backoff.delay(n)
            };
            Next {
                failures: n,
                status_deferred: false,
                again: Some((delay, Reason::Retry(n))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::error::ReconcileError;
    use super::super::queue::Backoff;
    use super::*;

    fn key(name: &str) -> ObjKey {
        ObjKey::new(Some("ns"), name)
    }

    fn ok(
        requeue_after: Option<Duration>,
        status_deferred: bool,
        gone: bool,
    ) -> Result<Outcome, Error> {
        Ok(Outcome {
            gone,
            requeue_after,
            status_deferred,
        })
    }

    /// A schedule with the default timing, its debounce and backoff, and a resync.
    fn schedule() -> (Schedule, Duration, Backoff, Duration) {
        let config = Config::default();
        let (debounce, backoff) = (config.debounce, config.backoff);
        (
            Schedule::new(config),
            debounce,
            backoff,
            Duration::from_secs(600),
        )
    }

    fn failed(error: ReconcileError) -> Result<Outcome, Error> {
        Err(Error {
            parent: key("cache"),
            error: Box::new(error),
        })
    }

    #[test]
    fn after_a_reconcile_the_parent_is_due_again_at_the_right_time() {
        let config = Config::default();
        let resync = Duration::from_secs(600);
        // Success: the resync, or the plugin's requeue when sooner; failures forgotten.
        let next = after_reconcile(&ok(None, false, false), 3, &config, resync);
        assert_eq!(
            next,
            Next {
                failures: 0,
                status_deferred: false,
                again: Some((resync, Reason::Resync))
            }
        );
        let soon = Duration::from_secs(5);
        let next = after_reconcile(&ok(Some(soon), false, false), 0, &config, resync);
        assert_eq!(next.again, Some((soon, Reason::Requeue)));
        let later = Duration::from_secs(900);
        let next = after_reconcile(&ok(Some(later), false, false), 0, &config, resync);
        assert_eq!(next.again, Some((resync, Reason::Resync)));
        // Children changed: the status waits for their events, with a fallback.
        let next = after_reconcile(&ok(None, true, false), 0, &config, resync);
        assert_eq!(
            next,
            Next {
                failures: 0,
                status_deferred: true,
                again: Some((config.debounce, Reason::Settle))
            }
        );
        // Gone: nothing more.
        assert_eq!(
            after_reconcile(&ok(None, false, true), 2, &config, resync).again,
            None
        );
    }

    #[test]
    fn api_faults_back_off_and_guest_faults_wait_for_a_change() {
        let config = Config::default();
        let resync = Duration::from_secs(600);
        let api = failed(ReconcileError::Apply(Vec::new()));
        for (before, delay) in [(0, 250), (1, 500), (2, 1000)] {
            let next = after_reconcile(&api, before, &config, resync);
            assert_eq!(next.failures, before + 1);
            assert_eq!(
                next.again,
                Some((Duration::from_millis(delay), Reason::Retry(before + 1)))
            );
        }
        let unavailable = kube::Error::Api(Box::new(
            kube::core::Status::failure("etcd is unavailable", "InternalError").with_code(503),
        ));
        let outage = failed(ReconcileError::Status(unavailable));
        let next = after_reconcile(&outage, 9, &config, resync);
        assert_eq!(
            next.again,
            Some((config::TRANSIENT_RETRY_MAX, Reason::Retry(10))),
            "an outage's retries stay short: 250 ms doubled 9 times would be 128 s"
        );
        let guest = failed(ReconcileError::InvalidSelector(
            "a selector for v1 Secret".into(),
        ));
        let next = after_reconcile(&guest, 0, &config, resync);
        assert_eq!(
            next.again,
            Some((resync, Reason::Retry(1))),
            "not a short backoff"
        );
    }

    // The paused clock stands still unless advanced: every time below is exact.
    #[tokio::test(start_paused = true)]
    async fn a_parent_never_runs_twice_at_once_and_a_change_meanwhile_runs_it_again() {
        let (mut s, debounce, _, resync) = schedule();
        let t0 = Instant::now();
        s.parent_seen(key("a"), 1, t0);
        let due = s.start_next(t0).expect("a new parent is due at once");
        assert_eq!(
            due,
            Due {
                parent: key("a"),
                reason: Reason::ParentChanged,
                may_defer_status: true
            }
        );
        // A child changes while it runs: nothing starts until it ends.
        s.touched(key("a"), t0, Reason::ChildChanged("Pod ns/a-1".into()));
        tokio::time::advance(debounce).await;
        assert_eq!(s.start_next(Instant::now()), None, "already running");
        // It ends, having changed children: the status is left to the next one, which runs
        // after the debounce, for the change that came meanwhile.
        let t1 = Instant::now();
        s.ended(key("a"), &ok(None, true, false), resync, t1);
        assert_eq!(s.start_next(t1), None, "debounced");
        tokio::time::advance(debounce).await;
        let due = s
            .start_next(Instant::now())
            .expect("due after the debounce");
        assert_eq!(due.reason, Reason::ChildChanged("Pod ns/a-1".into()));
        assert!(
            !due.may_defer_status,
            "the status it was left must be written now"
        );
        s.ended(key("a"), &ok(None, false, false), resync, Instant::now());
        // At rest, the next is the resync.
        assert_eq!(s.next_due(), Some(Instant::now() + resync));
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_only_update_triggers_nothing_and_a_deleted_parent_is_forgotten() {
        let (mut s, _, _, resync) = schedule();
        let t0 = Instant::now();
        s.parent_seen(key("a"), 7, t0);
        s.start_next(t0).expect("due");
        s.ended(key("a"), &ok(None, false, false), resync, t0);
        s.parent_seen(key("a"), 7, t0);
        assert_eq!(s.start_next(t0), None, "same fingerprint: nothing to do");
        s.parent_seen(key("a"), 8, t0);
        assert!(
            s.start_next(t0).is_some(),
            "a new fingerprint runs it at once"
        );
        // Deleted while it runs: forgotten, but its end is still taken, and a parent of the
        // same name created again is new.
        s.forget(&key("a"));
        assert!(s.is_empty());
        s.ended(key("a"), &ok(None, false, true), resync, t0);
        assert_eq!(s.next_due(), None, "a gone parent is not scheduled again");
        s.parent_seen(key("a"), 8, t0);
        assert_eq!(
            s.start_next(t0).map(|d| d.reason),
            Some(Reason::ParentChanged)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_back_off_and_a_success_resets_them() {
        let (mut s, _, backoff, resync) = schedule();
        let apply = || failed(ReconcileError::Apply(Vec::new()));
        s.schedule(key("a"), Instant::now(), Reason::Resync);
        for n in 1..=3 {
            let due = s.start_next(Instant::now()).expect("due");
            s.ended(due.parent, &apply(), resync, Instant::now());
            assert_eq!(s.next_due(), Some(Instant::now() + backoff.delay(n)));
            tokio::time::advance(backoff.delay(n)).await;
        }
        let due = s.start_next(Instant::now()).expect("due");
        assert_eq!(due.reason, Reason::Retry(3));
        s.ended(due.parent, &ok(None, false, false), resync, Instant::now());
        tokio::time::advance(resync).await;
        let due = s.start_next(Instant::now()).expect("resync");
        s.ended(due.parent, &apply(), resync, Instant::now());
        assert_eq!(
            s.next_due(),
            Some(Instant::now() + backoff.delay(1)),
            "a success in between starts the backoff afresh"
        );
    }
}
