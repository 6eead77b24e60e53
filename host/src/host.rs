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
use std::sync::Arc;

use anyhow::Context;
use kube::Client;
use kube::runtime::events::Reporter;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::client::Fence;
use crate::config;
use crate::controller::supervisor::Setup;
use crate::controller::{self, ShardedSupervisor, Supervisor};
use crate::plugin::artifacts::ClusterArtifacts;
use crate::plugin::oci::{ModuleCache, Policy};
use crate::plugin::registry::Parts;
use crate::plugin::rollout::Board;
use crate::plugin::{Loader, Registry, Status};
use crate::sandbox::{Limits, Sandbox, SandboxConfig};
use crate::shard::keeper::{Keeper, Sharding};
use crate::telemetry::health::Health;
use crate::telemetry::server;
use crate::watch::Hub;

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
    /// Share compiled plugins with the other replicas through the cluster
    /// ([`crate::plugin::artifacts`]).
    pub share_artifacts: bool,
    /// Kinds that may be one plugin's child kind and another's parent kind (`--allow-chain`).
    pub chains: Vec<wasmop_contract::KindRef>,
    /// Where `/healthz` and `/readyz` are served (port 0 picks a free one; see
    /// [`Host::probe_addr`]).
    pub probe_addr: SocketAddr,
    /// Where `/metrics` is served; may equal `probe_addr`.
    pub metrics_addr: SocketAddr,
    /// Reconcile only while holding a Lease; `None` reconciles at once.
    pub leader_election: Option<LeaderElection>,
    /// Share the parents with the other replicas, by namespace, a Lease per shard
    /// ([`crate::shard`]); not with `leader_election`.
    pub sharding: Option<Sharding>,
    /// This replica's name, for the Lease and as the Events' reporting instance.
    pub identity: String,
    /// Which registry plugins must be signed, by whom (`--signature-policy`).
    pub signature_policy: Arc<Policy>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            namespace: config::NAMESPACE.into(),
            watch_namespace: None,
            limits: Limits::default(),
            controller: controller::Config::default(),
            sandbox: SandboxConfig::default(),
            share_artifacts: true,
            chains: Vec::new(),
            probe_addr: config::PROBE_ADDR.parse().expect("a socket address"),
            metrics_addr: config::METRICS_ADDR.parse().expect("a socket address"),
            leader_election: None,
            sharding: None,
            identity: default_identity(),
            signature_policy: Arc::default(),
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
    // Unfenced: for the lease manager only.
    client: Client,
    fence: Fence,
    health: Health,
    config: HostConfig,
    registry: Registry,
    probes: TcpListener,
    // None when metrics share the probes' address.
    metrics: Option<TcpListener>,
    // Takes and holds this replica's shards, when sharded.
    keeper: Option<Keeper>,
}

