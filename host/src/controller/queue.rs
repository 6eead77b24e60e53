//! The work queue of one plugin's controller: which parent to reconcile next, when, and why.
//!
//! Each parent is in the queue at most once, due at the earliest time anybody asked for. A
//! change is delayed by a short debounce so a burst of events (a Deployment rolling out its
//! pods) becomes one reconcile. Failures back off per parent, exponentially.
//!
//! Among the entries that are due, the most urgent [`Priority`] goes first, then the one due
//! earliest: a new or changed parent gets its children before a thousand resyncs, follow-ups
//! and retries that fell due at the same time (controller-runtime's priority queue does the
//! same for new events over its initial list).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::watch::ObjKey;

/// Why a reconcile runs. Shown in its log span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The parent was created or changed.
    ParentChanged,
    /// A child the parent controls changed or went away.
    ChildChanged(String),
    /// An object matched by one of the parent's related selectors changed.
    RelatedChanged(String),
    /// The plugin asked for it with `requeueAfterSeconds`.
    Requeue,
    /// The last reconcile changed children and left the status to this one.
    Settle,
    /// The periodic resync.
    Resync,
    /// A new plugin version was loaded.
    PluginSwapped,
    /// The previous attempt failed; this is retry number `n`.
    Retry(u32),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::ParentChanged => f.write_str("parent changed"),
            Reason::ChildChanged(what) => write!(f, "child changed ({what})"),
            Reason::RelatedChanged(what) => write!(f, "related changed ({what})"),
            Reason::Requeue => f.write_str("requeue"),
            Reason::Settle => f.write_str("children changed; status follows"),
            Reason::Resync => f.write_str("resync"),
            Reason::PluginSwapped => f.write_str("plugin swapped"),
            Reason::Retry(n) => write!(f, "retry {n} after error"),
        }
    }
}

/// How soon a due entry runs relative to other due entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// Resyncs, requeues, retries, a status follow-up, a plugin swap: nothing a user waits on.
    Low = 0,
    /// A child or related object changed: the parent's world moved.
    Normal = 1,
    /// The parent itself was created or changed: a user waits for its children.
    High = 2,
}

impl Reason {
    /// How urgent a reconcile for this reason is.
    pub fn priority(&self) -> Priority {
        match self {
            Reason::ParentChanged => Priority::High,
            Reason::ChildChanged(_) | Reason::RelatedChanged(_) => Priority::Normal,
            Reason::Requeue
            | Reason::Settle
            | Reason::Resync
            | Reason::PluginSwapped
            | Reason::Retry(_) => Priority::Low,
        }
    }
}

