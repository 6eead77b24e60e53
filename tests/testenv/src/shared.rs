//! One cluster per test binary: [`shared`] and [`client`].
//!
//! The first call starts a [`TestEnv`]; every later call, from any test and any runtime,
//! gets the same one. Tests isolate themselves with a namespace each ([`crate::namespace`]).
//!
//! With `WASMOP_TEST_USE_EXISTING=1`, no plane is started: the cluster named by `KUBECONFIG`
//! (its current context) is used instead, e.g. one started by `cargo run -p testenv -- up`.
//!
//! ## Lifetime
//!
//! The plane is started on a thread of its own, so it does not depend on the runtime of the
//! `#[tokio::test]` that happened to call first (each such test has its own runtime, gone
//! when the test ends). Statics are never dropped, so the plane is not stopped in order:
//! when the test binary exits, the kernel kills every component (`PR_SET_PDEATHSIG` with
//! `SIGKILL`, armed on each child), and the next plane started on the machine removes the
//! leftover work dir. This also holds when the test binary panics, aborts or is killed.
//!
//! A start that fails is not retried: every test then fails with the same error, quickly.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::Client;
use tokio::sync::OnceCell;

use crate::error::{Error, Result};
use crate::plane::{TestEnv, client_from_kubeconfig};

/// The environment variable that selects an existing cluster instead of a new plane.
pub const USE_EXISTING_ENV: &str = "WASMOP_TEST_USE_EXISTING";

/// The cluster shared by the tests of one test binary.
#[derive(Debug)]
pub struct SharedCluster {
    kubeconfig_path: PathBuf,
    kubeconfig_yaml: String,
    plane: Option<TestEnv>,
}

impl SharedCluster {
    /// The admin kubeconfig: the plane's, or `KUBECONFIG` for an existing cluster.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// A new client for the calling runtime. Call it in each test: a [`Client`] stops working
    /// once the runtime it was created in is gone.
    pub async fn client(&self) -> Result<Client> {
        let origin = format!("at {}", self.kubeconfig_path.display());
        client_from_kubeconfig(&self.kubeconfig_yaml, &origin).await
    }

    /// The plane this process started, or `None` for an existing cluster.
    pub fn plane(&self) -> Option<&TestEnv> {
        self.plane.as_ref()
    }

    async fn start() -> Result<SharedCluster> {
        if std::env::var(USE_EXISTING_ENV).is_ok_and(|v| v == "1" || v == "true") {
            return Self::existing();
        }
        let plane = start_on_own_thread().await?;
        Ok(SharedCluster {
            kubeconfig_path: plane.kubeconfig_path().to_owned(),
            kubeconfig_yaml: plane.kubeconfig_yaml().to_owned(),
            plane: Some(plane),
        })
    }

    fn existing() -> Result<SharedCluster> {
        let paths = std::env::var_os("KUBECONFIG").ok_or(Error::NoKubeconfig)?;
        // KUBECONFIG may list several files; the first one that exists is used whole.
        let path = std::env::split_paths(&paths)
            .find(|p| p.is_file())
            .ok_or(Error::NoKubeconfig)?;
        let kubeconfig_yaml = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        tracing::info!(kubeconfig = %path.display(), "using an existing cluster");
        Ok(SharedCluster {
            kubeconfig_path: path,
            kubeconfig_yaml,
            plane: None,
        })
    }
}

/// Runs [`TestEnv::start`] on a new thread with its own runtime, so the start completes
/// whatever happens to the caller's runtime. If the caller goes away first, the plane is
/// dropped (stopped) on that thread and the next caller starts another.
async fn start_on_own_thread() -> Result<TestEnv> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("testenv-shared-start".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("creating a runtime to start the shared plane", e))
                .and_then(|runtime| runtime.block_on(TestEnv::start()));
            let _ = tx.send(result);
        })
        .map_err(|e| Error::io("spawning a thread to start the shared plane", e))?;
    rx.await.map_err(|_| {
        Error::io(
            "starting the shared plane",
            std::io::Error::other("the start thread panicked"),
        )
    })?
}

/// The cluster shared by all tests of this test binary, started on first use.
///
/// ```no_run
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// // In a #[tokio::test]:
/// # async fn demo() -> Result<(), testenv::Error> {
/// let client = testenv::client().await?;
/// let ns = testenv::namespace(&client, "config-maps").await?;
/// let config_maps = ns.api::<ConfigMap>();
/// # Ok(()) }
/// ```
pub async fn shared() -> Result<&'static SharedCluster> {
    static SHARED: OnceCell<Result<SharedCluster, Arc<Error>>> = OnceCell::const_new();
    SHARED
        .get_or_init(|| async { SharedCluster::start().await.map_err(Arc::new) })
        .await
        .as_ref()
        .map_err(|e| Error::Shared(Arc::clone(e)))
}

/// A new admin client for the shared cluster, bound to the calling runtime.
pub async fn client() -> Result<Client> {
    shared().await?.client().await
}
