//! How fast one plugin may create objects: a token bucket over creates.
//!
//! Kind checks stop a plugin from feeding itself directly, but not through Kubernetes' own
//! controllers: a plugin on Pods whose child is a Deployment gets a Pod for each replica, each
//! a parent of its own. Each plugin may create at most `per_minute` objects a minute, with a
//! burst of as many; a create past it is held back, the reconcile fails with a reason that
//! says so, and its retry backs off, so such a chain is slowed to the budget and reported
//! instead of growing without bound. Updates and prunes are not counted: they cannot multiply
//! objects.

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket of creates.
#[derive(Debug)]
pub struct Budget {
    per_minute: u32,
    tokens: f64,
    at: Instant,
}

impl Budget {
    /// A full bucket of `per_minute` creates (at least one).
    pub fn new(per_minute: u32) -> Self {
        let per_minute = per_minute.max(1);
        Budget {
            per_minute,
            tokens: f64::from(per_minute),
            at: Instant::now(),
        }
    }

    /// The creates allowed a minute.
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Takes one create, if the budget has one.
    pub fn take(&mut self) -> bool {
        self.take_at(Instant::now())
    }

    fn take_at(&mut self, now: Instant) -> bool {
        let rate = f64::from(self.per_minute) / 60.0;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(self.per_minute));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until one more create is allowed.
    pub fn next_in(&self) -> Duration {
        let rate = f64::from(self.per_minute) / 60.0;
        Duration::from_secs_f64(((1.0 - self.tokens).max(0.0) / rate).min(60.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Budget::new(60);
        b.at = t0;
        assert_eq!((0..100).filter(|_| b.take_at(t0)).count(), 60, "the burst");
        assert!(!b.take_at(t0));
        assert!(b.next_in() <= Duration::from_secs(1));
        // One a second after that, never more than the burst however long it rests.
        assert!(!b.take_at(t0 + Duration::from_millis(500)));
        assert!(b.take_at(t0 + Duration::from_millis(1000)));
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..100).filter(|_| b.take_at(later)).count(), 60);
    }

    #[test]
    fn a_zero_budget_still_allows_one_a_minute() {
        let mut b = Budget::new(0);
        assert_eq!(b.per_minute(), 1);
        let t = b.at;
        assert!(b.take_at(t));
        assert!(!b.take_at(t + Duration::from_secs(59)));
        assert!(b.take_at(t + Duration::from_secs(60)));
    }
}
