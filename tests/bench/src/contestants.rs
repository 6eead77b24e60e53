//! The three operators and how each is started: the Go controller-runtime operator, the
//! native kube-rs controller, and the wasmop host with its plugin(s) in ConfigMaps.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testenv::TestEnv;
use tokio::time::Instant;

use crate::artifacts::{Artifacts, bench_dir};
use crate::kinds::Kind;
use crate::process::Proc;

/// The namespace of the host's plugin ConfigMaps.
pub const PLUGIN_NAMESPACE: &str = "wasmop-system";
/// How long an operator may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// One of the operators compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contestant {
    /// `tests/bench/go-memcached`.
    Go,
    /// `tests/bench/native`.
    Native,
    /// The host with `memcached.wasm`.
    Wasmop,
}

impl Contestant {
    /// Every contestant, in run order.
    pub const ALL: [Contestant; 3] = [Contestant::Go, Contestant::Native, Contestant::Wasmop];

    /// Short name, as `--only` takes it.
    pub fn key(self) -> &'static str {
        match self {
            Contestant::Go => "go",
            Contestant::Native => "native",
            Contestant::Wasmop => "wasmop",
        }
    }

    /// Column heading.
    pub fn label(self) -> &'static str {
        match self {
            Contestant::Go => "Go controller-runtime",
            Contestant::Native => "kube-rs native",
            Contestant::Wasmop => "wasmop",
        }
    }
}

/// Knobs shared by every contestant in a run.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Parents reconciled at once (per kind).
    pub concurrency: usize,
    /// The forced resync period.
    pub resync: Duration,
    /// Client rate limits (QPS, burst) for the operators that have the knob; `None` keeps
    /// each framework's default.
    pub limits: Option<(f64, u32)>,
}

/// Operators started for one scenario.
pub struct Running {
    /// Their processes.
    pub procs: Vec<Proc>,
    /// wasmop: from creating the plugin ConfigMaps until the host logged the last one loaded.
    pub plugin_load: Option<Duration>,
}

/// Starts `who` for `kinds` (one process per kind, or one host with one plugin per kind) and
/// waits until it is ready to reconcile.
pub async fn start(
    who: Contestant,
    art: &Artifacts,
    env: &TestEnv,
    client: &Client,
    kinds: &[Kind],
    settings: &Settings,
    tag: &str,
) -> Result<Running> {
    let logs = bench_dir().join("logs");
    std::fs::create_dir_all(&logs)?;
    let kubeconfig = env.kubeconfig_path();
    let resync = settings.resync.as_secs().max(1).to_string();
    let concurrency = settings.concurrency.to_string();
    match who {
        Contestant::Go | Contestant::Native => {
            let mut procs = Vec::new();
            for (i, kind) in kinds.iter().enumerate() {
                let mut cmd;
                let ready_line;
                if who == Contestant::Go {
                    cmd = Command::new(&art.go);
                    cmd.arg("--kubeconfig")
                        .arg(kubeconfig)
                        .args(["--sync-period", &format!("{resync}s")]);
                    ready_line = "Starting workers";
                } else {
                    cmd = Command::new(&art.native);
                    cmd.env("KUBECONFIG", kubeconfig)
                        .args(["--resync-seconds", &resync]);
                    ready_line = "stores ready";
                }
                cmd.args(["--kind", &kind.flag(), "--concurrency", &concurrency]);
                if let Some((qps, burst)) = settings.limits {
                    cmd.args(["--qps", &qps.to_string(), "--burst", &burst.to_string()]);
                }
                let log = logs.join(format!("{tag}-{}-{i}.log", who.key()));
                let mut p = Proc::spawn(&format!("{} for {}", who.label(), kind.kind), cmd, log)?;
                p.wait_for_log(ready_line, READY_TIMEOUT).await?;
                procs.push(p);
            }
            Ok(Running {
                procs,
                plugin_load: None,
            })
        }
        Contestant::Wasmop => {
            let plugins: Vec<&Path> = if kinds.len() == 1 && kinds[0] == Kind::memcached() {
                vec![&art.memcached]
            } else {
                art.kind_plugins.iter().map(|p| p.as_path()).collect()
            };
            // A cold compile cache: a new host pod has none.
            let cache = bench_dir().join("tmp").join(format!("{tag}-cache"));
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache)?;
            let port = free_port()?;
            let mut cmd = Command::new(&art.wasmop);
            cmd.env("KUBECONFIG", kubeconfig)
                .env("XDG_CACHE_HOME", &cache)
                .env("RUST_LOG", "info")
                .args(["run", "--namespace", PLUGIN_NAMESPACE])
                .args(["--concurrency", &concurrency, "--resync-seconds", &resync])
                .args(["--probe-addr", &format!("127.0.0.1:{port}")])
                .args(["--metrics-addr", &format!("127.0.0.1:{port}")]);
            let log = logs.join(format!("{tag}-wasmop.log"));
            let mut host = Proc::spawn("wasmop host", cmd, log)?;
            host.wait_for_log("wasmop host starting", READY_TIMEOUT)
                .await?;
            // Let it list the (empty) plugin namespace first, so the load below is a change.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let created = Instant::now();
            let names: Vec<String> = if plugins.len() == 1 {
                vec!["memcached".into()]
            } else {
                kinds.iter().map(Kind::plugin_name).collect()
            };
            for (name, wasm) in names.iter().zip(&plugins) {
                put_plugin(client, name, wasm).await?;
            }
            for name in &names {
                host.wait_for_log(&format!("loaded {name} "), READY_TIMEOUT)
                    .await?;
            }
            let plugin_load = created.elapsed();
            Ok(Running {
                procs: vec![host],
                plugin_load: Some(plugin_load),
            })
        }
    }
}

/// Creates or updates the plugin ConfigMap `name` with the module at `wasm`.
pub async fn put_plugin(client: &Client, name: &str, wasm: &Path) -> Result<()> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"wasmop.io/plugin": ""}},
        "binaryData": {
            format!("{name}.wasm"): base64::engine::general_purpose::STANDARD.encode(bytes),
        },
    });
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), PLUGIN_NAMESPACE);
    api.patch(
        name,
        &PatchParams::apply("wasmop-bench").force(),
        &Patch::Apply(&cm),
    )
    .await
    .with_context(|| format!("applying plugin ConfigMap {name}"))?;
    Ok(())
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
