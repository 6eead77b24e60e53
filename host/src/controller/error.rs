//! Why a reconcile failed, and what the controller does about it.
//!
//! [`ReconcileError`] keeps the cause as its `source` and gives the word that goes into the
//! parent's `Ready` condition and the Warning Event ([`ReconcileError::reason`]). Failures
//! split in two, as controller-runtime's `TerminalError` does:
//! - **guest faults** the same plugin would repeat on the same input (a trap, a guest error,
//!   output that breaks the rules): retrying on a short backoff only burns CPU, so the parent
//!   waits for a change of its input or of the plugin, with the resync as a safety net;
//! - everything else (the API server, a conflict, the host, a deadline that a busy host may
//!   have caused) is retried with backoff.

use std::fmt;

use wasmop_contract::ValidationError;

use crate::apply::{ChildError, Conflict};
use crate::plugin::access::AccessError;
use crate::sandbox::{PluginError, PluginErrorKind};
use crate::text::{api_error, is_forbidden};
use crate::watch::ObjKey;

/// One step of one reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The parent is nested deeper than the host can decode; the plugin is not called.
    #[error("the object cannot be decoded, so the plugin is not called: {0}")]
    Undecodable(String),
    /// A call into the plugin failed (`related` or `reconcile`).
    #[error(transparent)]
    Plugin(PluginError),
    /// `related` returned a selector the host cannot use.
    #[error("related() returned {0}")]
    InvalidSelector(String),
    /// The response broke the host's output rules.
    #[error(transparent)]
    InvalidOutput(ValidationError),
    /// Children could not be applied or pruned (every failure, the first as the source).
    #[error("{}", join(.0))]
    Apply(Vec<ChildError>),
    /// Desired children whose names other objects hold; those were left untouched.
    #[error("{}", join(.0))]
    ChildConflict(Vec<Conflict>),
    /// The parent's status could not be written.
    #[error("writing the status: {}", api_error(.0))]
    Status(#[source] kube::Error),
    /// The plugin's finalizer could not be added to or removed from the parent.
    #[error("updating the finalizer {finalizer}: {}", api_error(.source))]
    Finalizer {
        /// `wasmop.io/<plugin>`.
        finalizer: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
    /// The plugin's own identity may not read its parent there, so the plugin is not called.
    #[error(
        "{account} may not list {resource} {}, so the plugin is not called; grant it with `wasmop rbac`",
        .namespace.as_deref().map_or("cluster-wide".to_string(), |ns| format!("in namespace {ns}"))
    )]
    Unreadable {
        /// `system:serviceaccount:<ns>:wasmop-plugin-<configmap>`.
        account: String,
        /// `memcacheds.cache.example.com`.
        resource: String,
        /// Where the parent is.
        namespace: Option<String>,
    },
    /// Asking what the plugin may read failed; nothing is handed to it meanwhile.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// Creates the plugin's create budget held back (the rest was applied).
    #[error(
        "{held_back} children not created yet: the plugin may create {per_minute} objects a minute (--creates-per-minute)"
    )]
    CreateBudget {
        /// Creates held back.
        held_back: usize,
        /// The budget.
        per_minute: u32,
    },
    /// A desired child that would be the host's own object (in its namespace), which no
    /// plugin may write.
    #[error(
        "the child {0} would be in the host's namespace, or one of the host's own objects there, which no plugin may write"
    )]
    HostNamespace(String),
    /// The reconcile's task panicked: a bug of the host, retried with backoff.
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
}

