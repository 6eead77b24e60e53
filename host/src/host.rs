//! The host as a library: [`Host::new`] wires the sandbox, the plugin registry, leader
//! election and the HTTP endpoints from a [`HostConfig`]; [`Host::run`] serves until the
//! shutdown future resolves, then finishes the reconciles in flight and releases its Lease.
//!
//! `wasmop run` is this plus signal handling; tests start the same host in-process.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use wasmop::{Host, HostConfig};
//!
//! let client = kube::Client::try_default().await?;
//! let config = HostConfig {
//!     namespace: "wasmop-system".into(),
//!     probe_addr: "127.0.0.1:0".parse()?,
//!     metrics_addr: "127.0.0.1:0".parse()?,
//!     ..HostConfig::default()
//! };
//! let host = Host::new(client, config).await?;
//! println!("probes on {}", host.probe_addr());
//! host.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use kube::Client;
use kube::runtime::events::Reporter;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config;
use crate::controller::{self, Supervisor};
use crate::plugin::{Loader, Registry, Status};
use crate::sandbox::{Limits, Sandbox, SandboxConfig};
use crate::telemetry::server;

/// Everything a [`Host`] is started with. `Default` holds the defaults of [`crate::config`].
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Namespace of the plugin ConfigMaps, the Lease and the host's own Events.
    pub namespace: String,
    /// Reconcile parents in this namespace only; `None` watches every namespace.
    pub watch_namespace: Option<String>,
    /// Sandbox limits of plugins whose ConfigMap sets none.
    pub limits: Limits,
    /// How controllers schedule reconciles.
    pub controller: controller::Config,
    /// The sandbox's slots and compile cache.
    pub sandbox: SandboxConfig,
    /// Where `/healthz` and `/readyz` are served (port 0 picks a free one; see
    /// [`Host::probe_addr`]).
    pub probe_addr: SocketAddr,
    /// Where `/metrics` is served; may equal `probe_addr`.
    pub metrics_addr: SocketAddr,
    /// Reconcile only while holding a Lease; `None` reconciles at once.
    pub leader_election: Option<LeaderElection>,
    /// This replica's name, for the Lease and as the Events' reporting instance.
    pub identity: String,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            namespace: config::NAMESPACE.into(),
            watch_namespace: None,
            limits: Limits::default(),
            controller: controller::Config::default(),
            sandbox: SandboxConfig::default(),
            probe_addr: config::PROBE_ADDR.parse().expect("a socket address"),
            metrics_addr: config::METRICS_ADDR.parse().expect("a socket address"),
            leader_election: None,
            identity: default_identity(),
        }
    }
}

/// The Lease replicas compete for; only its holder reconciles.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// The Lease's name, in [`HostConfig::namespace`].
    pub lease_name: String,
    /// How long a Lease is valid without renewal, in seconds.
    pub duration_seconds: u64,
    /// How long before it expires the holder renews it, in seconds.
    pub renew_grace_seconds: u64,
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            lease_name: config::LEASE_NAME.into(),
            duration_seconds: config::LEASE_DURATION_SECONDS,
            renew_grace_seconds: config::LEASE_RENEW_GRACE_SECONDS,
        }
    }
}

/// `$POD_NAME`, else `<hostname>-<pid>`.
fn default_identity() -> String {
    std::env::var("POD_NAME").ok().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}

/// A host, wired and listening, not yet reconciling.
pub struct Host {
    client: Client,
    config: HostConfig,
    registry: Registry,
    probes: TcpListener,
    // None when metrics share the probes' address.
    metrics: Option<TcpListener>,
}

impl Host {
    /// Starts the sandbox and binds the HTTP endpoints. Nothing is read from the cluster yet.
    pub async fn new(client: Client, config: HostConfig) -> anyhow::Result<Host> {
        let sandbox = Sandbox::new(config.sandbox.clone()).context("starting the sandbox")?;
        let reporter = Reporter {
            controller: "wasmop".into(),
            instance: Some(config.identity.clone()),
        };
        let loader = Loader::new(
            client.clone(),
            config.namespace.clone(),
            sandbox,
            config.watch_namespace.clone(),
            config.controller.resync,
        );
        let supervisor = Supervisor::new(
            client.clone(),
            &config.namespace,
            config.watch_namespace.clone(),
            reporter.clone(),
            config.controller.clone(),
        );
        let registry = Registry::new(
            client.clone(),
            config.namespace.clone(),
            config.limits,
            loader,
            Box::new(supervisor),
            reporter,
        );
        let probes = bind(config.probe_addr).await?;
        let metrics = if config.metrics_addr == config.probe_addr {
            None
        } else {
            Some(bind(config.metrics_addr).await?)
        };
        Ok(Host {
            client,
            config,
            registry,
            probes,
            metrics,
        })
    }

