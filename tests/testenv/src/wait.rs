//! Polling helpers whose timeouts say what was awaited and what was last seen.
//!
//! Kubernetes is eventually consistent, so tests poll. A bare `tokio::time::timeout` failure
//! ("deadline has elapsed") does not tell a reader whether the Deployment never existed or sat
//! at 2 of 3 replicas; these helpers keep the last observation and put it in the error:
//!
//! ```text
//! timed out after 60s waiting for deployment web to be available; last seen: Some(DeploymentStatus { ready_replicas: Some(2), .. })
//! ```
//!
//! Errors returned by a check are not fatal: an object that does not exist *yet* reads as
//! `NotFound`, so the helpers keep polling and report the last error if time runs out.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// First pause between two checks; it doubles up to [`MAX_INTERVAL`].
const FIRST_INTERVAL: Duration = Duration::from_millis(50);
/// Longest pause between two checks, so a ready state is noticed within half a second.
const MAX_INTERVAL: Duration = Duration::from_millis(500);
/// Longest `last seen` text kept in an error; a whole object's `Debug` can run to pages.
const MAX_LAST_SEEN: usize = 4000;

/// A wait that gave up.
#[derive(Debug, Clone, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}; last seen: {last_seen}")]
pub struct Timeout {
    /// What was awaited, as the caller described it.
    pub what: String,
    /// How long the helper waited.
    pub timeout: Duration,
    /// The last state or error observed, for the reader of a failed test.
    pub last_seen: String,
}

/// Polls `check` until it returns `Ok(Some(value))`, and returns that value.
///
/// `Ok(None)` means "not yet"; `Err(e)` is remembered and polling goes on. After `timeout`
/// the result is a [`Timeout`] naming `what` and the last error, if any.
///
/// ```no_run
/// # async fn demo(pods: kube::Api<k8s_openapi::api::core::v1::Pod>) -> Result<(), testenv::Error> {
/// use std::time::Duration;
/// let ip = testenv::wait_for("pod web-0 to get an IP", Duration::from_secs(30), || async {
///     let pod = pods.get("web-0").await?;
///     Ok::<_, kube::Error>(pod.status.and_then(|s| s.pod_ip))
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn wait_for<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
    E: Display,
{
    let mut pacer = Pacer::new(timeout);
    let mut checks = 0u32;
    loop {
        checks += 1;
        let last_seen = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => format!("not ready after {checks} checks"),
            Err(e) => format!("error: {e}"),
        };
        if !pacer.pause().await {
            return Err(timed_out(what, timeout, last_seen));
        }
    }
}

/// Fetches a state with `fetch` until `done` accepts it, and returns that state.
///
/// Use this when the state itself explains a failure: the [`Timeout`] shows the `Debug` of the
/// last fetched state (or the last fetch error). Fetch something small, such as an object's
/// `status`, to keep the message short.
///
/// ```no_run
/// # async fn demo(deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment>) -> Result<(), testenv::Error> {
/// use std::time::Duration;
/// testenv::wait_until(
///     "deployment web to have 3 ready replicas",
///     Duration::from_secs(60),
///     || async { deployments.get("web").await.map(|d| d.status) },
///     |status| status.as_ref().and_then(|s| s.ready_replicas) == Some(3),
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub async fn wait_until<S, E, F, Fut, P>(
    what: &str,
    timeout: Duration,
    mut fetch: F,
    mut done: P,
) -> Result<S, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<S, E>>,
    E: Display,
    S: Debug,
    P: FnMut(&S) -> bool,
{
    let mut pacer = Pacer::new(timeout);
    loop {
        let last_seen = match fetch().await {
            Ok(state) if done(&state) => return Ok(state),
            Ok(state) => format!("{state:?}"),
            Err(e) => format!("error: {e}"),
        };
        if !pacer.pause().await {
            return Err(timed_out(what, timeout, last_seen));
        }
    }
}

/// Spaces out checks: short pauses first (most waits end quickly), longer ones later.
struct Pacer {
    deadline: Instant,
    interval: Duration,
}

impl Pacer {
    fn new(timeout: Duration) -> Self {
        Pacer {
            deadline: Instant::now() + timeout,
            interval: FIRST_INTERVAL,
        }
    }

    /// Sleeps until the next check; `false` once the deadline has passed.
    async fn pause(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        // The last pause ends at the deadline, so one final check happens right there.
        tokio::time::sleep(self.interval.min(self.deadline - now)).await;
        self.interval = (self.interval * 2).min(MAX_INTERVAL);
        true
    }
}

fn timed_out(what: &str, timeout: Duration, mut last_seen: String) -> Timeout {
    if last_seen.len() > MAX_LAST_SEEN {
        let mut end = MAX_LAST_SEEN;
        while !last_seen.is_char_boundary(end) {
            end -= 1;
        }
        last_seen.truncate(end);
        last_seen.push_str(" …");
    }
    Timeout {
        what: what.to_owned(),
        timeout,
        last_seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_ready_value() {
        let mut n = 0;
        let got = wait_for("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move { Ok::<_, String>((n >= 3).then_some(n)) }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_names_what_and_last_error() {
        let err = wait_for("the moon", Duration::from_secs(2), || async {
            Err::<Option<()>, _>("not found")
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out after 2s waiting for the moon; last seen: error: not found"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_reports_the_last_state() {
        let mut n = 0;
        let err = wait_until(
            "n to reach 100",
            Duration::from_secs(1),
            || {
                n += 1;
                let n = n;
                async move { Ok::<_, String>(n) }
            },
            |n| *n >= 100,
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("timed out after 1s waiting for n to reach 100; last seen: ")
        );
        assert!(err.last_seen.parse::<u32>().unwrap() > 1);
    }

    #[test]
    fn long_states_are_cut() {
        let t = timed_out("x", Duration::from_secs(1), "é".repeat(MAX_LAST_SEEN));
        assert!(t.last_seen.len() <= MAX_LAST_SEEN + " …".len());
        assert!(t.last_seen.ends_with(" …"));
    }
}