impl Host {
    /// Starts the sandbox and binds the HTTP endpoints. Nothing is read from the cluster yet.
    ///
    /// Every request goes through `client` (give it timeouts: [`crate::client::connect`]);
    /// with leader election, every write also passes the leader's [`Fence`].
    pub async fn new(client: Client, config: HostConfig) -> anyhow::Result<Host> {
        let sandbox = Sandbox::new(config.sandbox.clone()).context("starting the sandbox")?;
        if config.share_artifacts {
            // Unfenced: a standby shares what it compiled too, and an artifact is no reconcile.
            sandbox.share(std::sync::Arc::new(ClusterArtifacts::new(
                client.clone(),
                &config.namespace,
            )));
        }
        let fence = match &config.leader_election {
            Some(election) => {
                // The fence shuts 1 s before the Lease expires, so the renewal must come earlier.
                anyhow::ensure!(
                    election.renew_grace_seconds >= 2
                        && election.renew_grace_seconds < election.duration_seconds,
                    "the leader Lease is renewed {}s before it expires, of {}s; that must be at least 2s and less than the duration",
                    election.renew_grace_seconds,
                    election.duration_seconds
                );
                Fence::new(
                    &election.lease_name,
                    &config.identity,
                    std::time::Duration::from_secs(election.duration_seconds),
                )
            }
            None => Fence::unfenced(),
        };
        anyhow::ensure!(
            config.sharding.is_none() || config.leader_election.is_none(),
            "sharding and leader election are exclusive: every sharded replica reconciles the shards it holds"
        );
        let health = Health::default();
        let guarded = fence.guard(&client);
        let reporter = Reporter {
            controller: "wasmop".into(),
            instance: Some(config.identity.clone()),
        };
        // Unguarded: the loader only reads, and each controller guards its plugin's writes
        // with its own fence.
        let loader = Loader::new(
            client.clone(),
            config.namespace.clone(),
            sandbox,
            config.watch_namespace.clone(),
            config.controller.resync,
            config.signature_policy.clone(),
            ModuleCache::new(
                config.sandbox.cache_dir.as_deref(),
                config::MODULE_CACHE_MIB << 20,
            ),
        );
        let hub = Hub::new(
            client.clone(),
            config.watch_namespace.clone(),
            health.clone(),
        );
        let board = Board::default();
        let setup = Setup {
            client: client.clone(),
            namespace: config.namespace.clone(),
            hub,
            reporter: reporter.clone(),
            config: config.controller.clone(),
            board: board.clone(),
        };
        let (supervisor, keeper): (Box<dyn crate::plugin::Supervise>, _) = match &config.sharding {
            None => {
                let setup = Setup {
                    client: guarded.clone(),
                    ..setup
                };
                (Box::new(Supervisor::new(setup, fence.clone())), None)
            }
            Some(sharding) => {
                anyhow::ensure!(
                    (1..=crate::shard::MAX_SHARDS).contains(&sharding.shards),
                    "--shards {} is out of range: 1 to {}",
                    sharding.shards,
                    crate::shard::MAX_SHARDS
                );
                anyhow::ensure!(
                    sharding.duration >= crate::shard::keeper::MIN_DURATION,
                    "shard Leases of {}s are too short: at least {}s, so that a renewal every {}s survives a late tick and a retry",
                    sharding.duration.as_secs(),
                    crate::shard::keeper::MIN_DURATION.as_secs(),
                    crate::shard::keeper::TICK.as_secs()
                );
                let (keeper, held) = Keeper::new(
                    client.clone(),
                    &config.namespace,
                    &config.identity,
                    sharding.clone(),
                );
                let supervisor = ShardedSupervisor::new(setup, sharding.shards, held);
                (Box::new(supervisor), Some(keeper))
            }
        };
        let registry = Registry::new(Parts {
            client: guarded,
            namespace: config.namespace.clone(),
            defaults: config.limits,
            loader,
            supervisor,
            board,
            reporter,
            health: health.clone(),
        })
        .with_chains(config.chains.clone());
        let probes = bind(config.probe_addr).await?;
        let metrics = if config.metrics_addr == config.probe_addr {
            None
        } else {
            Some(bind(config.metrics_addr).await?)
        };
        Ok(Host {
            client,
            fence,
            health,
            config,
            registry,
            probes,
            metrics,
            keeper,
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
            fence,
            health,
            config,
            registry,
            probes,
            metrics,
            keeper,
        } = self;
        tracing::info!(version = env!("CARGO_PKG_VERSION"), namespace = %config.namespace, "wasmop host starting");
        let (ready_tx, ready_rx) = watch::channel(false);
        let server = tokio::spawn(server::serve(probes, metrics, ready_rx, health));
        let (stop_tx, stop_rx) = watch::channel(false);
        let overdue_rx = stop_rx.clone();
        tokio::spawn(async move {
            shutdown.await;
            stop_tx.send_replace(true);
        });
        let reconcile = async {
            match (&config.leader_election, keeper) {
                (None, Some(keeper)) => {
                    forward_readiness(registry.ready(), ready_tx);
                    // The shards are given back only once their controllers have stopped.
                    let (left_tx, left_rx) = tokio::sync::oneshot::channel::<()>();
                    let keeping = tokio::spawn(keeper.run(async move {
                        let _ = left_rx.await;
                    }));
                    registry.run(stopped(stop_rx)).await;
                    let _ = left_tx.send(());
                    keeping.await.context("the shard keeper task")?;
                    Ok(())
                }
                (None, None) => {
                    forward_readiness(registry.ready(), ready_tx);
                    registry.run(stopped(stop_rx)).await;
                    Ok(())
                }
                (Some(election), _) => {
                    let leader = Leader {
                        client,
                        fence,
                        config: &config,
                        election,
                    };
                    leader.lead(registry, ready_tx, stop_rx).await
                }
            }
        };
        // Calls stuck on a dead connection must not hold up a SIGTERM past the pod's grace.
        let overdue = async {
            stopped(overdue_rx).await;
            tokio::time::sleep(config::SHUTDOWN_GRACE).await;
        };
        tokio::select! {
            result = reconcile => result?,
            served = server => served.context("HTTP server task")?.context("serving probes and metrics")?,
            _ = overdue => tracing::warn!(
                "still stopping {}s after the shutdown signal; exiting without the reconciles in flight",
                config::SHUTDOWN_GRACE.as_secs()
            ),
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

/// What leading takes: the Lease's client (unfenced, observed by the fence) and settings.
struct Leader<'a> {
    client: Client,
    fence: Fence,
    config: &'a HostConfig,
    election: &'a LeaderElection,
}

impl Leader<'_> {
    /// Waits for the Lease, then runs the registry while holding it. A leader that loses its
    /// Lease, or whose last renewal is too old, stops at once: the fence refuses its writes
    /// from that moment, no reconcile starts, and after [`config::LOST_LEASE_GRACE`] for those
    /// in flight it returns an error, so that only one host reconciles.
    async fn lead(
        self,
        registry: Registry,
        ready_tx: watch::Sender<bool>,
        stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let Leader {
            client,
            fence,
            config,
            election,
        } = self;
        let lease = LeaseManagerBuilder::new(fence.observe(&client), &election.lease_name)
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
        fence.lead();
        // The Lease is held and renewed by a task of its own, so that nothing the registry
        // awaits can delay a renewal or the news of its loss.
        let lease = std::sync::Arc::new(lease);
        let (lost_tx, mut lost_rx) = watch::channel(None::<String>);
        let holder = tokio::spawn({
            let (lease, fence) = (lease.clone(), fence.clone());
            async move {
                let why = held(&lease, &fence).await;
                fence.lose();
                let _ = lost_tx.send(Some(why));
            }
        });
        let mut lost = lost_rx.clone();
        // A Lease an earlier run of this pod held may still await its first renewal.
        while !fence.is_open() && lost.borrow().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        tracing::info!(lease = %election.lease_name, identity = %config.identity, "became the leader; reconciling");
        forward_readiness(registry.ready(), ready_tx);
        let until = async {
            tokio::select! {
                _ = stopped(stop) => {},
                _ = lost.wait_for(Option::is_some) => {},
            }
        };
        let grace = async {
            let _ = lost_rx.wait_for(Option::is_some).await;
            tokio::time::sleep(config::LOST_LEASE_GRACE).await;
        };
        tokio::select! {
            _ = registry.run(until) => {},
            _ = grace => tracing::warn!("reconciles still in flight {}s after the Lease was lost; exiting without them", config::LOST_LEASE_GRACE.as_secs()),
        }
        let why = lost_rx.borrow().clone();
        if let Some(why) = why {
            // Not released: another host may hold it by now.
            anyhow::bail!(
                "lost the leader Lease {}: {why}; exiting so that only one host reconciles",
                election.lease_name
            );
        }
        holder.abort();
        lease
            .release()
            .await
            .context("releasing the leader Lease")?;
        tracing::info!("released the leader Lease");
        Ok(())
    }
}

/// Renews the Lease and resolves, saying why, once it is no longer held: another holder took
/// it, renewing it failed, or the fence's deadline passed before a renewal succeeded. A Lease
/// this identity already held (an earlier run of the same pod) may need its first renewal
/// still: that gets the Lease's validity to arrive.
async fn held(lease: &kube_lease_manager::LeaseManager, fence: &Fence) -> String {
    let changes = async {
        loop {
            match lease.changed().await {
                Ok(true) => continue,
                Ok(false) => return "another host holds it now".to_string(),
                Err(e) => return format!("renewing it failed: {e}"),
            }
        }
    };
    let expiry = async {
        let first = tokio::time::Instant::now() + fence.valid_for();
        while !fence.is_open() {
            if tokio::time::Instant::now() >= first {
                return format!(
                    "no renewal of it succeeded within {}s of taking it",
                    fence.valid_for().as_secs()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        loop {
            match fence.deadline() {
                Some(at) if at > tokio::time::Instant::now() => tokio::time::sleep_until(at).await,
                _ => return "its last renewal is older than the Lease's duration".to_string(),
            }
        }
    };
    tokio::select! {
        why = changes => why,
        why = expiry => why,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shard_leases_shorter_than_three_ticks_are_refused() {
        // Refused before any request: nothing listens there.
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .expect("a client");
        let config = HostConfig {
            sharding: Some(Sharding {
                shards: 3,
                lease_prefix: "wasmop-shard".into(),
                duration: std::time::Duration::from_secs(5),
            }),
            ..HostConfig::default()
        };
        let error = Host::new(client, config).await.err().expect("refused");
        assert!(
            error
                .to_string()
                .contains("Leases of 5s are too short: at least 6s"),
            "{error:#}"
        );
    }
}
