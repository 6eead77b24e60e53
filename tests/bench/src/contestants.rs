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
use crate::process::{Proc, Usage};

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
    /// The host with `plugins/memcached-star/plugin.star`; one-kind runs only, and only when
    /// asked for (`--only`) or in a full run.
    Starlark,
}

impl Contestant {
    /// Every contestant, in run order.
    pub const ALL: [Contestant; 4] = [
        Contestant::Go,
        Contestant::Native,
        Contestant::Wasmop,
        Contestant::Starlark,
    ];

    /// Short name, as `--only` takes it.
    pub fn key(self) -> &'static str {
        match self {
            Contestant::Go => "go",
            Contestant::Native => "native",
            Contestant::Wasmop => "wasmop",
            Contestant::Starlark => "starlark",
        }
    }

    /// Column heading.
    pub fn label(self) -> &'static str {
        match self {
            Contestant::Go => "Go controller-runtime",
            Contestant::Native => "kube-rs native",
            Contestant::Wasmop => "wasmop",
            Contestant::Starlark => "wasmop, Starlark",
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
    /// wasmop: where the host serves `/metrics`.
    pub metrics: Option<String>,
}

/// A new host pod: an empty disk cache, the plugins and parents already in the cluster.
#[derive(Debug, Clone, Copy)]
pub struct NewPod {
    /// Process start → every plugin loaded.
    pub loaded: Duration,
    /// Process start → its first reconcile done.
    pub first_reconcile: Duration,
    /// CPU used until every plugin was loaded, in seconds.
    pub cpu_at_loaded: f64,
    /// 5 s after loading.
    pub settled: Usage,
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
                metrics: None,
            })
        }
        Contestant::Wasmop | Contestant::Starlark => {
            let plugins: Vec<&Path> = if who == Contestant::Starlark {
                vec![&art.memcached_star]
            } else if is_plain(kinds) {
                vec![&art.memcached]
            } else {
                art.kind_plugins.iter().map(|p| p.as_path()).collect()
            };
            // A cold compile cache: a new host pod has none.
            let cache = cache_dir(tag);
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache)?;
            let (mut host, metrics) = spawn_host(art, env, settings, tag, who.key(), &[]).await?;
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
                metrics: Some(metrics),
            })
        }
    }
}

