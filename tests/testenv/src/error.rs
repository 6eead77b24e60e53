//! The one error type of this crate.
//!
//! Every failure a test can hit while getting a control plane is a variant here, so a harness
//! can tell "Go is missing" from "the apiserver crashed" without parsing text. `Debug` prints
//! the message and its causes rather than the struct, because tests `unwrap()` these errors
//! and a component's log tail is unreadable with escaped newlines.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::wait::Timeout;

/// Everything that can go wrong while building, starting, using or stopping a control plane.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system or process operation failed.
    #[error("{context}")]
    Io {
        /// What was being done, with the path involved.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// `go` is not on `PATH`, and the binaries are not cached yet.
    #[error(
        "the Go toolchain (`go`, 1.26 or newer) was not found on PATH; it is needed once per \
         machine to build the control-plane binaries into {dir}, or point \
         WASMOP_TESTENV_BIN_DIR at a directory holding `controlplane` and `kwok`",
        dir = dir.display()
    )]
    GoNotFound {
        /// Where the binaries would have been built.
        dir: PathBuf,
    },

    /// A `go build` or `go install` exited unsuccessfully.
    #[error("building {what} failed ({status}); last lines of {log}:\n{tail}", log = log.display())]
    Build {
        /// Which binary was being built.
        what: &'static str,
        /// The exit status of `go`.
        status: std::process::ExitStatus,
        /// The full build output.
        log: PathBuf,
        /// The last lines of `log`.
        tail: String,
    },

    /// Generating the plane's certificates or keys failed.
    #[error("generating certificates")]
    Certs(#[from] rcgen::Error),

    /// A component exited, or did not become ready in time.
    #[error("{component} {problem}; last lines of {log}:\n{tail}", log = log.display())]
    Component {
        /// The component's name, e.g. `kube-apiserver`.
        component: &'static str,
        /// What went wrong, e.g. "exited with status 1 during start-up".
        problem: String,
        /// The component's log file (stdout and stderr).
        log: PathBuf,
        /// The last lines of `log`.
        tail: String,
    },

    /// A kubeconfig could not be read or turned into a client configuration.
    #[error("kubeconfig {origin}")]
    Kubeconfig {
        /// Where the kubeconfig came from.
        origin: String,
        /// The underlying error.
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// A Kubernetes API call failed.
    #[error("{context}")]
    Kube {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },

    /// An object to apply is not a Kubernetes object.
    #[error("not a Kubernetes object: {0}")]
    NotAnObject(String),

    /// A wait helper gave up.
    #[error(transparent)]
    Timeout(#[from] Timeout),

    /// The process-wide plane of [`crate::shared`] failed to start; every later call returns
    /// the same error instead of trying again.
    #[error("the shared control plane is unavailable")]
    Shared(#[source] Arc<Error>),

    /// `WASMOP_TEST_USE_EXISTING=1` was set but `KUBECONFIG` names no file.
    #[error(
        "WASMOP_TEST_USE_EXISTING=1 needs KUBECONFIG to name the kubeconfig of the cluster to use"
    )]
    NoKubeconfig,
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            context: context.into(),
            source,
        }
    }

    /// Whether a component failed because a port it was given got taken in the meantime, in
    /// which case starting again with new ports is likely to work.
    pub(crate) fn is_port_conflict(&self) -> bool {
        matches!(self, Error::Component { tail, .. } if tail.contains("address already in use"))
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, "\ncaused by: {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
