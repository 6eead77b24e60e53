//! `wasmop run`: the host. Loads plugins from ConfigMaps and runs their controllers until
//! SIGTERM or Ctrl-C, then finishes the reconciles in flight and exits.

use std::time::Duration;

use anyhow::Context;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tracing_subscriber::EnvFilter;

use crate::cli::{LogFormat, RunArgs};
use crate::controller;
use crate::plugin::Registry;
use crate::sandbox::{Limits, Sandbox, SandboxConfig};

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
        ..Default::default()
    };
    let reporter = Reporter {
        controller: "wasmop".into(),
        instance: std::env::var("POD_NAME").ok().or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        }),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let registry = Registry::new(
        client,
        namespace,
        args.watch_namespace.clone(),
        sandbox,
        Limits::from(&args.limits),
        config,
        recorder,
    );
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "wasmop host starting");
    registry.run(shutdown_signal()).await;
    tracing::info!("wasmop host stopped");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; shutting down"),
    }
}
