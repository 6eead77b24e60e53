//! The host's API client: bounded timeouts on every call, and the leader's write fence.
//!
//! [`connect`] builds the client `wasmop run` uses: a connection that stops answering fails a
//! call within [`config::API_READ_TIMEOUT`] (watches: [`config::WATCH_TIMEOUT_SECONDS`] plus
//! kube's 5 s idle margin) and the caller retries with backoff, instead of waiting forever.
//!
//! A [`Fence`] stands between the host and the API server while leader election is on. Reads
//! always pass; a write (any method but `GET`) passes only while this replica holds the Lease
//! and the Lease, as last seen, is valid for another second. The fence reads the Lease out of
//! every answer the lease manager gets ([`Fence::observe`]): one naming this replica as holder
//! keeps the fence open until the Lease's `renewTime` plus its duration less one second (for
//! a renewal, never longer than from when it was sent); one naming another holder shuts it.
//! So a leader that was frozen (SIGSTOP, a long pause, a black-holed network) and wakes up
//! after its Lease expired writes nothing through its backlog: the deadline has passed before
//! any renewal could succeed. The fence is asked again each time a write in progress is
//! polled, so one that passed just before the freeze but had not reached the wire is dropped
//! too.
//!
//! ```
//! use std::time::Duration;
//! use wasmop::client::Fence;
//!
//! let fence = Fence::new("wasmop-leader", "host-a", Duration::from_secs(15));
//! assert!(!fence.is_open(), "shut until the Lease is held");
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::client::Body;
use tokio::time::Instant;

use crate::config;
use crate::telemetry::metrics::{self, WriteLabels};

/// A client for the cluster of `KUBECONFIG` (or the pod's), with the host's timeouts.
pub async fn connect() -> anyhow::Result<Client> {
    let mut config = kube::Config::infer()
        .await
        .context("reading the cluster's configuration (KUBECONFIG or in-cluster)")?;
    with_timeouts(&mut config);
    Client::try_from(config).context("building the API client")
}

/// Sets the host's timeouts on `config`.
pub fn with_timeouts(config: &mut kube::Config) {
    config.connect_timeout = Some(config::API_CONNECT_TIMEOUT);
    config.read_timeout = Some(config::API_READ_TIMEOUT);
    config.write_timeout = Some(config::API_WRITE_TIMEOUT);
    // The read timeout then counts from each request, not from when its pooled connection
    // went idle.
    config.reset_reader_on_write = true;
}

/// A write refused because this replica does not hold a valid Lease.
#[derive(Debug, thiserror::Error)]
#[error(
    "{method} {path} refused: this host does not hold the leader Lease {lease} (or its last renewal is too old)"
)]
pub struct Fenced {
    /// The request's method.
    pub method: Method,
    /// The request's path.
    pub path: String,
    /// The Lease's name.
    pub lease: String,
}

/// Lets writes through only while the Lease is held and fresh, and counts them (metric
/// `wasmop_api_writes_total`). Cheap to clone.
#[derive(Clone)]
pub struct Fence {
    inner: Arc<FenceState>,
}

struct FenceState {
    lease: String,
    // This replica's identity, as the Lease's holder names it.
    identity: String,
    // How long a renewal keeps the fence open, counted from when the renewal was sent.
    valid_for: Duration,
    // Open until this instant, in ms since `epoch`; 0 is shut.
    until_ms: AtomicU64,
    epoch: Instant,
    // Armed once the Lease was acquired; never re-armed after it was lost.
    state: Mutex<Phase>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    // No leader election: always open; the fence only counts.
    Unfenced,
    Waiting,
    Leading,
    Lost,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("lease", &self.inner.lease)
            .field("open", &self.is_open())
            .finish()
    }
}