fn join(errors: &[impl ToString]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ReconcileError {
    /// A stable UpperCamelCase word for the `Ready` condition, the Event and the metric label.
    pub fn reason(&self) -> &'static str {
        if self.is_forbidden() {
            return "Forbidden";
        }
        match self {
            Self::Undecodable(_) => "Undecodable",
            Self::Plugin(e) => e.reason(),
            // The same fault as the sandbox's `InvalidOutput`, so the same word.
            Self::InvalidSelector(_) | Self::InvalidOutput(_) => "InvalidPluginOutput",
            Self::Apply(_) => "ApplyFailed",
            Self::ChildConflict(_) => "ChildConflict",
            Self::Status(_) => "StatusWriteFailed",
            Self::Finalizer { .. } => "FinalizerUpdateFailed",
            Self::Panicked(_) => "InternalError",
            Self::Unreadable { .. } => "Forbidden",
            Self::Access(_) => "AccessReviewFailed",
            Self::HostNamespace(_) => "InvalidPluginOutput",
            Self::CreateBudget { .. } => "CreateBudgetExceeded",
        }
    }

    /// Whether the API server refused a write because the object changed meanwhile.
    pub fn is_conflict(&self) -> bool {
        match self {
            Self::Status(e) | Self::Finalizer { source: e, .. } => {
                matches!(e, kube::Error::Api(s) if s.code == 409)
            }
            _ => false,
        }
    }

    /// Whether the API server could not be reached or could not serve the request (no
    /// answer, 429 or 5xx): a fault of the cluster that ends by itself, so its retries are
    /// capped at [`crate::config::TRANSIENT_RETRY_MAX`] and converge soon after it ends.
    pub fn is_transient(&self) -> bool {
        let transient = |e: &kube::Error| match e {
            kube::Error::Api(s) => s.code == 429 || s.code >= 500,
            kube::Error::Service(_) | kube::Error::HyperError(_) => true,
            _ => false,
        };
        match self {
            Self::Apply(errors) => errors.iter().any(|e| transient(&e.source)),
            Self::Status(e) | Self::Finalizer { source: e, .. } => transient(e),
            Self::Access(AccessError::Review { source, .. }) => transient(source),
            _ => false,
        }
    }

    /// Whether the plugin's identity was refused a write or a read (RBAC to grant it).
    pub fn is_forbidden(&self) -> bool {
        match self {
            Self::Unreadable { .. } => true,
            Self::Apply(errors) => errors.iter().any(|e| is_forbidden(&e.source)),
            Self::Status(e) | Self::Finalizer { source: e, .. } => is_forbidden(e),
            _ => false,
        }
    }

    /// Whether the plugin would fail the same way on the same input: not worth a quick retry.
    pub fn is_guest_fault(&self) -> bool {
        match self {
            Self::Plugin(e) => match e.kind {
                PluginErrorKind::Trap { .. }
                | PluginErrorKind::MemoryCap { .. }
                | PluginErrorKind::InvalidJson { .. }
                | PluginErrorKind::InvalidOutput { .. }
                | PluginErrorKind::ResponseTooLarge { .. }
                | PluginErrorKind::PluginFailed { .. } => true,
                // A busy host can make a call slow; the others are load-time faults or ours.
                PluginErrorKind::DeadlineExceeded { .. }
                | PluginErrorKind::NotAComponent(_)
                | PluginErrorKind::WrongInterface(_)
                | PluginErrorKind::InvalidManifest(_)
                | PluginErrorKind::Internal(_) => false,
            },
            // Only a change of the object (or of the plugin) can help.
            Self::Undecodable(_)
            | Self::InvalidSelector(_)
            | Self::InvalidOutput(_)
            | Self::HostNamespace(_) => true,
            // The cluster's state, not the plugin's: the holder may go away.
            Self::Apply(_)
            | Self::ChildConflict(_)
            | Self::Status(_)
            | Self::Finalizer { .. }
            | Self::Unreadable { .. }
            | Self::Access(_)
            | Self::CreateBudget { .. }
            | Self::Panicked(_) => false,
        }
    }
}

impl From<PluginError> for ReconcileError {
    fn from(e: PluginError) -> Self {
        Self::Plugin(e)
    }
}

/// A failed reconcile of one parent.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    /// The parent.
    pub parent: ObjKey,
    /// What failed (boxed: errors are rare, results are not).
    #[source]
    pub error: Box<ReconcileError>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reconciling {}", self.parent)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sandbox::Call;

    fn plugin(kind: PluginErrorKind) -> ReconcileError {
        ReconcileError::Plugin(PluginError {
            plugin: "p".into(),
            digest: "sha256:00".into(),
            kind,
        })
    }

    #[test]
    fn guest_faults_are_told_from_host_and_api_faults() {
        let trap = plugin(PluginErrorKind::Trap {
            call: Call::Reconcile,
            message: "unreachable".into(),
            guest_message: None,
        });
        assert!(trap.is_guest_fault());
        assert_eq!(trap.reason(), "PluginTrapped");
        let slow = plugin(PluginErrorKind::DeadlineExceeded {
            call: Call::Reconcile,
            limit: Duration::from_secs(1),
        });
        assert!(!slow.is_guest_fault(), "a busy host can cause it");
        let invalid = ReconcileError::InvalidSelector("a selector for v1 Secret".into());
        assert!(invalid.is_guest_fault());
        assert_eq!(invalid.reason(), "InvalidPluginOutput");
        let apply = ReconcileError::Apply(Vec::new());
        assert!(!apply.is_guest_fault());
        assert_eq!(apply.reason(), "ApplyFailed");
    }

    fn refused(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_refused_write_is_forbidden_and_names_the_verb_and_resource() {
        let said = r#"secrets "token" is forbidden: User "system:serviceaccount:w:wasmop-plugin-x" cannot patch resource "secrets" in API group "" in the namespace "ns""#;
        let child = |source| ChildError {
            action: "apply",
            kind: "Secret".into(),
            namespace: "ns".into(),
            name: "token".into(),
            source,
        };
        let apply = ReconcileError::Apply(vec![
            child(refused(500, "etcd is slow")),
            child(refused(403, said)),
        ]);
        assert!(apply.is_forbidden());
        assert_eq!(apply.reason(), "Forbidden");
        assert!(!apply.is_guest_fault(), "an admin may grant it");
        let message = apply.to_string();
        assert!(
            message.ends_with(&format!("apply Secret ns/token: {said} (403)")),
            "{message}"
        );
        let status = ReconcileError::Status(refused(403, said));
        assert_eq!(status.reason(), "Forbidden");
        assert_eq!(
            ReconcileError::Status(refused(409, "conflict")).reason(),
            "StatusWriteFailed"
        );
    }

    #[test]
    fn the_error_names_the_parent_and_keeps_the_cause() {
        let e = Error {
            parent: ObjKey::new(Some("ns"), "cache"),
            error: Box::new(ReconcileError::InvalidSelector("nonsense".into())),
        };
        assert_eq!(e.to_string(), "reconciling ns/cache");
        let source = std::error::Error::source(&e).expect("a source").to_string();
        assert_eq!(source, "related() returned nonsense");
    }
}
