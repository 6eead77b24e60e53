//! Events on parents, recorded off the reconcile path by one task per controller.
//!
//! An Event is a courtesy to whoever runs `kubectl describe`; its POST should neither delay the
//! reconcile that produced it nor, in a burst (a thousand parents created at once), open a
//! connection per Event. They are written one at a time, in order; when too many wait, new
//! ones are dropped with a warning, as client-go's broadcaster does.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::mpsc;
use tracing::Instrument;

/// Events waiting to be written before new ones are dropped.
const BACKLOG: usize = 1024;

/// Queues Events for the writer task. Dropping every clone ends the task.
#[derive(Clone)]
pub struct Events {
    tx: mpsc::Sender<(Event, ObjectReference, tracing::Span)>,
}

impl Events {
    /// Starts the writer task over `recorder`.
    pub fn spawn(recorder: Recorder) -> Self {
        let (tx, mut rx) = mpsc::channel::<(Event, ObjectReference, tracing::Span)>(BACKLOG);
        tokio::spawn(async move {
            while let Some((event, reference, span)) = rx.recv().await {
                async {
                    if let Err(e) = recorder.publish(&event, &reference).await {
                        tracing::warn!(error = %e, reason = %event.reason, "could not record an Event");
                    }
                }
                .instrument(span)
                .await;
            }
        });
        Events { tx }
    }

    /// Queues `event` about `reference`; it is logged in the caller's span.
    pub fn record(&self, event: Event, reference: ObjectReference) {
        if let Err(mpsc::error::TrySendError::Full((event, ..))) =
            self.tx
                .try_send((event, reference, tracing::Span::current()))
        {
            tracing::warn!(reason = %event.reason, "too many Events waiting; this one is dropped");
        }
    }
}
