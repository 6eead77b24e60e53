//! What `/healthz` reports: whether the host can make progress.
//!
//! The stages report here as they go: the plugin registry's loop [`Health::beat`]s every
//! second, and each shared watch says when it fails and when it works again. `/healthz` fails,
//! naming the cause, once the registry has not turned for [`config::REGISTRY_STALL`] (a loop
//! stuck on a call) or a watch has failed for [`config::WATCH_STALL`] without one success in
//! between. A controller task that dies is restarted by its supervisor rather than reported.
//!
//! ```
//! use wasmop::telemetry::health::Health;
//!
//! let health = Health::default();
//! health.beat();
//! health.watch_failed("Deployment (all namespaces)", "connection refused");
//! assert!(health.check().is_ok(), "a watch that just failed is retried first");
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::config;

/// Shared between the stages and the HTTP server. Cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    // None until the registry's loop first turns: a host still starting is not stuck.
    beat: Option<Instant>,
    // Watches failing now, by name.
    failing: HashMap<String, Failing>,
}

// A run of failures of one watch, each within `STREAK_GAP` of the one before.
struct Failing {
    first: Instant,
    last: Instant,
    error: String,
}

/// A watch that works again emits nothing until an object changes, so one whose failures
/// stopped for this long (more than kube's longest retry delay plus a timed-out call) counts
/// as working.
const STREAK_GAP: Duration = Duration::from_secs(90);

impl Health {
    /// The registry's loop turned.
    pub fn beat(&self) {
        self.lock().beat = Some(Instant::now());
    }

    /// The watch `what` failed with `error`.
    pub fn watch_failed(&self, what: &str, error: &str) {
        let now = Instant::now();
        let mut state = self.lock();
        let run = state.failing.entry(what.to_string()).or_insert(Failing {
            first: now,
            last: now,
            error: String::new(),
        });
        if now.saturating_duration_since(run.last) > STREAK_GAP {
            run.first = now;
        }
        run.last = now;
        run.error = error.to_string();
    }

    /// The watch `what` works (or was stopped).
    pub fn watch_ok(&self, what: &str) {
        let mut state = self.lock();
        if !state.failing.is_empty() {
            state.failing.remove(what);
        }
    }

    /// `Err` with every reason the host cannot make progress, one per line.
    pub fn check(&self) -> Result<(), String> {
        self.check_with(config::REGISTRY_STALL, config::WATCH_STALL)
    }

    fn check_with(&self, registry_stall: Duration, watch_stall: Duration) -> Result<(), String> {
        let state = self.lock();
        let now = Instant::now();
        let mut problems = Vec::new();
        if let Some(beat) = state.beat {
            let since = now.saturating_duration_since(beat);
            if since >= registry_stall {
                problems.push(format!(
                    "the plugin registry has not run for {}s",
                    since.as_secs()
                ));
            }
        }
        let mut failing: Vec<_> = state
            .failing
            .iter()
            .filter(|(_, f)| {
                now.saturating_duration_since(f.last) <= STREAK_GAP
                    && now.saturating_duration_since(f.first) >= watch_stall
            })
            .collect();
        failing.sort_by(|a, b| a.0.cmp(b.0));
        for (what, f) in failing {
            problems.push(format!(
                "the watch of {what} has failed for {}s: {}",
                now.saturating_duration_since(f.first).as_secs(),
                f.error
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stuck_registry_and_a_long_failing_watch_fail_the_check() {
        let h = Health::default();
        let check = || h.check_with(Duration::from_secs(60), Duration::from_secs(120));
        assert!(check().is_ok(), "not started yet");
        h.beat();
        h.watch_failed("Deployment in ns", "connection refused");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(check().is_ok());
        tokio::time::advance(Duration::from_secs(2)).await;
        let err = check().unwrap_err();
        assert_eq!(err, "the plugin registry has not run for 61s");
        h.beat();
        h.watch_failed("Deployment in ns", "refused");
        tokio::time::advance(Duration::from_secs(60)).await;
        h.beat();
        h.watch_failed("Deployment in ns", "timed out");
        let err = check().unwrap_err();
        assert_eq!(
            err,
            "the watch of Deployment in ns has failed for 121s: timed out"
        );
        h.watch_ok("Deployment in ns");
        assert!(check().is_ok());

        // Failures that stopped coming: the watch works again, though it said nothing.
        h.watch_failed("Pod in ns", "refused");
        tokio::time::advance(Duration::from_secs(80)).await;
        h.watch_failed("Pod in ns", "refused");
        tokio::time::advance(Duration::from_secs(45)).await;
        h.beat();
        assert!(
            check()
                .unwrap_err()
                .contains("Pod in ns has failed for 125s")
        );
        tokio::time::advance(Duration::from_secs(50)).await;
        h.beat();
        assert!(check().is_ok(), "no failure for 95 s");
        h.watch_failed("Pod in ns", "refused");
        assert!(
            check().is_ok(),
            "a new run of failures starts the clock again"
        );
    }
}
