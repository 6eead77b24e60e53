//! The work queue of one plugin's controller: which parent to reconcile next, when, and why.
//!
//! Each parent is in the queue at most once, due at the earliest time anybody asked for. A
//! change is delayed by a short debounce so a burst of events (a Deployment rolling out its
//! pods) becomes one reconcile. Failures back off per parent, exponentially.

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

/// Parents waiting to be reconciled, ordered by due time.
#[derive(Debug, Default)]
pub struct Queue {
    due: BTreeMap<(Instant, u64), ObjKey>,
    entries: HashMap<ObjKey, Entry>,
    seq: u64,
}

#[derive(Debug)]
struct Entry {
    at: Instant,
    seq: u64,
    reason: Reason,
}

impl Queue {
    /// Asks for `key` to be reconciled at `at`. An earlier request already queued wins.
    pub fn schedule(&mut self, key: ObjKey, at: Instant, reason: Reason) {
        if let Some(e) = self.entries.get(&key) {
            if e.at <= at {
                return;
            }
            self.due.remove(&(e.at, e.seq));
        }
        self.seq += 1;
        self.due.insert((at, self.seq), key.clone());
        self.entries.insert(
            key,
            Entry {
                at,
                seq: self.seq,
                reason,
            },
        );
    }

    /// Drops `key` from the queue.
    pub fn remove(&mut self, key: &ObjKey) {
        if let Some(e) = self.entries.remove(key) {
            self.due.remove(&(e.at, e.seq));
        }
    }

    /// When the next entry is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.keys().next().map(|(at, _)| *at)
    }

    /// Takes the next entry due by `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(ObjKey, Reason)> {
        let (&(at, seq), _) = self.due.iter().next()?;
        if at > now {
            return None;
        }
        let key = self.due.remove(&(at, seq))?;
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
        (Some("ns".into()), n.into())
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
