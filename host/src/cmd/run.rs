//! `wasmop run`: the host ([`crate::Host`]) from the command line, until SIGTERM or Ctrl-C;
//! then it finishes the reconciles in flight, releases its Lease and exits.
//!
//! With `--leader-elect`, replicas compete for a `coordination.k8s.io/v1` Lease (15 s
//! validity, renewed after 10 s, as controller-runtime's defaults) and only the holder
//! reconciles. A leader that loses its Lease exits rather than risk two writers.
//!
//! With `--shards N`, every replica reconciles: namespaces are cut into N shards, each held by
//! one replica through a Lease of its own ([`crate::shard`]).

use std::time::Duration;

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use crate::cli::{LogFormat, RunArgs};
use crate::sandbox::{Compiler, Limits, SandboxConfig};
use crate::{Host, HostConfig, LeaderElection, Sharding, config, controller};

/// Where a pod finds its own namespace.
const POD_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Runs the host.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::memory::tune_allocator();
    init_logs(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let policy = match &args.signature_policy {
            Some(path) => crate::plugin::oci::Policy::load(path)?,
            None => Default::default(),
        };
        let client = crate::client::connect().await?;
        let config = HostConfig {
            signature_policy: std::sync::Arc::new(policy),
            ..host_config(args)
        };
        let host = Host::new(client, config).await?;
        tokio::spawn(release_code_pages(host.ready()));
        host.run(shutdown_signal()).await
    })
}

/// The host's configuration from the command line.
pub fn host_config(args: RunArgs) -> HostConfig {
    HostConfig {
        namespace: namespace(args.namespace),
        watch_namespace: args.watch_namespace,
        limits: Limits::from(&args.limits),
        controller: controller::Config {
            concurrency: args.concurrency.max(1),
            resync: Duration::from_secs(args.resync_seconds.max(1)),
            debounce: Duration::from_millis(args.debounce_ms),
            creates_per_minute: args.creates_per_minute,
            ..Default::default()
        },
        sandbox: SandboxConfig {
            memory_budget: args.sandbox_memory_mib.saturating_mul(1 << 20),
            // Compile in a child of this very binary, if it can be found.
            compiler: std::env::current_exe()
                .map(Compiler::Subprocess)
                .unwrap_or_default(),
            ..SandboxConfig::default()
        },
        share_artifacts: !args.no_shared_artifacts,
        chains: args
            .allow_chain
            .iter()
            .map(|k| crate::plugin::registry::parse_chain(k))
            .collect(),
        probe_addr: args.probe_addr,
        metrics_addr: args.metrics_addr,
        sharding: args.shards.map(|shards| Sharding {
            shards,
            lease_prefix: args.shard_lease_prefix.clone(),
            duration: Duration::from_secs(args.lease_duration_seconds),
        }),
        leader_election: args.leader_elect.then_some(LeaderElection {
            lease_name: args.lease_name,
            duration_seconds: args.lease_duration_seconds,
            renew_grace_seconds: args.lease_renew_grace_seconds,
        }),
        ..HostConfig::default()
    }
}

/// Once the host is ready (or after a minute, for a host that stays unready) and then now and
/// then, unmaps the code it no longer runs: start-up's, the first lists', a plugin load's
/// ([`crate::memory::release_code_pages`]).
async fn release_code_pages(mut ready: tokio::sync::watch::Receiver<bool>) {
    let first = tokio::time::timeout(Duration::from_secs(60), ready.wait_for(|ready| *ready));
    if let Ok(Err(_closed)) = first.await {
        return;
    }
    loop {
        let started = std::time::Instant::now();
        if let Ok(bytes) = tokio::task::spawn_blocking(crate::memory::release_code_pages).await {
            tracing::debug!(
                mib = bytes as f64 / f64::from(1 << 20),
                took = ?started.elapsed(),
                "released code pages"
            );
        }
        tokio::time::sleep(config::CODE_PAGES_RELEASE).await;
    }
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
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

/// `--namespace`, else the pod's namespace, else [`config::NAMESPACE`].
fn namespace(arg: Option<String>) -> String {
    arg.or_else(|| {
        std::fs::read_to_string(POD_NAMESPACE_FILE)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .unwrap_or_else(|| config::NAMESPACE.to_string())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received; finishing reconciles in flight"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; finishing reconciles in flight"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> RunArgs {
        match Cli::parse_from(["wasmop", "run"].iter().chain(args)).command {
            Command::Run(args) => args,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn command_line_defaults_are_the_library_defaults() {
        let config = host_config(parse(&["--namespace", "ns"]));
        let defaults = HostConfig::default();
        assert_eq!(config.namespace, "ns");
        assert_eq!(config.limits, defaults.limits);
        assert_eq!(
            config.controller.concurrency,
            defaults.controller.concurrency
        );
        assert_eq!(config.controller.resync, defaults.controller.resync);
        assert_eq!(config.controller.debounce, defaults.controller.debounce);
        assert_eq!(config.probe_addr, defaults.probe_addr);
        assert_eq!(config.metrics_addr, defaults.metrics_addr);
        assert_eq!(config.sandbox.memory_budget, defaults.sandbox.memory_budget);
        assert!(config.leader_election.is_none());
        assert!(config.sharding.is_none());
    }

    #[test]
    fn shards_reach_the_config() {
        let sharding = host_config(parse(&["--shards", "6", "--lease-duration-seconds", "9"]))
            .sharding
            .expect("sharding");
        assert_eq!(sharding.shards, 6);
        assert_eq!(sharding.lease_prefix, config::SHARD_LEASE_PREFIX);
        assert_eq!(sharding.duration, Duration::from_secs(9));
        for bad in [&["--shards", "0"][..], &["--shards", "4", "--leader-elect"]] {
            assert!(
                Cli::try_parse_from(["wasmop", "run"].iter().chain(bad)).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn flags_reach_the_config() {
        let config = host_config(parse(&[
            "--deadline-ms",
            "250",
            "--memory-mib",
            "16",
            "--concurrency",
            "0",
            "--leader-elect",
            "--lease-name",
            "l",
        ]));
        assert_eq!(
            config.limits,
            Limits::new(250, 16, config::MAX_RESPONSE_KIB)
        );
        assert_eq!(config.controller.concurrency, 1, "at least one");
        let election = config.leader_election.expect("leader election");
        assert_eq!(election.lease_name, "l");
        assert_eq!(
            election.duration_seconds,
            LeaderElection::default().duration_seconds
        );
    }
}
