//! Kubernetes Events, written off the caller's path by one task per writer, in order.
//!
//! An Event is a courtesy to whoever runs `kubectl describe`; its POST should neither delay the
//! work that produced it nor, in a burst (a thousand parents created at once), open a
//! connection per Event. Events are written one at a time, in order; when too many wait, new
//! ones are dropped with a warning, as client-go's broadcaster does.
//!
//! Two kinds of writer:
//! - [`Events::folding`] folds a repeat (same type, action, reason and object, as client-go's
//!   correlator keys it) into a series on the first `events.k8s.io` Event, first note kept,
//!   for six minutes after the last repeat. Right for parents, where the same reconcile
//!   outcome recurs.
//! - [`Events::distinct`] creates every Event as its own object, with its own note and
//!   timestamps, so `kubectl describe` lists each in order. Right for plugin ConfigMaps, where
//!   each Event records a state change (`loaded 0.1.0`, then `swapped 0.1.0 for 0.2.0`) that a
//!   series would hide behind the first note.
//!
//! A folding writer remembers, per series, only what a repeat needs: a key, the Event's name
//! and its count. kube-runtime's `Recorder` keeps a whole Event per series and scans them all
//! on every Event; with 1000 new parents that held 4.2 MiB at the peak.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event as SeriesEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;
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

impl Events {
    /// A writer whose repeats become a series on the first Event (see the module docs).
    pub fn folding(client: Client, reporter: Reporter) -> Self {
        Self::spawn(Writer::new(client, reporter, Some(Series::default())))
    }

    /// A writer that creates every Event as an object of its own (see the module docs).
    pub fn distinct(client: Client, reporter: Reporter) -> Self {
        Self::spawn(Writer::new(client, reporter, None))
    }

