//! `testenv`: start a local control plane from a shell, or just build its binaries.
//!
//! ```text
//! cargo run -p testenv -- up      # prints KUBECONFIG=<path> once the node is Ready; Ctrl-C stops
//! cargo run -p testenv -- up --feature-gates ShardedListAndWatch=true   # with sharded watches
//! cargo run -p testenv -- build   # builds (or finds cached) controlplane and kwok
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

use testenv::TestEnv;

/// A local Kubernetes control plane (etcd, kube-apiserver, controller-manager, scheduler,
/// kwok) for wasmop's tests.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a control plane in the foreground. Writes the admin kubeconfig to
    /// `<target dir>/testenv/kubeconfig` (`kubeconfig-<pid>` while another plane of this
    /// checkout holds that one), prints `KUBECONFIG=<path>` on stdout once the node is Ready,
    /// and stops everything on Ctrl-C or SIGTERM.
    Up {
        /// kube-apiserver feature gates, e.g. `ShardedListAndWatch=true` (what
        /// `wasmop run --shards` uses for server-side sharded watches).
        #[arg(long, value_delimiter = ',')]
        feature_gates: Vec<String>,
    },
    /// Build the binaries (or find them in the cache) and print their directory.
    Build,
    /// Print the path of one binary (`controlplane`, `kwok` or `kubectl`), building first if
    /// needed.
    Which {
        /// The binary.
        #[arg(value_parser = ["controlplane", "kwok", "kubectl"])]
        name: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "testenv=info".into()),
        )
        .init();
    match Cli::parse().command {
        Cmd::Up { feature_gates } => up(&feature_gates).await,
        Cmd::Build => {
            let bins = testenv::binaries::ensure().await?;
            println!(
                "{}",
                bins.controlplane
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .display()
            );
            Ok(())
        }
        Cmd::Which { name } => {
            let bins = testenv::binaries::ensure().await?;
            let path = match name.as_str() {
                "controlplane" => bins.controlplane,
                "kwok" => bins.kwok,
                _ => bins.kubectl,
            };
            println!("{}", path.display());
            Ok(())
        }
    }
}

async fn up(feature_gates: &[String]) -> anyhow::Result<()> {
    let gates: Vec<&str> = feature_gates.iter().map(String::as_str).collect();
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;

    // A signal during start-up drops the start, which stops what had started.
    let env = tokio::select! {
        env = TestEnv::start_with_feature_gates(&gates) => env?,
        _ = terminate.recv() => return Ok(()),
        _ = interrupt.recv() => return Ok(()),
    };

    let kubeconfig = claim_kubeconfig(&target_dir().join("testenv"))?;
    write_atomically(&kubeconfig, env.kubeconfig_yaml())?;
    println!("KUBECONFIG={}", kubeconfig.display());
    std::io::stdout().flush()?;

    // Watch the components too: a crash should end `up` loudly, not leave a dead plane.
    let mut health = tokio::time::interval(Duration::from_secs(2));
    let outcome = loop {
        tokio::select! {
            _ = terminate.recv() => break Ok(()),
            _ = interrupt.recv() => break Ok(()),
            _ = health.tick() => {
                if let Err(e) = env.check_running() {
                    break Err(e);
                }
            }
        }
    };
    tracing::info!("stopping the control plane");
    let _ = std::fs::remove_file(&kubeconfig);
    let _ = std::fs::remove_file(owner_file(&kubeconfig));
    let stopped = env.stop().await;
    outcome?;
    stopped?;
    Ok(())
}

/// The workspace's target directory: `CARGO_TARGET_DIR` (relative to the workspace root if
/// relative), else `<workspace root>/target`.
fn target_dir() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace_root = manifest_dir
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf());
    let dir = match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => workspace_root.join(dir),
        None => workspace_root.join("target"),
    };
    std::path::absolute(&dir).unwrap_or(dir)
}

/// Where this plane's kubeconfig goes in `dir`: `kubeconfig`, unless a live plane of this
/// checkout holds it (its pid in `kubeconfig.pid`); then `kubeconfig-<pid>`, so two planes
/// never overwrite one file.
fn claim_kubeconfig(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let shared = dir.join("kubeconfig");
    let owner = owner_file(&shared);
    let held = std::fs::read_to_string(&owner)
        .ok()
        .and_then(|pid| pid.trim().parse::<u32>().ok())
        .is_some_and(|pid| {
            pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()
        });
    let path = if held {
        dir.join(format!("kubeconfig-{}", std::process::id()))
    } else {
        shared
    };
    std::fs::write(owner_file(&path), std::process::id().to_string())
        .with_context(|| format!("writing {}", owner_file(&path).display()))?;
    Ok(path)
}

/// The file naming the process that holds `kubeconfig`.
fn owner_file(kubeconfig: &Path) -> PathBuf {
    let mut name = kubeconfig.as_os_str().to_owned();
    name.push(".pid");
    PathBuf::from(name)
}

/// Readers never see a half-written kubeconfig.
fn write_atomically(path: &Path, contents: &str) -> anyhow::Result<()> {
    let dir = path.parent().context("kubeconfig path has no parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".kubeconfig.{}", std::process::id()));
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
