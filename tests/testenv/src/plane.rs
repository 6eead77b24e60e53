//! [`TestEnv`]: one control plane, started in order, checked, and stopped in reverse order.
//!
//! Start-up is etcd → kube-apiserver (until `/readyz` says ok) → kube-controller-manager →
//! kube-scheduler → kwok → one fake Node, until it is Ready and its `not-ready` taint is gone
//! → the `default` ServiceAccount exists. When [`TestEnv::start`] returns, a Deployment
//! created right away gets Running pods.
//!
//! Every component listens on 127.0.0.1 only, on ports picked free at start, and writes its
//! output to `<work dir>/<component>.log`; the work dir is under
//! `$TMPDIR/wasmop-testenv/` and is removed on stop (kept after a failed start, for its
//! logs). A work dir left by a killed process, or by a `static` plane that was never
//! stopped, is removed by the next start (each live plane holds a lock on its own).
//!
//! For fault-injection tests, one [`Part`] of a running plane can be killed
//! ([`TestEnv::kill`]), stopped ([`TestEnv::stop_part`]) and started again
//! ([`TestEnv::start_part`]) with the same arguments and ports; and etcd can be compacted
//! ([`TestEnv::compact`]) through its JSON gateway, so reads at older resource versions
//! that reach etcd get `410 Gone`.

use std::fmt;
use std::fs::{self, File};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::Instant;

use crate::binaries::{self, Binaries};
use crate::certs;
use crate::error::{Error, Result};
use crate::ports::free_port;
use crate::process::Component;

/// The name of the fake node every plane has.
pub const NODE_NAME: &str = "kwok-node";

/// The component names, as in logs, errors and [`TestEnv::processes`].
const ETCD: &str = "etcd";
const APISERVER: &str = "kube-apiserver";
const CONTROLLER_MANAGER: &str = "kube-controller-manager";
const SCHEDULER: &str = "kube-scheduler";
const KWOK: &str = "kwok";

/// Pod IPs handed out by kwok; its default, 10.0.0.1/24, overlaps the service range.
const POD_CIDR: &str = "10.244.0.1/24";
const SERVICE_CIDR: &str = "10.0.0.0/24";

/// Generous bounds for a loaded 2-core machine; the typical figures are far lower.
const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
/// `/readyz` usually answers ok about 5 s after start.
const APISERVER_TIMEOUT: Duration = Duration::from_secs(90);
const NODE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a component gets to exit after `SIGTERM` before it is killed.
fn grace(component: &str) -> Duration {
    match component {
        // etcd must outlive the apiserver, which otherwise retries it for a long time.
        APISERVER => Duration::from_secs(15),
        _ => Duration::from_secs(5),
    }
}

/// How long [`TestEnv::compact`] waits for each answer of etcd.
const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One component of a plane, for [`TestEnv::kill`], [`TestEnv::stop_part`] and
/// [`TestEnv::start_part`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// etcd, the store.
    Etcd,
    /// kube-apiserver.
    Apiserver,
    /// kube-controller-manager.
    ControllerManager,
    /// kube-scheduler.
    Scheduler,
    /// kwok, which runs the fake node and its pods.
    Kwok,
}

impl Part {
    /// Every part, in start order.
    pub const ALL: [Part; 5] = [
        Part::Etcd,
        Part::Apiserver,
        Part::ControllerManager,
        Part::Scheduler,
        Part::Kwok,
    ];

