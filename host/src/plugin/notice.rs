//! The Events the registry records on a plugin ConfigMap: one reason per kind of state
//! change, so that `kubectl describe configmap` reads as the plugin's history.

use kube::runtime::events::EventType;

/// The reasons of the Events on a plugin ConfigMap, one per kind of state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The first good version of the plugin runs.
    Loaded,
    /// A good version replaced the one that ran.
    Swapped,
    /// A version could not be loaded; the last good one, if any, still runs.
    LoadFailed,
    /// A version waits for its kinds to be served.
    WaitingForKinds,
    /// A version waits for the host or its identity to be granted what it needs, or runs
    /// without some rights its identity lacks.
    Forbidden,
    /// A candidate revision serves a share of the parents (a canary step began), or is
    /// previewed.
    Canary,
    /// A preview covers every parent: what the candidate would change.
    Previewed,
    /// A candidate was rolled back: its canary failed its health gate, or was aborted.
    RolloutAborted,
    /// Revisions could not be read or written.
    RevisionFailed,
    /// The ConfigMap is readable again after a `LoadFailed` for an unreadable one, and holds
    /// what it held before: nothing to load, and the plugin is as it was.
    Recovered,
}

impl Notice {
    /// The Event's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Notice::Loaded => "Loaded",
            Notice::Swapped => "Swapped",
            Notice::LoadFailed => "LoadFailed",
            Notice::WaitingForKinds => "WaitingForKinds",
            Notice::Forbidden => "Forbidden",
            Notice::Canary => "Canary",
            Notice::Previewed => "Previewed",
            Notice::RolloutAborted => "RolloutAborted",
            Notice::RevisionFailed => "RevisionFailed",
            Notice::Recovered => "Recovered",
        }
    }

    /// Normal for a version that runs, Warning otherwise.
    pub fn event_type(self) -> EventType {
        match self {
            Notice::Loaded
            | Notice::Swapped
            | Notice::Canary
            | Notice::Previewed
            | Notice::Recovered => EventType::Normal,
            _ => EventType::Warning,
        }
    }
}