    fn spawn(mut writer: Writer) -> Self {
        let (tx, mut rx) = mpsc::channel::<Queued>(BACKLOG);
        tokio::spawn(async move {
            while let Some((event, reference, span)) = rx.recv().await {
                async {
                    if let Err(e) = writer.write(&event, &reference).await {
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

/// Writes one writer's Events, in the order they were queued.
struct Writer {
    client: Client,
    reporter: Reporter,
    // Names Events created within one nanosecond apart.
    seq: u64,
    /// The open series of a folding writer; `None` for a distinct one.
    series: Option<Series>,
}

impl Writer {
    fn new(client: Client, reporter: Reporter, series: Option<Series>) -> Self {
        Writer {
            client,
            reporter,
            seq: 0,
            series,
        }
    }

    async fn write(&mut self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        if self.series.is_none() {
            let event = self.core_event(ev, regarding);
            let api = Api::<CoreEvent>::namespaced(self.client.clone(), namespace);
            return api.create(&PostParams::default(), &event).await.map(|_| ());
        }
        let api = Api::<SeriesEvent>::namespaced(self.client.clone(), namespace);
        let key = series_key(ev, regarding);
        let now = Instant::now();
        let open = self.series.as_mut().and_then(|s| s.repeat(&key, now));
        if let Some((name, count)) = open {
            let patch = json!({"series": {"count": count, "lastObservedTime": MicroTime(Timestamp::now())}});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if let Some(s) = self.series.as_mut() {
                        s.repeated(&key, count, now);
                    }
                    return Ok(());
                }
                // The Event expired or was deleted: the repeat starts a new series.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.series_event(ev, regarding);
        let name = event.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &event).await?;
        if let Some(s) = self.series.as_mut() {
            s.opened(key, name, now);
        }
        Ok(())
    }

    fn name(&mut self, regarding: &ObjectReference, now: Timestamp) -> String {
        self.seq = self.seq.wrapping_add(1);
        event_name(regarding.name.as_deref(), now, self.seq)
    }

    fn instance(&self) -> String {
        self.reporter
            .instance
            .clone()
            .unwrap_or_else(|| self.reporter.controller.clone())
    }

    /// The first Event of a series: `events.k8s.io/v1`, the only version that has series.
    fn series_event(&mut self, ev: &Event, regarding: &ObjectReference) -> SeriesEvent {
        let now = Timestamp::now();
        SeriesEvent {
            metadata: ObjectMeta {
                name: Some(self.name(regarding, now)),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev
                .note
                .clone()
                .map(|n| crate::text::truncate(n, NOTE_LIMIT)),
            type_: Some(type_word(ev.type_).into()),
            event_time: Some(MicroTime(now)),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.instance()),
            ..Default::default()
        }
    }

    /// An Event never folded: core/v1 rather than events.k8s.io/v1, since only there may an
    /// Event carry `lastTimestamp`, which `kubectl describe` sorts by.
    fn core_event(&mut self, ev: &Event, regarding: &ObjectReference) -> CoreEvent {
        let now = Timestamp::now();
        CoreEvent {
            metadata: ObjectMeta {
                name: Some(self.name(regarding, now)),
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(ev.reason.clone()),
            message: ev
                .note
                .clone()
                .map(|n| crate::text::truncate(n, NOTE_LIMIT)),
            type_: Some(type_word(ev.type_).into()),
            action: Some(ev.action.clone()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.instance()),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: None,
            }),
            related: ev.secondary.clone(),
            ..Default::default()
        }
    }
}

fn type_word(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// How long after its last repeat a series stays open: client-go's and kube-runtime's six
/// minutes.
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// At most this many open series per writer (about 250 bytes each): a plugin's Events carry
/// reasons of its own, so the keys are not bounded by the parents. Past it, an Event is
/// written but not remembered, and its repeats are Events of their own.
const MAX_OPEN: usize = 16_384;

/// The open series of a folding writer: per key, the Event's name, its count and when it last
/// grew. Closed series are swept at most once a minute, not on every Event.
#[derive(Default)]
struct Series {
    open: HashMap<Box<str>, Open>,
    swept: Option<Instant>,
}

struct Open {
    name: Box<str>,
    count: i32,
    last: Instant,
}

impl Series {
    /// The Event a repeat of `key` at `now` joins, and the series' count with it.
    fn repeat(&mut self, key: &str, now: Instant) -> Option<(String, i32)> {
        if self
            .swept
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60))
        {
            self.open
                .retain(|_, o| now.duration_since(o.last) < SERIES_TTL);
            self.swept = Some(now);
        }
        let open = self.open.get(key)?;
        (now.duration_since(open.last) < SERIES_TTL)
            .then(|| (open.name.to_string(), open.count.saturating_add(1)))
    }

    /// The repeat of `key` was written: the series has `count` Events.
    fn repeated(&mut self, key: &str, count: i32, now: Instant) {
        if let Some(open) = self.open.get_mut(key) {
            open.count = count;
            open.last = now;
        }
    }

    /// `key` starts a series with Event `name`, unless [`MAX_OPEN`] are open.
    fn opened(&mut self, key: Box<str>, name: String, now: Instant) {
        if self.open.len() >= MAX_OPEN {
            return;
        }
        let open = Open {
            name: name.into_boxed_str(),
            count: 1,
            last: now,
        };
        self.open.insert(key, open);
    }
}

/// What makes two Events one series: their type, action and reason, and the objects they
/// are about. Not the note, which only the first keeps; not a `resourceVersion`, which a
/// status write changes between two repeats.
fn series_key(ev: &Event, regarding: &ObjectReference) -> Box<str> {
    let mut key = format!("{}\0{}\0{}", type_word(ev.type_), ev.action, ev.reason);
    for r in std::iter::once(regarding).chain(&ev.secondary) {
        for part in [&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid] {
            key.push('\0');
            key.push_str(part.as_deref().unwrap_or(""));
        }
    }
    key.into_boxed_str()
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

    fn reference(name: &str, uid: &str, resource_version: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("cache.example.com/v1alpha1".into()),
            kind: Some("Memcached".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            resource_version: Some(resource_version.into()),
            ..Default::default()
        }
    }

    fn event(type_: EventType, reason: &str, note: &str) -> Event {
        Event {
            type_,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    #[test]
    fn a_series_is_one_reason_about_one_object_whatever_the_note_or_version() {
        let warning = event(EventType::Warning, "ChildConflict", "first");
        let key = series_key(&warning, &reference("a", "u1", "1"));
        let again = event(EventType::Warning, "ChildConflict", "a longer second note");
        assert_eq!(key, series_key(&again, &reference("a", "u1", "7")));

        let others = [
            series_key(&warning, &reference("b", "u2", "1")),
            series_key(&warning, &reference("a", "u3", "1")),
            series_key(
                &event(EventType::Normal, "ChildConflict", "first"),
                &reference("a", "u1", "1"),
            ),
            series_key(
                &event(EventType::Warning, "Scaled", "first"),
                &reference("a", "u1", "1"),
            ),
            series_key(
                &Event {
                    secondary: Some(reference("r", "u9", "1")),
                    ..event(EventType::Warning, "ChildConflict", "first")
                },
                &reference("a", "u1", "1"),
            ),
        ];
        for other in &others {
            assert_ne!(&key, other);
        }
    }

    #[test]
    fn a_series_counts_its_repeats_and_closes_six_minutes_after_the_last() {
        let mut series = Series::default();
        let t0 = Instant::now();
        assert_eq!(series.repeat("k", t0), None, "nothing open yet");
        series.opened("k".into(), "a.1".into(), t0);
        let t1 = t0 + Duration::from_secs(300);
        assert_eq!(series.repeat("k", t1), Some(("a.1".into(), 2)));
        series.repeated("k", 2, t1);
        // Five minutes after the repeat (ten after the first) it is still open.
        let t2 = t1 + Duration::from_secs(300);
        assert_eq!(series.repeat("k", t2), Some(("a.1".into(), 3)));
        assert_eq!(series.repeat("other", t2), None);
        // Not written: the count did not move.
        assert_eq!(series.repeat("k", t2), Some(("a.1".into(), 3)));
        assert_eq!(series.repeat("k", t1 + SERIES_TTL), None, "closed");
        assert!(series.open.is_empty(), "and swept");
    }

    #[test]
    fn open_series_are_bounded() {
        let mut series = Series::default();
        let t0 = Instant::now();
        for i in 0..MAX_OPEN + 10 {
            series.opened(format!("k{i}").into(), format!("e{i}"), t0);
        }
        assert_eq!(series.open.len(), MAX_OPEN);
        assert_eq!(series.repeat("k0", t0), Some(("e0".into(), 2)));
        let past = format!("k{MAX_OPEN}");
        assert_eq!(series.repeat(&past, t0), None, "not remembered");
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