/// Starts a new host, as a new pod: an empty disk cache, and (`shared`) the compiled plugins
/// another replica shared, or (not `shared`) none; measures it until its first reconcile.
pub async fn new_pod(
    art: &Artifacts,
    env: &TestEnv,
    kinds: &[Kind],
    settings: &Settings,
    tag: &str,
    shared: bool,
) -> Result<(Proc, NewPod)> {
    let name = if shared {
        "new-pod-shared"
    } else {
        "new-pod-compiling"
    };
    let cache = cache_dir(&format!("{tag}-{name}"));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache)?;
    let extra: &[&str] = if shared {
        &[]
    } else {
        &["--no-shared-artifacts"]
    };
    let started = Instant::now();
    let (mut host, metrics) =
        spawn_host_in(art, env, settings, &cache, name, tag, extra, &[]).await?;
    wait_loaded(&mut host, &plugin_names(kinds)).await?;
    let loaded = started.elapsed();
    let cpu_at_loaded = host.usage()?.cpu_secs;
    let first_reconcile = loop {
        let text = metric_text(&metrics).await.unwrap_or_default();
        if counter_sum(&text, "wasmop_reconcile_total{") >= 1.0 {
            break started.elapsed();
        }
        host.check_alive()?;
        if started.elapsed() > READY_TIMEOUT {
            anyhow::bail!("{name}: no reconcile within {READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settled = host.usage()?;
    Ok((
        host,
        NewPod {
            loaded,
            first_reconcile,
            cpu_at_loaded,
            settled,
        },
    ))
}

/// Each shared cache of the host serving metrics at `addr`: `Kind.apiVersion (body)`,
/// objects, bytes.
pub async fn cache_stats(addr: &str) -> Result<Vec<(String, usize, f64)>> {
    let text = metric_text(addr).await?;
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("wasmop_cache_objects{"))
    {
        let labels = &line[line.find('{').unwrap_or(0)..=line.find('}').unwrap_or(0)];
        let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        let bytes = text
            .lines()
            .find(|l| l.starts_with(&format!("wasmop_cache_bytes{labels}")))
            .and_then(value)
            .unwrap_or(0.0);
        let label = |key: &str| {
            labels
                .split(&format!("{key}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        out.push((
            format!("{} ({})", label("kind"), label("body")),
            value(line).unwrap_or(0.0) as usize,
            bytes,
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The host's plugin calls and the reconciles it answered without one (the request
/// byte-identical to the last answered), so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calls {
    pub calls: f64,
    pub skipped: f64,
}

impl Calls {
    /// Read from the host serving metrics at `addr`.
    pub async fn read(addr: &str) -> Result<Self> {
        let text = metric_text(addr).await?;
        Ok(Self {
            calls: counter_sum(&text, "wasmop_plugin_call_duration_seconds_count{"),
            skipped: counter_sum(&text, "wasmop_reconcile_skipped_total{"),
        })
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            calls: self.calls - earlier.calls,
            skipped: self.skipped - earlier.skipped,
        }
    }
}

/// The sum of every series of counter `prefix` (`name{`) in a Prometheus text.
pub fn counter_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET /metrics` from the host at `addr`, over plain HTTP/1.0.
pub async fn metric_text(addr: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default())
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
    extra: &[&str],
) -> Result<(Proc, String)> {
    spawn_host_in(
        art,
        env,
        settings,
        &cache_dir(tag),
        log_name,
        tag,
        extra,
        &[],
    )
    .await
}

/// Starts host replica `pod` (its `POD_NAME`, the identity its Leases name) with `extra`
/// arguments and an empty disk cache of its own, as a pod of a Deployment would have; returns
/// it and where it serves `/metrics`.
pub async fn spawn_replica(
    art: &Artifacts,
    env: &TestEnv,
    settings: &Settings,
    tag: &str,
    pod: &str,
    extra: &[&str],
) -> Result<(Proc, String)> {
    let cache = cache_dir(&format!("{tag}-{pod}"));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache)?;
    std::fs::create_dir_all(bench_dir().join("logs"))?;
    let envs = [("POD_NAME", pod)];
    spawn_host_in(art, env, settings, &cache, pod, tag, extra, &envs).await
}

#[allow(clippy::too_many_arguments)]
async fn spawn_host_in(
    art: &Artifacts,
    env: &TestEnv,
    settings: &Settings,
    cache: &Path,
    log_name: &str,
    tag: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Result<(Proc, String)> {
    let port = free_port()?;
    let mut cmd = Command::new(&art.wasmop);
    cmd.env("KUBECONFIG", env.kubeconfig_path())
        .env("XDG_CACHE_HOME", cache)
        .env("RUST_LOG", "info")
        .args(["run", "--namespace", PLUGIN_NAMESPACE])
        .args(["--concurrency", &settings.concurrency.to_string()])
        .args([
            "--resync-seconds",
            &settings.resync.as_secs().max(1).to_string(),
        ])
        .args(["--probe-addr", &format!("127.0.0.1:{port}")])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(extra)
        .envs(envs.iter().copied());
    let log = bench_dir()
        .join("logs")
        .join(format!("{tag}-{log_name}.log"));
    let mut host = Proc::spawn("wasmop host", cmd, log)?;
    host.wait_for_log("wasmop host starting", READY_TIMEOUT)
        .await?;
    Ok((host, format!("127.0.0.1:{port}")))
}

pub async fn wait_loaded(host: &mut Proc, names: &[String]) -> Result<()> {
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
    let plugin = tokio::task::spawn_blocking(move || {
        wasmop::plugin::offline::load("plugin.wasm", &bytes, Default::default())
    })
    .await??;
    let options = wasmop::plugin::rbac::Options {
        configmap: Some(name.to_string()),
        name: None,
        namespace: PLUGIN_NAMESPACE.into(),
        service_account: "wasmop".into(),
        watch_namespace: None,
        plurals: Vec::new(),
    };
    let objects = wasmop::plugin::rbac::objects(plugin.manifest(), &options)?;
    testenv::apply_objects(client, objects, "wasmop-bench")
        .await
        .with_context(|| format!("granting plugin {name} its RBAC"))?;
    Ok(())
}

/// Creates or updates the plugin ConfigMap `name` with the module or script at `wasm`.
pub async fn put_plugin(client: &Client, name: &str, wasm: &Path) -> Result<()> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let packaged = if wasm.extension().is_some_and(|e| e == "star") {
        let file = wasm.file_name().unwrap_or_default().to_string_lossy();
        let source = String::from_utf8(bytes).context("a script is text")?;
        wasmop::plugin::package::package_script(&file, &source, name, PLUGIN_NAMESPACE, None)
    } else {
        wasmop::plugin::package::package(&bytes, name, PLUGIN_NAMESPACE, None)
    };
    let cm = packaged
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