    /// The component's name, as in [`TestEnv::processes`] and errors, e.g. `kube-apiserver`.
    pub fn name(self) -> &'static str {
        match self {
            Part::Etcd => ETCD,
            Part::Apiserver => APISERVER,
            Part::ControllerManager => CONTROLLER_MANAGER,
            Part::Scheduler => SCHEDULER,
            Part::Kwok => KWOK,
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A start whose ports were taken meanwhile by another process is tried again this often.
const START_ATTEMPTS: u32 = 3;

/// A running control plane, stopped by [`TestEnv::stop`] or on drop.
///
/// The processes are not tied to any tokio runtime: a `TestEnv` may be created in one runtime
/// and used from others, but a [`kube::Client`] may not, so [`TestEnv::client`] builds a new
/// one for the caller's runtime. Dropping a `TestEnv` blocks for the seconds the components
/// need to stop.
#[derive(Debug)]
pub struct TestEnv {
    /// In start order, also while one is stopped; emptied by the first stop.
    components: Mutex<Vec<Component>>,
    apiserver_url: String,
    apiserver_addr: SocketAddr,
    etcd_url: String,
    etcd_addr: SocketAddr,
    /// For kubeconfigs naming another server ([`TestEnv::kubeconfig_via`]).
    pki: certs::Pki,
    kubeconfig_yaml: String,
    kubeconfig_path: PathBuf,
    work_dir: WorkDir,
}

impl TestEnv {
    /// Starts a new control plane, building the binaries first on a machine that has none.
    ///
    /// Returns once the fake node is Ready: about 4 s on 2 idle cores with cached binaries.
    /// On failure the error names the component that failed and quotes the end of its log;
    /// the work dir with all logs is then kept (see [`TestEnv::work_dir`]).
    pub async fn start() -> Result<TestEnv> {
        Self::start_with_feature_gates(&[]).await
    }

    /// [`TestEnv::start`], with these kube-apiserver feature gates (`ShardedListAndWatch=true`).
    pub async fn start_with_feature_gates(gates: &[&str]) -> Result<TestEnv> {
        let bins = binaries::ensure().await?;
        let gates = gates.join(",");
        let mut attempt = 1;
        loop {
            match Self::start_with(&bins, &gates).await {
                Err(e) if e.is_port_conflict() && attempt < START_ATTEMPTS => {
                    tracing::warn!(error = %e, "a port was taken during start-up; starting again");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_with(bins: &Binaries, gates: &str) -> Result<TestEnv> {
        let started = Instant::now();
        let (mut env, mut layout) = Self::prepare()?;
        layout.feature_gates = gates.to_string();
        // A cancelled start drops `env`, which stops what had started.
        if let Err(e) = env.boot(bins, &layout).await {
            // Keep the logs the error points at; a later start removes the directory once
            // this process has released it.
            env.work_dir.keep = true;
            return Err(e);
        }
        tracing::info!(
            apiserver = %env.apiserver_url,
            work_dir = %env.work_dir.path.display(),
            "control plane ready in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(env)
    }

    /// Creates the work dir, certificates, kubeconfig and port choices; starts nothing.
    fn prepare() -> Result<(TestEnv, Layout)> {
        let work_dir = WorkDir::create()?;
        let pki = certs::generate(&work_dir.path)?;
        let port = || free_port().map_err(|e| Error::io("finding a free port", e));
        let layout = Layout {
            pki,
            etcd_client: port()?,
            etcd_peer: port()?,
            apiserver: port()?,
            scheduler: port()?,
            feature_gates: String::new(),
        };
        let apiserver_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, layout.apiserver));
        let apiserver_url = format!("https://{apiserver_addr}");
        let etcd_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, layout.etcd_client));
        let kubeconfig_yaml = layout.pki.admin_kubeconfig(&apiserver_url);
        let kubeconfig_path = work_dir.path.join("kubeconfig");
        write(&kubeconfig_path, &kubeconfig_yaml)?;
        let env = TestEnv {
            components: Mutex::new(Vec::new()),
            apiserver_url,
            apiserver_addr,
            etcd_url: format!("http://{etcd_addr}"),
            etcd_addr,
            pki: layout.pki.clone(),
            kubeconfig_yaml,
            kubeconfig_path,
            work_dir,
        };
        Ok((env, layout))
    }

    /// Starts the components in order, each once the one before is ready.
    async fn boot(&self, bins: &Binaries, layout: &Layout) -> Result<()> {
        let dir = &self.work_dir.path;
        let pki = &layout.pki;
        let (etcd_peer, apiserver_port, scheduler_port) =
            (layout.etcd_peer, layout.apiserver, layout.scheduler);
        let kubeconfig = self.kubeconfig_path.to_string_lossy().into_owned();
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let client = self.client().await?;

        let etcd_url = &self.etcd_url;
        self.launch(
            ETCD,
            &bins.controlplane,
            &[
                "etcd".into(),
                format!("--data-dir={}", path(&dir.join("etcd"))),
                format!("--client-url={etcd_url}"),
                format!("--peer-url=http://127.0.0.1:{etcd_peer}"),
            ],
        )?;
        self.until_etcd_ready(0).await?;

        let mut apiserver_args: Vec<String> = vec![
            APISERVER.into(),
            format!("--etcd-servers={etcd_url}"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            "--authorization-mode=RBAC".into(),
            format!("--secure-port={apiserver_port}"),
            // No --advertise-address=127.0.0.1: the endpoint reconciler refuses loopback
            // addresses, so the apiserver advertises the host's default-route address.
            "--bind-address=127.0.0.1".into(),
            format!("--tls-cert-file={}", path(&pki.serving_cert)),
            format!("--tls-private-key-file={}", path(&pki.serving_key)),
            format!("--client-ca-file={}", path(&pki.ca_cert)),
            format!("--service-account-issuer=https://127.0.0.1:{apiserver_port}/"),
            format!("--service-account-key-file={}", path(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", path(&pki.sa_key)),
        ];
        if !layout.feature_gates.is_empty() {
            apiserver_args.push(format!("--feature-gates={}", layout.feature_gates));
        }
        self.launch(APISERVER, &bins.controlplane, &apiserver_args)?;
        self.until_apiserver_ready(&client).await?;

        self.launch(
            CONTROLLER_MANAGER,
            &bins.controlplane,
            &[
                CONTROLLER_MANAGER.into(),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                format!("--root-ca-file={}", path(&pki.ca_cert)),
                format!("--service-account-private-key-file={}", path(&pki.sa_key)),
                "--use-service-account-credentials=false".into(),
                // Lets the CSR signer run too; all default controllers are on (the node
                // lifecycle one must be: it removes the fake node's not-ready taint).
                format!("--cluster-signing-cert-file={}", path(&pki.ca_cert)),
                format!("--cluster-signing-key-file={}", path(&pki.ca_key)),
                "--secure-port=0".into(),
                // The default 20 QPS, not the machine, would set the pace under load.
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
                "--concurrent-deployment-syncs=20".into(),
                "--concurrent-replicaset-syncs=20".into(),
            ],
        )?;
        self.launch(
            SCHEDULER,
            &bins.controlplane,
            &[
                SCHEDULER.into(),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                format!("--secure-port={scheduler_port}"),
                "--bind-address=127.0.0.1".into(),
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
            ],
        )?;
        // kwok opens no port unless --server-address or --node-port is given.
        let kwok_home = dir.join("kwok-home");
        fs::create_dir_all(&kwok_home)
            .map_err(|e| Error::io(format!("creating {}", kwok_home.display()), e))?;
        self.launch_with(
            KWOK,
            &bins.kwok,
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--manage-all-nodes=true".into(),
                format!("--cidr={POD_CIDR}"),
                // Without a lease the node's heartbeat comes too late and the node-lifecycle
                // controller marks it (and every pod on it) not ready for good.
                "--node-lease-duration-seconds=40".into(),
            ],
            |cmd| {
                // kwok would also load ~/.kwok/kwok.yaml; keep a user's file out of tests.
                cmd.env("HOME", &kwok_home);
            },
        )?;

        let nodes: Api<Node> = Api::all(client.clone());
        nodes
            .create(&PostParams::default(), &fake_node())
            .await
            .map_err(|e| Error::kube(format!("creating node {NODE_NAME}"), e))?;
        self.until_ready(KWOK, "the fake node to be Ready", NODE_TIMEOUT, || async {
            let node = nodes.get(NODE_NAME).await.map_err(|e| e.to_string())?;
            Ok(node_is_ready(&node))
        })
        .await?;
        self.until_ready(
            CONTROLLER_MANAGER,
            "the node's not-ready taint to be removed and the default ServiceAccount to exist",
            NODE_TIMEOUT,
            || async {
                let node = nodes.get(NODE_NAME).await.map_err(|e| e.to_string())?;
                let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
                let account = accounts
                    .get_opt("default")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(!node_is_tainted(&node) && account.is_some())
            },
        )
        .await?;
        self.check_running()
    }

    /// Waits until etcd's log, from byte `from` on, says `etcd: ready`.
    async fn until_etcd_ready(&self, from: u64) -> Result<()> {
        let log = self.work_dir.path.join(format!("{ETCD}.log"));
        let what = "\"etcd: ready\" in its log";
        self.until_ready(ETCD, what, ETCD_TIMEOUT, || async {
            let read = || -> std::io::Result<String> {
                let mut file = File::open(&log)?;
                file.seek(SeekFrom::Start(from))?;
                let mut text = String::new();
                file.read_to_string(&mut text)?;
                Ok(text)
            };
            Ok(read().unwrap_or_default().contains("etcd: ready"))
        })
        .await
    }

    /// Waits until the apiserver's `/readyz` answers ok.
    async fn until_apiserver_ready(&self, client: &Client) -> Result<()> {
        let what = "/readyz to answer ok";
        self.until_ready(APISERVER, what, APISERVER_TIMEOUT, || async {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request");
            match client.request_text(request).await {
                Ok(body) => Ok(body.trim() == "ok"),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    /// Kills one part with `SIGKILL` and waits for it to exit, as a crash would. It stays
    /// down, and is no crash for [`TestEnv::check_running`] or [`TestEnv::stop`], until
    /// [`TestEnv::start_part`].
    ///
    /// Killing a part that is already stopped does nothing; one that has crashed gives the
    /// crash as error.
    pub fn kill(&self, part: Part) -> Result<()> {
        let mut components = self.components();
        let component = find(&mut components, part)?;
        component.ensure_running()?;
        component.kill();
        tracing::debug!(component = part.name(), "killed");
        Ok(())
    }

    /// Stops one part as [`TestEnv::stop`] does (`SIGTERM`, a grace period of 15 s for the
    /// apiserver and 5 s for the others, then `SIGKILL`) and waits for it to exit. It stays
    /// down, and is no crash, until [`TestEnv::start_part`].
    ///
    /// Waits without blocking the runtime. Stopping a part that is already stopped does
    /// nothing; one that has crashed gives the crash as error.
    pub async fn stop_part(&self, part: Part) -> Result<()> {
        let grace = grace(part.name());
        {
            let mut components = self.components();
            let component = find(&mut components, part)?;
            component.ensure_running()?;
            if !component.terminate() {
                return Ok(());
            }
        }
        let stopping = Instant::now();
        loop {
            {
                let mut components = self.components();
                let component = find(&mut components, part)?;
                if component.exited().is_some() {
                    break;
                }
                if stopping.elapsed() >= grace {
                    component.warn_unstopped(grace);
                    component.kill();
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::debug!(component = part.name(), elapsed = ?stopping.elapsed(), "stopped");
        Ok(())
    }

    /// Starts a part that is down again, with exactly the program, arguments (so the same
    /// ports and data), environment and log file as before (the log is appended to), and
    /// waits until it is ready: etcd until it logs `etcd: ready` again, the apiserver until
    /// `/readyz` answers ok; the others only need to be running.
    ///
    /// A part that crashed may be started again too. Errors if the part is still running,
    /// cannot be started, or is not ready in time (30 s for etcd, 90 s for the apiserver).
    /// After an etcd restart the apiserver reconnects on its own, but that is not awaited.
    pub async fn start_part(&self, part: Part) -> Result<()> {
        let log_len = {
            let mut components = self.components();
            let component = find(&mut components, part)?;
            let log_len = fs::metadata(&component.log).map_or(0, |m| m.len());
            component.restart()?;
            log_len
        };
        tracing::debug!(component = part.name(), "started again");
        match part {
            Part::Etcd => self.until_etcd_ready(log_len).await,
            Part::Apiserver => self.until_apiserver_ready(&self.client().await?).await,
            Part::ControllerManager | Part::Scheduler | Part::Kwok => self.check_running(),
        }
    }

    /// Compacts etcd at its current revision, physically, and returns that revision: from
    /// then on, a read at an older `resourceVersion` that reaches etcd gets `410 Gone`.
    ///
    /// The apiserver's watch cache keeps serving the revisions it holds (watches and even
    /// exact lists), so to send clients to the compacted past, restart the apiserver after
    /// compacting ([`TestEnv::kill`], [`TestEnv::start_part`]): its new cache starts at the
    /// current revision and leaves older reads to etcd.
    ///
    /// Goes through etcd's gRPC JSON gateway (`POST /v3/kv/range`, `/v3/kv/compaction`). A
    /// revision compacted already (nothing written since the last compaction) is no error.
    pub async fn compact(&self) -> Result<i64> {
        let range = self
            .etcd_post("/v3/kv/range", &serde_json::json!({ "key": "AA==" }))
            .await?;
        let revision = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .ok_or_else(|| {
                self.etcd_error(format!(
                    "answered POST /v3/kv/range without a header.revision: {range}"
                ))
            })?;
        let compaction = serde_json::json!({ "revision": revision, "physical": true });
        match self.etcd_post("/v3/kv/compaction", &compaction).await {
            Ok(_) => {}
            Err(Error::Component { problem, .. })
                if problem.contains("required revision has been compacted") => {}
            Err(e) => return Err(e),
        }
        tracing::debug!(revision, "compacted etcd");
        Ok(revision)
    }

    /// `POST`s JSON to etcd's gateway and returns the JSON answer of a 200.
    async fn etcd_post(&self, path: &str, body: &serde_json::Value) -> Result<serde_json::Value> {
        let body = body.to_string();
        let request = crate::http1::post(self.etcd_addr, path, &body);
        let (status, text) = tokio::time::timeout(ETCD_REQUEST_TIMEOUT, request)
            .await
            .map_err(|_| {
                self.etcd_error(format!(
                    "did not answer POST {path} within {ETCD_REQUEST_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| Error::io(format!("POST {}{path}", self.etcd_url), e))?;
        if status != 200 {
            return Err(self.etcd_error(format!("answered POST {path} with {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| {
            self.etcd_error(format!("answered POST {path} with bad JSON ({e}): {text}"))
        })
    }

    fn etcd_error(&self, problem: String) -> Error {
        let mut components = self.components();
        match find(&mut components, Part::Etcd) {
            Ok(etcd) => etcd.error(problem),
            Err(e) => e,
        }
    }

    /// The admin kubeconfig (`system:masters`), a file in the plane's work dir.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The admin kubeconfig as YAML, with credentials inline.
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// The admin kubeconfig as YAML, like [`TestEnv::kubeconfig_yaml`] but with the server
    /// `https://<addr>`, e.g. a [`crate::Proxy`] in front of the apiserver. The serving
    /// certificate is for `127.0.0.1` and `localhost`, so `addr` must be on 127.0.0.1.
    pub fn kubeconfig_via(&self, addr: SocketAddr) -> String {
        self.pki.admin_kubeconfig(&format!("https://{addr}"))
    }

    /// A new admin client that reaches the apiserver through `addr` (see
    /// [`TestEnv::kubeconfig_via`]), bound to the calling tokio runtime.
    pub async fn client_via(&self, addr: SocketAddr) -> Result<Client> {
        let origin = format!("of the test plane via {addr}");
        client_from_kubeconfig(&self.kubeconfig_via(addr), &origin).await
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>`.
    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
    }

    /// The apiserver's address, `127.0.0.1:<port>`, e.g. the target of a [`crate::Proxy`].
    pub fn apiserver_addr(&self) -> SocketAddr {
        self.apiserver_addr
    }

    /// etcd's client URL, `http://127.0.0.1:<port>` (plain HTTP, gRPC and its JSON gateway).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The directory holding the plane's certificates, etcd data and `<component>.log` files.
    pub fn work_dir(&self) -> &Path {
        &self.work_dir.path
    }

    /// A new admin client, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig_yaml, "of the test plane").await
    }

    /// The name and process id of each component, in start order, leaving out parts stopped
    /// with [`TestEnv::kill`] or [`TestEnv::stop_part`] and not started again.
    pub fn processes(&self) -> Vec<(&'static str, u32)> {
        self.components()
            .iter()
            .filter(|c| !c.is_stopped())
            .map(|c| (c.name, c.pid()))
            .collect()
    }

    /// `Err` naming the first component that has exited, with the end of its log. Parts
    /// stopped on purpose ([`TestEnv::kill`], [`TestEnv::stop_part`]) do not count.
    pub fn check_running(&self) -> Result<()> {
        self.components()
            .iter_mut()
            .try_for_each(Component::ensure_running)
    }

    /// Stops the components in reverse start order (each gets `SIGTERM`, a grace period,
    /// then `SIGKILL`) and removes the work dir.
    ///
    /// Returns an error if a component had already exited before the stop, i.e. crashed;
    /// a part stopped on purpose and not started again is no crash.
    pub async fn stop(self) -> Result<()> {
        tokio::task::spawn_blocking(move || self.shutdown())
            .await
            .map_err(|e| Error::io("stopping the control plane", std::io::Error::other(e)))?
    }

    fn shutdown(&self) -> Result<()> {
        let components = std::mem::take(&mut *self.components());
        let mut crashed = None;
        for mut component in components.into_iter().rev() {
            if let Err(e) = component.ensure_running() {
                crashed.get_or_insert(e);
            }
            let grace = grace(component.name);
            let stopping = std::time::Instant::now();
            component.stop(grace);
            tracing::debug!(component = component.name, elapsed = ?stopping.elapsed(), "stopped");
        }
        crashed.map_or(Ok(()), Err)
    }

    fn components(&self) -> MutexGuard<'_, Vec<Component>> {
        self.components
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn launch(&self, name: &'static str, program: &Path, args: &[String]) -> Result<()> {
        self.launch_with(name, program, args, |_| {})
    }

    fn launch_with(
        &self,
        name: &'static str,
        program: &Path,
        args: &[String],
        customize: impl FnOnce(&mut Command),
    ) -> Result<()> {
        let mut cmd = Command::new(program);
        cmd.args(args).env_remove("KUBECONFIG");
        customize(&mut cmd);
        let log = self.work_dir.path.join(format!("{name}.log"));
        tracing::debug!(component = name, log = %log.display(), "starting");
        let component = Component::start(name, cmd, log)?;
        self.components().push(component);
        Ok(())
    }

    /// Polls `check` until it says ready, failing early if any component exits.
    ///
    /// `check` returns `Ok(ready)`, or `Err(reason)` for a failed probe (kept for the error).
    async fn until_ready<F, Fut>(
        &self,
        component: &'static str,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<bool, String>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            let last = match check().await {
                Ok(true) => return Ok(()),
                Ok(false) => String::from("not ready"),
                Err(reason) => reason,
            };
            if Instant::now() >= deadline {
                let components = self.components();
                let problem = format!(
                    "was not ready after {timeout:?}, waiting for {what} (last check: {last})"
                );
                return Err(match components.iter().find(|c| c.name == component) {
                    Some(c) => c.error(problem),
                    None => Error::Component {
                        component,
                        problem,
                        log: PathBuf::new(),
                        tail: String::new(),
                    },
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            // Usually the error a failed start or test already reported.
            tracing::debug!("a component had exited before the stop: {e}");
        }
    }
}

/// The component of `part` among `components`.
fn find(components: &mut [Component], part: Part) -> Result<&mut Component> {
    components
        .iter_mut()
        .find(|c| c.name == part.name())
        .ok_or_else(|| Error::Component {
            component: part.name(),
            problem: "is not part of this plane (it was stopped)".into(),
            log: PathBuf::new(),
            tail: String::new(),
        })
}

/// Builds a client from kubeconfig YAML; `origin` describes it for errors.
pub(crate) async fn client_from_kubeconfig(yaml: &str, origin: &str) -> Result<Client> {
    let kubeconfig_error = |source| Error::Kubeconfig {
        origin: origin.to_owned(),
        source,
    };
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(kubeconfig_error)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_error)?;
    Client::try_from(config)
        .map_err(|e| Error::kube(format!("creating a client from the kubeconfig {origin}"), e))
}

fn fake_node() -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE_NAME,
            "labels": {
                "kubernetes.io/hostname": NODE_NAME,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
            // kwok manages every node, but the annotation also marks it fake for readers.
            "annotations": { "kwok.x-k8s.io/node": "fake" },
        },
        "status": {
            // Room for load tests: tens of thousands of pods without resource requests.
            "capacity": { "cpu": "1000", "memory": "1Ti", "pods": "100000" },
            "allocatable": { "cpu": "1000", "memory": "1Ti", "pods": "100000" },
        },
    }))
    .expect("a valid Node")
}

fn node_is_ready(node: &Node) -> bool {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn node_is_tainted(node: &Node) -> bool {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    taints.iter().any(|t| {
        t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
    })
}

fn write(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// What [`TestEnv::prepare`] chose for the components: credentials and ports.
struct Layout {
    pki: certs::Pki,
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    scheduler: u16,
    // kube-apiserver's `--feature-gates`, empty for none.
    feature_gates: String,
}

/// A plane's private directory, locked while in use and removed on drop (unless kept).
#[derive(Debug)]
struct WorkDir {
    path: PathBuf,
    /// Set when a start failed, so the logs named in the error stay readable.
    keep: bool,
    /// Held (flock) for the plane's lifetime: a directory whose lock can be taken belongs to
    /// a process that is gone.
    _lock: File,
}

impl WorkDir {
    /// Directories of a live process younger than this are never swept: their lock may not
    /// be taken yet.
    const MIN_STALE_AGE: Duration = Duration::from_secs(60);

    fn create() -> Result<WorkDir> {
        static SEQUENCE: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join("wasmop-testenv");
        fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("creating {}", root.display()), e))?;
        Self::remove_stale(&root);
        let name = format!(
            "{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        let path = root.join(name);
        // A directory of that name can only be left by an earlier process with the same pid.
        let _ = fs::remove_dir_all(&path);
        fs::create_dir(&path).map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        let lock_path = path.join("lock");
        let lock = File::create(&lock_path)
            .map_err(|e| Error::io(format!("creating {}", lock_path.display()), e))?;
        lock.try_lock()
            .map_err(|e| Error::io(format!("locking {}", lock_path.display()), e.into()))?;
        Ok(WorkDir {
            path,
            keep: false,
            _lock: lock,
        })
    }

    /// Removes the work dirs of processes that died without cleaning up.
    fn remove_stale(root: &Path) {
        let Ok(entries) = fs::read_dir(root) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // A live owner may not have taken its lock yet; a dead one never will. (The name
            // starts with the owner's pid; a reused pid only delays the clean-up.)
            let owner_alive = entry
                .file_name()
                .to_string_lossy()
                .split('-')
                .next()
                .is_none_or(|pid| Path::new("/proc").join(pid).exists());
            let old_enough = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| SystemTime::now().duration_since(modified).ok())
                .is_some_and(|age| age >= Self::MIN_STALE_AGE);
            if owner_alive && !old_enough {
                continue;
            }
            let abandoned = match File::open(path.join("lock")) {
                Ok(lock) => lock.try_lock().is_ok(),
                Err(_) => true,
            };
            if abandoned {
                tracing::debug!(dir = %path.display(), "removing an abandoned work dir");
                let _ = fs::remove_dir_all(&path);
            }
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_node_is_labelled_for_kwok() {
        let node = fake_node();
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], NODE_NAME);
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(
            node.metadata.annotations.unwrap()["kwok.x-k8s.io/node"],
            "fake"
        );
        assert!(!node_is_ready(&fake_node()));
    }

    #[test]
    fn work_dirs_are_distinct_and_removed() {
        let a = WorkDir::create().unwrap();
        let b = WorkDir::create().unwrap();
        assert_ne!(a.path, b.path);
        let path = a.path.clone();
        drop(a);
        assert!(!path.exists());
        assert!(b.path.exists());
    }
}