impl Fence {
    /// A shut fence for Lease `lease` held as `identity`, whose renewals are valid for
    /// `duration` less 1 s.
    pub fn new(lease: &str, identity: &str, duration: Duration) -> Fence {
        Fence {
            inner: Arc::new(FenceState {
                lease: lease.to_string(),
                identity: identity.to_string(),
                valid_for: duration.saturating_sub(Duration::from_secs(1)),
                until_ms: AtomicU64::new(0),
                epoch: Instant::now(),
                state: Mutex::new(Phase::Waiting),
            }),
        }
    }

    /// A fence that is always open (no leader election): it only counts writes.
    pub fn unfenced() -> Fence {
        let fence = Fence::new("", "", Duration::ZERO);
        *fence.inner.state.lock().expect("fence lock") = Phase::Unfenced;
        fence
    }

    /// Whether `other` is this very fence (a clone of it), not merely one for the same Lease.
    pub fn same(&self, other: &Fence) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether a write may pass now.
    pub fn is_open(&self) -> bool {
        match self.phase() {
            Phase::Unfenced => true,
            Phase::Leading => self.now_ms() < self.inner.until_ms.load(Ordering::SeqCst),
            Phase::Waiting | Phase::Lost => false,
        }
    }

    /// When the fence shuts unless a renewal succeeds first (`None` unless leading).
    pub fn deadline(&self) -> Option<Instant> {
        (self.phase() == Phase::Leading).then(|| {
            self.inner.epoch + Duration::from_millis(self.inner.until_ms.load(Ordering::SeqCst))
        })
    }

    /// When the renewal that keeps the fence open was sent (`None` unless leading).
    pub fn renewed_at(&self) -> Option<Instant> {
        self.deadline()
            .and_then(|d| d.checked_sub(self.inner.valid_for))
    }

    /// The Lease was acquired: open the fence, for as long as the acquiring request (seen by
    /// [`Fence::observe`]) allows.
    pub fn lead(&self) {
        let mut phase = self.inner.state.lock().expect("fence lock");
        if *phase == Phase::Waiting {
            *phase = Phase::Leading;
        }
    }

    /// The Lease is lost: shut the fence for good.
    pub fn lose(&self) {
        *self.inner.state.lock().expect("fence lock") = Phase::Lost;
        self.inner.until_ms.store(0, Ordering::SeqCst);
    }

    /// How long a renewal keeps the fence open.
    pub fn valid_for(&self) -> Duration {
        self.inner.valid_for
    }