    /// The address `/healthz` and `/readyz` are served on.
    pub fn probe_addr(&self) -> SocketAddr {
        self.probes.local_addr().unwrap_or(self.config.probe_addr)
    }

    /// The address `/metrics` is served on.
    pub fn metrics_addr(&self) -> SocketAddr {
        match &self.metrics {
            Some(l) => l.local_addr().unwrap_or(self.config.metrics_addr),
            None => self.probe_addr(),
        }
    }

    /// Whether every plugin has loaded and every controller's caches are synced, as the
    /// registry sees it (a standby's `/readyz` is ready regardless).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.registry.ready()
    }

    /// The state of every plugin, updated as it changes.
    pub fn plugins(&self) -> watch::Receiver<Vec<Status>> {
        self.registry.status()
    }

    /// Serves until `shutdown` resolves (or the Lease is lost, which is an error), then stops
    /// every controller after its reconciles in flight and releases the Lease.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Host {
            client,
            config,
            registry,
            probes,
            metrics,
        } = self;
        tracing::info!(version = env!("CARGO_PKG_VERSION"), namespace = %config.namespace, "wasmop host starting");
        let (ready_tx, ready_rx) = watch::channel(false);
        let server = tokio::spawn(server::serve(probes, metrics, ready_rx));
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            stop_tx.send_replace(true);
        });
        let reconcile = async {
            match &config.leader_election {
                None => {
                    forward_readiness(registry.ready(), ready_tx);
                    registry.run(stopped(stop_rx)).await;
                    Ok(())
                }
                Some(election) => {
                    lead(client, &config, election, registry, ready_tx, stop_rx).await
                }
            }
        };
        tokio::select! {
            result = reconcile => result?,
            served = server => served.context("HTTP server task")?.context("serving probes and metrics")?,
        }
        tracing::info!("wasmop host stopped");
        Ok(())
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))
}

/// Waits for the Lease, then runs the registry while holding it. A leader that loses its
/// Lease returns an error, so that only one host reconciles.
async fn lead(
    client: Client,
    config: &HostConfig,
    election: &LeaderElection,
    registry: Registry,
    ready_tx: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let lease = LeaseManagerBuilder::new(client, &election.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(election.duration_seconds)
        .with_grace(election.renew_grace_seconds)
        .build()
        .await
        .context("setting up leader election")?;
    // A standby is ready: it can take over at once.
    ready_tx.send_replace(true);
    tracing::info!(lease = %election.lease_name, identity = %config.identity, "waiting to become the leader");
    let mut stopped_waiting = std::pin::pin!(stopped(stop.clone()));
    loop {
        tokio::select! {
            held = lease.changed() => if held.context("acquiring the leader Lease")? { break },
            _ = &mut stopped_waiting => return Ok(()),
        }
    }
    tracing::info!(lease = %election.lease_name, identity = %config.identity, "became the leader; reconciling");
    forward_readiness(registry.ready(), ready_tx);
    let lost = AtomicBool::new(false);
    let until = async {
        tokio::select! {
            _ = stopped(stop) => {},
            _ = async {
                while let Ok(true) = lease.changed().await {}
                lost.store(true, Ordering::SeqCst);
            } => {},
        }
    };
    registry.run(until).await;
    if lost.load(Ordering::SeqCst) {
        anyhow::bail!(
            "lost the leader Lease {}; exiting so that only one host reconciles",
            election.lease_name
        );
    }
    lease
        .release()
        .await
        .context("releasing the leader Lease")?;
    tracing::info!("released the leader Lease");
    Ok(())
}

fn forward_readiness(mut from: watch::Receiver<bool>, to: watch::Sender<bool>) {
    tokio::spawn(async move {
        loop {
            to.send_replace(*from.borrow_and_update());
            if from.changed().await.is_err() {
                return;
            }
        }
    });
}
