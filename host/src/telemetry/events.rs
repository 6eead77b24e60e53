//! Kubernetes Events, written off the caller's path by one task per writer, in order.
//!
//! An Event is a courtesy to whoever runs `kubectl describe`; its POST should neither delay the
//! work that produced it nor, in a burst (a thousand parents created at once), open a
//! connection per Event. Events are written one at a time, in order; when too many wait, new
//! ones are dropped with a warning, as client-go's broadcaster does.
//!
//! Two kinds of writer:
//! - [`Events::folding`] goes through kube-runtime's [`Recorder`], which folds a repeat (same
//!   type, action, reason and object) into a series on the first Event, first note kept. Right
//!   for parents, where the same reconcile outcome recurs.
//! - [`Events::distinct`] creates every Event as its own object, with its own note and
//!   timestamps, so `kubectl describe` lists each in order. Right for plugin ConfigMaps, where
//!   each Event records a state change (`loaded 0.1.0`, then `swapped 0.1.0 for 0.2.0`) that a
//!   series would hide behind the first note.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::Instrument;

/// Events waiting to be written before new ones are dropped.
const BACKLOG: usize = 1024;
/// The apiserver refuses a note over 1024 bytes; the cut adds a 3-byte '…'.
const NOTE_LIMIT: usize = 1020;

type Queued = (Event, ObjectReference, tracing::Span);

/// At most one warning about dropped Events this often, with how many were dropped.
const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// Queues Events for the writer task. Dropping every clone ends the task.
#[derive(Clone)]
pub struct Events {
    tx: mpsc::Sender<Queued>,
    drops: Arc<Mutex<Drops>>,
}

/// Events dropped since the last warning, and when that was.
#[derive(Default)]
struct Drops {
    count: u64,
    logged: Option<Instant>,
}

impl Drops {
    /// Counts one drop; `Some(n)` when it is time to warn about the `n` since the last warning.
    fn count(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self
            .logged
            .is_some_and(|at| now.duration_since(at) < DROP_LOG_EVERY)
        {
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

/// Where the writer task sends Events.
enum Sink {
    Folding(Recorder),
    Distinct(Distinct),
}

impl Events {
    /// A writer whose repeats become a series on the first Event (see the module docs).
    pub fn folding(recorder: Recorder) -> Self {
        Self::spawn(Sink::Folding(recorder))
    }

    /// A writer that creates every Event as an object of its own (see the module docs).
    pub fn distinct(client: Client, reporter: Reporter) -> Self {
        Self::spawn(Sink::Distinct(Distinct {
            client,
            reporter,
            seq: AtomicU64::new(0),
        }))
    }

    fn spawn(sink: Sink) -> Self {
        let (tx, mut rx) = mpsc::channel::<Queued>(BACKLOG);
        tokio::spawn(async move {
            while let Some((event, reference, span)) = rx.recv().await {
                async {
                    let written = match &sink {
                        Sink::Folding(recorder) => recorder.publish(&event, &reference).await,
                        Sink::Distinct(d) => d.create(&event, &reference).await,
                    };
                    if let Err(e) = written {
                        tracing::warn!(error = %crate::text::chain(&e), reason = %event.reason, "could not record an Event");
                    }
                }
                .instrument(span)
                .await;
            }
        });
        Events {
            tx,
            drops: Arc::default(),
        }
    }

    /// Queues `event` about `reference`; it is logged in the caller's span. When too many wait
    /// it is dropped, and the drops are logged now and then, not one line each.
    pub fn record(&self, event: Event, reference: ObjectReference) {
        if let Err(mpsc::error::TrySendError::Full((event, ..))) =
            self.tx
                .try_send((event, reference, tracing::Span::current()))
        {
            let drops = self
                .drops
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .count(Instant::now());
            if let Some(dropped) = drops {
                tracing::warn!(dropped, last_reason = %event.reason, "too many Events waiting; dropping them");
            }
        }
    }
}

/// Creates core/v1 Events that are never folded. Core/v1 rather than events.k8s.io/v1: only
/// there may an Event carry `lastTimestamp`, which `kubectl describe` sorts by.
struct Distinct {
    client: Client,
    reporter: Reporter,
    // Names Events created within one nanosecond apart.
    seq: AtomicU64,
}

impl Distinct {
    async fn create(&self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let event = CoreEvent {
            metadata: ObjectMeta {
                name: Some(event_name(regarding.name.as_deref(), now, seq)),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(ev.reason.clone()),
            message: ev
                .note
                .clone()
                .map(|n| crate::text::truncate(n, NOTE_LIMIT)),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            action: Some(ev.action.clone()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: None,
            }),
            related: ev.secondary.clone(),
            ..Default::default()
        };
        Api::<CoreEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }
}

/// `<object>.<nanoseconds><seq>` in fixed-width hex: unique, and in creation order when
/// listed by name (which is how `kubectl describe` orders Events of the same second).
fn event_name(object: Option<&str>, at: Timestamp, seq: u64) -> String {
    // An Event name is a DNS subdomain (at most 253 characters); so is an object's name, so
    // a cut is on a character boundary, and must not leave a label ending in '-' or '.'.
    let object = object.unwrap_or("wasmop");
    let object = object
        .get(..200)
        .unwrap_or(object)
        .trim_end_matches(['-', '.']);
    let nanos = u64::try_from(at.as_nanosecond()).unwrap_or(0);
    format!("{object}.{nanos:016x}{:04x}", seq & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_logged_now_and_then_with_their_count() {
        let mut drops = Drops::default();
        let t0 = Instant::now();
        assert_eq!(drops.count(t0), Some(1), "the first drop is logged");
        for i in 1..1000 {
            assert_eq!(drops.count(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(
            drops.count(t0 + DROP_LOG_EVERY),
            Some(1000),
            "then the tally"
        );
        assert_eq!(drops.count(t0 + DROP_LOG_EVERY), None);
    }

    #[test]
    fn names_sort_in_creation_order() {
        let t = |s| Timestamp::from_second(s).unwrap();
        let names = [
            event_name(Some("memcached"), t(1_700_000_000), 0),
            event_name(Some("memcached"), t(1_700_000_000), 1),
            event_name(Some("memcached"), t(1_700_000_001), 2),
        ];
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, names);
        assert!(names[0].starts_with("memcached."), "{}", names[0]);
        assert_ne!(names[0], names[1]);
    }

    #[test]
    fn long_names_and_notes_are_cut_to_what_the_apiserver_takes() {
        let long = "a".repeat(300);
        let name = event_name(Some(&long), Timestamp::UNIX_EPOCH, 0);
        assert!(name.len() <= 253, "{}", name.len());
        let cut = event_name(
            Some(&format!("{}-b", "a".repeat(199))),
            Timestamp::UNIX_EPOCH,
            0,
        );
        assert!(cut.starts_with(&format!("{}.", "a".repeat(199))), "{cut}");
    }
}