    /// The Lease as an answer to a request sent at `sent` showed it; `renewal` when that
    /// request wrote it.
    fn saw(&self, lease: &Lease, sent: Instant, renewal: bool) {
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        if holder != Some(self.inner.identity.as_str()) {
            if self.phase() == Phase::Leading {
                tracing::warn!(holder, "the leader Lease names another holder; writes stop");
                self.inner.until_ms.store(0, Ordering::SeqCst);
            }
            return;
        }
        let (Some(renewed), Some(seconds)) = (
            spec.and_then(|s| s.renew_time.as_ref()),
            spec.and_then(|s| s.lease_duration_seconds),
        ) else {
            return;
        };
        let expires = SystemTime::from(renewed.0) + Duration::from_secs(seconds.max(0) as u64);
        let left = expires
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(1));
        let mut until = Instant::now() + left;
        if renewal {
            until = until.min(sent + self.inner.valid_for);
        }
        self.extend(until);
    }

    fn extend(&self, until: Instant) {
        let ms = until
            .saturating_duration_since(self.inner.epoch)
            .as_millis() as u64;
        self.inner.until_ms.fetch_max(ms, Ordering::SeqCst);
    }

    fn phase(&self) -> Phase {
        *self.inner.state.lock().expect("fence lock")
    }

    fn now_ms(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.inner.epoch)
            .as_millis() as u64
    }

    /// `client`, with every write checked against the fence (and counted).
    pub fn guard(&self, client: &Client) -> Client {
        let fence = self.clone();
        let inner = client.clone();
        let guarded = tower::service_fn(move |request: http::Request<Body>| {
            let (fence, inner) = (fence.clone(), inner.clone());
            async move {
                if !is_write(&request) {
                    return inner.send(request).await.map_err(BoxError::from);
                }
                let resource = resource_of(request.uri().path());
                if !fence.is_open() {
                    count_write("refused", resource);
                    let refused = Fenced {
                        method: request.method().clone(),
                        path: request.uri().path().to_string(),
                        lease: fence.inner.lease.clone(),
                    };
                    tracing::debug!("{refused}");
                    return Err(BoxError::from(refused));
                }
                let (method, path) = (request.method().clone(), request.uri().path().to_string());
                // Checked again at every poll: a process frozen between the check above and
                // the request reaching the wire (waiting for a pooled connection, say) must
                // not send it after it woke up deposed.
                let mut send = std::pin::pin!(inner.send(request));
                let response = std::future::poll_fn(|cx| {
                    if !fence.is_open() {
                        return std::task::Poll::Ready(Err(None));
                    }
                    send.as_mut().poll(cx).map_err(Some)
                })
                .await;
                match response {
                    Ok(response) => {
                        count_write("sent", resource);
                        Ok(response)
                    }
                    Err(Some(e)) => {
                        count_write("failed", resource);
                        Err(BoxError::from(e))
                    }
                    Err(None) => {
                        count_write("refused", resource);
                        let refused = Fenced {
                            method,
                            path,
                            lease: fence.inner.lease.clone(),
                        };
                        tracing::debug!("{refused} (while it was being sent)");
                        Err(BoxError::from(refused))
                    }
                }
            }
        });
        Client::new(guarded, client.default_namespace())
    }

    /// `client`, for the lease manager: the Lease in every successful answer about it moves
    /// the fence (see the module docs).
    pub fn observe(&self, client: &Client) -> Client {
        let fence = self.clone();
        let inner = client.clone();
        let suffix = format!("/leases/{}", self.inner.lease);
        let observed = tower::service_fn(move |request: http::Request<Body>| {
            let (fence, inner) = (fence.clone(), inner.clone());
            let about = request.uri().path().ends_with(&suffix);
            let renewal = about && is_write(&request);
            async move {
                let sent = Instant::now();
                let response = inner.send(request).await?;
                if !about || !response.status().is_success() {
                    return Ok::<_, kube::Error>(response);
                }
                // A Lease is small: read it, then hand the same bytes on.
                let (parts, body) = response.into_parts();
                let bytes = body.collect_bytes().await?;
                if let Ok(lease) = serde_json::from_slice::<Lease>(&bytes) {
                    fence.saw(&lease, sent, renewal);
                }
                Ok(http::Response::from_parts(parts, Body::from(bytes)))
            }
        });
        Client::new(observed, client.default_namespace())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Anything but a read. Access reviews are `POST`s that change nothing: they pass and are
/// not counted.
fn is_write(request: &http::Request<Body>) -> bool {
    let read = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    let review = request
        .uri()
        .path()
        .starts_with("/apis/authorization.k8s.io/");
    !read && !review
}

/// Counts a write: `sent` (the API server answered, whatever it said), `failed` (no answer:
/// the connection failed or timed out) or `refused` by the fence.
fn count_write(result: &'static str, resource: String) {
    metrics::metrics()
        .api_writes
        .get_or_create(&WriteLabels { result, resource })
        .inc();
}

/// The resource (and subresource) a request path names: `deployments`, `memcacheds/status`.
fn resource_of(path: &str) -> String {
    let mut parts = path.trim_matches('/').split('/');
    // `/api/v1/...` or `/apis/<group>/<version>/...`
    let rest: Vec<&str> = match parts.next() {
        Some("api") => parts.skip(1).collect(),
        Some("apis") => parts.skip(2).collect(),
        _ => return String::new(),
    };
    let rest = match rest.as_slice() {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        all => all,
    };
    match rest {
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => resource.to_string(),
        [] => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_counted_by_resource() {
        let cases = [
            ("/apis/apps/v1/namespaces/ns/deployments/a", "deployments"),
            ("/apis/apps/v1/namespaces/ns/deployments", "deployments"),
            (
                "/apis/cache.example.com/v1alpha1/namespaces/ns/memcacheds/a/status",
                "memcacheds/status",
            ),
            ("/api/v1/namespaces/ns/events", "events"),
            ("/api/v1/namespaces/ns", "namespaces"),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/x",
                "clusterroles",
            ),
            ("/version", ""),
        ];
        for (path, resource) in cases {
            assert_eq!(resource_of(path), resource, "{path}");
        }
    }

    fn lease(holder: &str, renewed_ago: Duration) -> Lease {
        let renewed = k8s_openapi::jiff::Timestamp::try_from(SystemTime::now() - renewed_ago)
            .expect("a timestamp");
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "renewTime": renewed.to_string(),
            },
        }))
        .expect("a Lease")
    }

    #[tokio::test]
    async fn the_fence_follows_the_lease_it_sees() {
        let fence = Fence::new("l", "me", Duration::from_secs(15));
        let now = Instant::now();
        fence.saw(&lease("me", Duration::ZERO), now, true);
        assert!(!fence.is_open(), "nothing passes before leading");
        fence.lead();
        assert!(fence.is_open(), "the acquiring renewal counts");
        let deadline = fence.deadline().unwrap();
        assert!(deadline <= now + Duration::from_secs(14), "{deadline:?}");
        assert!(deadline > now + Duration::from_secs(13), "{deadline:?}");

        // A Lease of this identity renewed 10 s ago (an earlier run of this pod): 4 s left.
        let fence = Fence::new("l", "me", Duration::from_secs(15));
        fence.lead();
        assert!(!fence.is_open(), "no Lease seen yet");
        fence.saw(&lease("me", Duration::from_secs(10)), Instant::now(), false);
        assert!(fence.is_open());
        let left = fence.deadline().unwrap() - Instant::now();
        assert!(
            left <= Duration::from_secs(4) && left > Duration::from_secs(3),
            "{left:?}"
        );
        let ago = Instant::now() - fence.renewed_at().unwrap();
        assert!(
            ago >= Duration::from_secs(10) && ago < Duration::from_secs(11),
            "{ago:?}"
        );

        // Long expired: still shut, until a renewal succeeds.
        let fence = Fence::new("l", "me", Duration::from_secs(15));
        fence.lead();
        fence.saw(&lease("me", Duration::from_secs(60)), Instant::now(), false);
        assert!(!fence.is_open());
        fence.saw(&lease("me", Duration::ZERO), Instant::now(), true);
        assert!(fence.is_open());

        // Another holder shuts it at once; lost is for good.
        fence.saw(&lease("you", Duration::ZERO), Instant::now(), false);
        assert!(!fence.is_open());
        fence.saw(&lease("me", Duration::ZERO), Instant::now(), true);
        assert!(
            fence.is_open(),
            "a renewal that succeeded as holder reopens it"
        );
        fence.lose();
        fence.lead();
        fence.saw(&lease("me", Duration::ZERO), Instant::now(), true);
        assert!(!fence.is_open(), "lost is for good");
        assert_eq!(fence.deadline(), None);
        assert_eq!(fence.renewed_at(), None);
        assert!(Fence::unfenced().is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_counts_from_when_it_was_sent() {
        let fence = Fence::new("l", "me", Duration::from_secs(15));
        fence.lead();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        // The answer took 5 s; the Lease's own renewTime says now.
        fence.saw(&lease("me", Duration::ZERO), sent, true);
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(fence.is_open());
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(!fence.is_open(), "14 s after the renewal was sent");
    }
}