/// Per-parent exponential backoff: `base × 2^(failures−1)`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    /// 250 ms doubling to 5 min: quick enough to ride out a conflict, slow enough that a broken
    /// plugin on a thousand parents does not hammer the API server.
    fn default() -> Self {
        Backoff {
            base: crate::config::BACKOFF_BASE,
            max: crate::config::BACKOFF_MAX,
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.base
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// Parents waiting to be reconciled: by due time within each [`Priority`].
#[derive(Debug, Default)]
pub struct Queue {
    /// One index per priority, `Priority as usize`.
    due: [BTreeMap<(Instant, u64), ObjKey>; 3],
    entries: HashMap<ObjKey, Entry>,
    seq: u64,
}

#[derive(Debug)]
struct Entry {
    at: Instant,
    seq: u64,
    reason: Reason,
}

impl Entry {
    fn priority(&self) -> usize {
        self.reason.priority() as usize
    }
}

impl Queue {
    /// Asks for `key` to be reconciled at `at`. A queued request that is due no later and is
    /// at least as urgent wins; otherwise the entry takes the earlier time and the more urgent
    /// reason of the two.
    pub fn schedule(&mut self, key: ObjKey, at: Instant, reason: Reason) {
        let (at, reason) = match self.entries.get(&key) {
            Some(e) if e.at <= at && e.reason.priority() >= reason.priority() => return,
            Some(e) => {
                self.due[e.priority()].remove(&(e.at, e.seq));
                let reason = if e.reason.priority() > reason.priority() {
                    e.reason.clone()
                } else {
                    reason
                };
                (e.at.min(at), reason)
            }
            None => (at, reason),
        };
        self.seq += 1;
        let entry = Entry {
            at,
            seq: self.seq,
            reason,
        };
        self.due[entry.priority()].insert((at, self.seq), key.clone());
        self.entries.insert(key, entry);
    }

    /// Drops `key` from the queue.
    pub fn remove(&mut self, key: &ObjKey) {
        if let Some(e) = self.entries.remove(key) {
            self.due[e.priority()].remove(&(e.at, e.seq));
        }
    }

    /// When the next entry is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due
            .iter()
            .filter_map(|d| d.keys().next().map(|(at, _)| *at))
            .min()
    }

    /// Takes the most urgent entry due by `now`, the earliest due among equals.
    pub fn pop_due(&mut self, now: Instant) -> Option<(ObjKey, Reason)> {
        let due = self
            .due
            .iter_mut()
            .rev()
            .find(|d| d.keys().next().is_some_and(|(at, _)| *at <= now))?;
        let (_, key) = due.pop_first()?;
        let entry = self.entries.remove(&key)?;
        Some((key, entry.reason))
    }

    /// Entries waiting, due or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> ObjKey {
        ObjKey::new(Some("ns"), n)
    }

    #[tokio::test(start_paused = true)]
    async fn earliest_request_wins_and_order_is_by_due_time() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.schedule(key("a"), now + Duration::from_secs(10), Reason::Resync);
        q.schedule(
            key("b"),
            now + Duration::from_secs(1),
            Reason::ParentChanged,
        );
        // An earlier request for `a` replaces the later one, a later one is ignored.
        q.schedule(key("a"), now, Reason::Requeue);
        q.schedule(key("a"), now + Duration::from_secs(20), Reason::Resync);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_due(now), Some((key("a"), Reason::Requeue)));
        assert_eq!(q.pop_due(now), None);
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(1)));
        assert_eq!(
            q.pop_due(now + Duration::from_secs(1)),
            Some((key("b"), Reason::ParentChanged))
        );
        assert!(q.is_empty());
        q.schedule(key("c"), now, Reason::Resync);
        q.remove(&key("c"));
        assert_eq!(q.next_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_parent_goes_before_earlier_follow_ups() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let mut q = Queue::default();
        q.schedule(key("resync"), now, Reason::Resync);
        q.schedule(key("settle"), now, Reason::Settle);
        q.schedule(key("child"), now, Reason::ChildChanged("Deployment".into()));
        q.schedule(key("new"), later, Reason::ParentChanged);
        // Not due yet: urgency does not make an entry run early.
        assert_eq!(
            q.pop_due(now),
            Some((key("child"), Reason::ChildChanged("Deployment".into())))
        );
        assert_eq!(q.pop_due(later), Some((key("new"), Reason::ParentChanged)));
        assert_eq!(q.pop_due(later), Some((key("resync"), Reason::Resync)));
        assert_eq!(q.pop_due(later), Some((key("settle"), Reason::Settle)));
        assert_eq!(q.pop_due(later), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_entry_keeps_the_earlier_time_and_the_more_urgent_reason() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.schedule(key("a"), now, Reason::Resync);
        q.schedule(
            key("a"),
            now + Duration::from_secs(5),
            Reason::ParentChanged,
        );
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_due(), Some(now));
        q.schedule(key("b"), now, Reason::ChildChanged("x".into()));
        // `a` is now a parent change due now: it goes before the child change.
        assert_eq!(q.pop_due(now), Some((key("a"), Reason::ParentChanged)));
        // A less urgent, later request for a queued key changes nothing.
        q.schedule(key("b"), now + Duration::from_secs(1), Reason::Resync);
        assert_eq!(
            q.pop_due(now),
            Some((key("b"), Reason::ChildChanged("x".into())))
        );
        assert!(q.is_empty());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_millis(250));
        assert_eq!(b.delay(2), Duration::from_millis(500));
        assert_eq!(b.delay(5), Duration::from_secs(4));
        assert_eq!(b.delay(12), Duration::from_secs(300));
        assert_eq!(b.delay(100), Duration::from_secs(300));
    }
}
