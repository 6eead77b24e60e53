//! `wasmop run`: the host. Loads plugins from ConfigMaps and runs their controllers until
//! SIGTERM or Ctrl-C, then finishes the reconciles in flight, releases its Lease and exits.
//!
//! With `--leader-elect`, replicas compete for a `coordination.k8s.io/v1` Lease (15 s
//! validity, renewed after 10 s, as controller-runtime's defaults) and only the holder
//! reconciles. A leader that loses its Lease exits rather than risk two writers.

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use kube::Client;
use kube::runtime::events::Reporter;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

use crate::cli::{LogFormat, RunArgs};
use crate::controller;
use crate::plugin::Registry;
use crate::sandbox::{Limits, Sandbox, SandboxConfig};
use crate::telemetry::server;

/// Where a pod finds its own namespace.
const POD_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The plugin namespace outside a cluster.
pub const DEFAULT_NAMESPACE: &str = "wasmop-system";

/// Runs the host.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

fn namespace(arg: Option<String>) -> String {
    arg.or_else(|| {
        std::fs::read_to_string(POD_NAMESPACE_FILE)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string())
}

async fn serve(args: RunArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the cluster (KUBECONFIG or in-cluster config)")?;
    let namespace = namespace(args.namespace.clone());
    let sandbox = Sandbox::new(SandboxConfig::default()).context("starting the sandbox")?;
    let config = controller::Config {
        concurrency: args.concurrency.max(1),
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        debounce: Duration::from_millis(args.debounce_ms),
        ..Default::default()
    };
    let identity = std::env::var("POD_NAME").ok().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let reporter = Reporter {
        controller: "wasmop".into(),
        instance: Some(identity.clone()),
    };
    let registry = Registry::new(
        client.clone(),
        namespace.clone(),
        args.watch_namespace.clone(),
        sandbox,
        Limits::from(&args.limits),
        config,
        reporter,
    );
    tracing::info!(version = env!("CARGO_PKG_VERSION"), %namespace, "wasmop host starting");

    let (ready_tx, ready_rx) = watch::channel(false);
    let server = tokio::spawn(server::serve(args.probe_addr, args.metrics_addr, ready_rx));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        stop_tx.send_replace(true);
    });
    let stopped = || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let run = async {
        if !args.leader_elect {
            forward_readiness(registry.ready(), ready_tx);
            registry.run(stopped()).await;
            return Ok(());
        }
        let lease = LeaseManagerBuilder::new(client, &args.lease_name)
            .with_namespace(&namespace)
            .with_identity(&identity)
            .with_duration(args.lease_duration_seconds)
            .with_grace(args.lease_renew_grace_seconds)
            .build()
            .await
            .context("setting up leader election")?;
        // A standby is ready: it can take over at once.
        ready_tx.send_replace(true);
        tracing::info!(lease = %args.lease_name, %identity, "waiting to become the leader");
        loop {
            tokio::select! {
                held = lease.changed() => if held.context("acquiring the leader Lease")? { break },
                _ = stopped() => return Ok(()),
            }
        }
        tracing::info!(lease = %args.lease_name, %identity, "became the leader; reconciling");
        forward_readiness(registry.ready(), ready_tx);
        let lost = AtomicBool::new(false);
        let until = async {
            tokio::select! {
                _ = stopped() => {},
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
                args.lease_name
            );
        }
        lease
            .release()
            .await
            .context("releasing the leader Lease")?;
        tracing::info!("released the leader Lease");
        Ok(())
    };
    tokio::select! {
        result = run => result?,
        served = server => served.context("HTTP server task")?.context("serving probes and metrics")?,
    }
    tracing::info!("wasmop host stopped");
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

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; finishing reconciles in flight"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; finishing reconciles in flight"),
    }
}
