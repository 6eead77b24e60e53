//! The three operators and how each is started: the Go controller-runtime operator, the
//! native kube-rs controller, and the wasmop host with its plugin(s) in ConfigMaps.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
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
            let plugins: Vec<&Path> = if is_plain(kinds) {
                vec![&art.memcached]
            } else {
                art.kind_plugins.iter().map(|p| p.as_path()).collect()
            };
            // A cold compile cache: a new host pod has none.
            let cache = cache_dir(tag);
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache)?;
            let mut host = spawn_host(art, env, settings, tag, "wasmop").await?;
            // Let it list the (empty) plugin namespace first, so the load below is a change.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let names = plugin_names(kinds);
            for (name, wasm) in names.iter().zip(&plugins) {
                // The hot swap's second build adds a Service: grant its rights up front.
                let rights = if is_plain(kinds) {
                    &art.memcached_v2
                } else {
                    *wasm
                };
                grant_plugin(client, name, rights).await?;
            }
            let created = Instant::now();
            for (name, wasm) in names.iter().zip(&plugins) {
                put_plugin(client, name, wasm).await?;
            }
            wait_loaded(&mut host, &names).await?;
            let plugin_load = created.elapsed();
            Ok(Running {
                procs: vec![host],
                plugin_load: Some(plugin_load),
            })
        }
    }
}

/// Starts another host on the plugins already in the cluster, with the compile cache the
/// first one filled, and waits until it has loaded them all.
pub async fn restart_warm(
    art: &Artifacts,
    env: &TestEnv,
    kinds: &[Kind],
    settings: &Settings,
    tag: &str,
) -> Result<Proc> {
    let mut host = spawn_host(art, env, settings, tag, "wasmop-warm").await?;
    wait_loaded(&mut host, &plugin_names(kinds)).await?;
    Ok(host)
}

/// The single-kind run uses `memcached.wasm`; other runs the bench plugin per kind.
fn is_plain(kinds: &[Kind]) -> bool {
    kinds.len() == 1 && kinds[0] == Kind::memcached()
}

fn plugin_names(kinds: &[Kind]) -> Vec<String> {
    if is_plain(kinds) {
        vec!["memcached".into()]
    } else {
        kinds.iter().map(Kind::plugin_name).collect()
    }
}

fn cache_dir(tag: &str) -> PathBuf {
    bench_dir().join("tmp").join(format!("{tag}-cache"))
}

async fn spawn_host(
    art: &Artifacts,
    env: &TestEnv,
    settings: &Settings,
    tag: &str,
    log_name: &str,
) -> Result<Proc> {
    let port = free_port()?;
    let mut cmd = Command::new(&art.wasmop);
    cmd.env("KUBECONFIG", env.kubeconfig_path())
        .env("XDG_CACHE_HOME", cache_dir(tag))
        .env("RUST_LOG", "info")
        .args(["run", "--namespace", PLUGIN_NAMESPACE])
        .args(["--concurrency", &settings.concurrency.to_string()])
        .args([
            "--resync-seconds",
            &settings.resync.as_secs().max(1).to_string(),
        ])
        .args(["--probe-addr", &format!("127.0.0.1:{port}")])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")]);
    let log = bench_dir()
        .join("logs")
        .join(format!("{tag}-{log_name}.log"));
    let mut host = Proc::spawn("wasmop host", cmd, log)?;
    host.wait_for_log("wasmop host starting", READY_TIMEOUT)
        .await?;
    Ok(host)
}

async fn wait_loaded(host: &mut Proc, names: &[String]) -> Result<()> {
    for name in names {
        host.wait_for_log(&format!("loaded {name} "), READY_TIMEOUT)
            .await?;
    }
    Ok(())
}

/// Applies what `wasmop rbac` prints for the plugin in ConfigMap `name`: its ServiceAccount,
/// which makes its writes, and its rights in every namespace.
pub async fn grant_plugin(client: &Client, name: &str, wasm: &Path) -> Result<()> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let plugin = tokio::task::spawn_blocking(move || wasmop::cmd::probe(&bytes)).await??;
    let options = wasmop::cmd::rbac::Options {
        configmap: Some(name.to_string()),
        name: None,
        namespace: PLUGIN_NAMESPACE.into(),
        service_account: "wasmop".into(),
        watch_namespace: None,
        plurals: Vec::new(),
    };
    let objects = wasmop::cmd::rbac::objects(plugin.manifest(), &options)?;
    testenv::apply_objects(client, objects, "wasmop-bench")
        .await
        .with_context(|| format!("granting plugin {name} its RBAC"))?;
    Ok(())
}

/// Creates or updates the plugin ConfigMap `name` with the module at `wasm`.
pub async fn put_plugin(client: &Client, name: &str, wasm: &Path) -> Result<()> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let cm = wasmop::cmd::package::package(&bytes, name, PLUGIN_NAMESPACE, None)
        .with_context(|| format!("packaging {}", wasm.display()))?
        .configmap;
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
