//! What every plane-backed suite (`e2e`, `faults`, `shards`, `stage`) needs: the shared
//! control plane, a test's own namespace, the CRDs, plugin ConfigMaps, Memcached objects, and
//! the host as a real process ([`Host::build`]).

pub mod registry;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use testenv::TestNamespace;

/// Generous: the control plane shares two cores with the build and the other tests.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// One test's world.
pub struct Env {
    /// An admin client of the shared plane.
    pub client: Client,
    /// Its kubeconfig, for processes.
    pub kubeconfig: PathBuf,
    /// The test's namespace.
    pub ns: TestNamespace,
}

impl Env {
    /// The shared plane, the CRDs installed, and a fresh namespace named after the test.
    pub async fn new(test: &str) -> Env {
        let cluster = testenv::shared().await.expect("control plane");
        let client = cluster.client().await.expect("client");
        install_crds(&client).await;
        let ns = testenv::namespace(&client, test).await.expect("namespace");
        Env {
            client,
            kubeconfig: cluster.kubeconfig_path().to_path_buf(),
            ns,
        }
    }

    /// The test's namespace's name.
    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// Memcached objects in this namespace.
    pub fn memcacheds(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), self.name(), &memcached_resource())
    }

    /// Creates or updates a plugin ConfigMap, as `wasmop package` builds it (server-side
    /// apply, so both work), after granting its ServiceAccount what `wasmop rbac` prints.
    pub async fn put_plugin(&self, name: &str, wasm: &[u8], settings: Option<&str>) {
        self.grant(name, wasm, &[]).await;
        self.put_plugin_only(name, wasm, settings).await;
    }

    /// What `wasmop rbac --watch-namespace <ns>` prints for the plugin in ConfigMap `name`,
    /// as JSON documents; empty when the module does not load (a test of a bad module).
    pub async fn rbac(&self, name: &str, wasm: &[u8]) -> Vec<Value> {
        rbac(wasm, name, self.name(), Some(self.name()), None).await
    }

    /// Applies [`Env::rbac`], with the resources in `withhold` taken out of the plugin
    /// ServiceAccount's rules.
    pub async fn grant(&self, name: &str, wasm: &[u8], withhold: &[&str]) {
        let mut docs = self.rbac(name, wasm).await;
        withhold_from(
            &mut docs,
            "Role",
            &format!("wasmop-plugin-{name}"),
            withhold,
        );
        testenv::apply_objects(&self.client, docs, "e2e")
            .await
            .expect("the plugin's RBAC applied");
    }

    /// Creates or updates a plugin ConfigMap, and grants nothing.
    pub async fn put_plugin_only(&self, name: &str, wasm: &[u8], settings: Option<&str>) {
        let cm =
            wasmop::plugin::package::package(wasm, name, self.name(), settings.map(str::to_owned))
                .expect("a plugin ConfigMap")
                .configmap;
        let api: Api<ConfigMap> = self.ns.api();
        api.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&cm))
            .await
            .expect("apply plugin ConfigMap");
    }

    /// [`Env::new`] with the Memcached plugin and a host running it.
    pub async fn with_memcached(test: &str) -> (Env, Host) {
        let env = Env::new(test).await;
        env.put_memcached_plugin().await;
        let host = env.start_host();
        (env, host)
    }

    /// Puts the Memcached plugin in ConfigMap `memcached`, granted what it needs; its module.
    pub async fn put_memcached_plugin(&self) -> Vec<u8> {
        let wasm = test_artifacts::read(test_artifacts::MEMCACHED);
        self.put_plugin("memcached", &wasm, None).await;
        wasm
    }

    /// Creates or updates `Memcached/name` with `spec.size = size` and waits until its status
    /// names that many pods; returns their names.
    pub async fn memcached_ready(&self, name: &str, size: i64) -> Vec<String> {
        self.put_memcached(name, size).await;
        self.wait_nodes(name, size as usize).await
    }

    /// Creates or updates `Memcached/name` with `spec.size = size`.
    pub async fn put_memcached(&self, name: &str, size: i64) {
        let obj = json!({
            "apiVersion": "cache.example.com/v1alpha1",
            "kind": "Memcached",
            "metadata": {"name": name},
            "spec": {"size": size},
        });
        self.memcacheds()
            .patch(
                name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&obj),
            )
            .await
            .expect("apply Memcached");
    }

    /// Waits until `status.nodes` of `Memcached/name` lists `n` pods; returns them.
    pub async fn wait_nodes(&self, name: &str, n: usize) -> Vec<String> {
        let api = self.memcacheds();
        testenv::wait_until(
            &format!(
                "Memcached {}/{name} to list {n} nodes in its status",
                self.name()
            ),
            TIMEOUT,
            || async { api.get(name).await.map(|o| o.data["status"].clone()) },
            |status| status["nodes"].as_array().is_some_and(|a| a.len() == n),
        )
        .await
        .expect("status.nodes")["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    /// Waits until `Deployment/name` wants `replicas` replicas; returns it.
    pub async fn wait_replicas(&self, name: &str, replicas: i32) -> Deployment {
        let deployments = self.ns.api::<Deployment>();
        testenv::wait_until(
            &format!("Deployment {name} to want {replicas} replicas"),
            TIMEOUT,
            || async { deployments.get_opt(name).await },
            |d| {
                d.as_ref()
                    .is_some_and(|d| d.spec.replicas == Some(replicas))
            },
        )
        .await
        .expect("deployment")
        .expect("present")
    }

    /// Runs the `wasmop` CLI on this namespace's cluster with `args` and `--namespace`; whether
    /// it succeeded, and its stdout and stderr together.
    pub fn wasmop(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(wasmop_bin())
            .args(args)
            .args(["--namespace", self.name()])
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("run wasmop");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    /// Starts the host on this namespace (plugins and parents both live here).
    pub fn start_host(&self) -> Host {
        self.host().start()
    }

    /// A host for this namespace, to configure before starting it.
    pub fn host(&self) -> Launch {
        Host::build(&self.kubeconfig, self.name())
    }
}

/// What `wasmop rbac` prints for the plugin `wasm` in ConfigMap `configmap` of the host's
/// namespace `host_ns`: Roles in `watch`, or ClusterRoles (`None`), their names starting with
/// `roles` (the plugin's ServiceAccount name when `None`; cluster-wide names must be unique to
/// a test). Empty when the module does not load (a test of a bad module).
pub async fn rbac(
    wasm: &[u8],
    configmap: &str,
    host_ns: &str,
    watch: Option<&str>,
    roles: Option<String>,
) -> Vec<Value> {
    let wasm = wasm.to_vec();
    let Ok(Ok(plugin)) = tokio::task::spawn_blocking(move || {
        wasmop::plugin::offline::load("plugin.wasm", &wasm, Default::default())
    })
    .await
    else {
        return Vec::new();
    };
    let options = wasmop::plugin::rbac::Options {
        configmap: Some(configmap.to_string()),
        name: roles,
        namespace: host_ns.to_string(),
        service_account: "wasmop".into(),
        watch_namespace: watch.map(str::to_string),
        plurals: Vec::new(),
    };
    wasmop::plugin::rbac::objects(plugin.manifest(), &options).expect("rbac")
}

/// Applies [`rbac`] cluster-wide, with ClusterRoles named `roles` and the resources in
/// `withhold` taken out of the plugin's rules.
pub async fn grant_everywhere(
    client: &Client,
    wasm: &[u8],
    configmap: &str,
    host_ns: &str,
    roles: &str,
    withhold: &[&str],
) {
    let mut docs = rbac(wasm, configmap, host_ns, None, Some(roles.to_string())).await;
    assert!(!docs.is_empty(), "the plugin loads offline");
    withhold_from(&mut docs, "ClusterRole", roles, withhold);
    testenv::apply_objects(client, docs, "e2e")
        .await
        .expect("the plugin's RBAC applied");
}

/// Takes the resources in `withhold` out of the rules of the `kind` (`Role` or `ClusterRole`)
/// named `role` among `wasmop rbac`'s documents, dropping rules left with none.
pub fn withhold_from(docs: &mut [Value], kind: &str, role: &str, withhold: &[&str]) {
    for doc in docs {
        if doc["kind"] != kind || doc["metadata"]["name"] != role {
            continue;
        }
        for rule in doc["rules"].as_array_mut().unwrap() {
            rule["resources"]
                .as_array_mut()
                .unwrap()
                .retain(|r| !withhold.contains(&r.as_str().unwrap()));
        }
        doc["rules"]
            .as_array_mut()
            .unwrap()
            .retain(|r| !r["resources"].as_array().unwrap().is_empty());
    }
}

/// Resident memory of a process at its peak and now, in MiB, from `/proc/<pid>/status`.
pub fn rss_mib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            / 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The Memcached kind's resource.
pub fn memcached_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha1", "Memcached"),
        "memcacheds",
    )
}

/// Applies every CRD in `deploy/crds/`, the host's own (`deploy/host/wasmopplugins.yaml`) and
/// a test-only `Probe` kind, and waits until they are served.
pub async fn install_crds(client: &Client) {
    let root = test_artifacts::workspace_root();
    let dir = root.join("deploy/crds");
    let mut crds: Vec<CustomResourceDefinition> = Vec::new();
    let files = std::fs::read_dir(&dir)
        .expect("deploy/crds")
        .map(|e| e.unwrap().path())
        .chain([root.join("deploy/host/wasmopplugins.yaml")]);
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            use serde::Deserialize;
            crds.push(CustomResourceDefinition::deserialize(doc).expect("a CRD"));
        }
    }
    crds.push(serde_json::from_value(probe_crd()).unwrap());
    for crd in &crds {
        testenv::apply_crd(client, crd, "e2e", TIMEOUT)
            .await
            .expect("CRD established");
    }
}

/// The test-only `Probe` kind.
pub fn probe_resource() -> ApiResource {
    test_resource("Probe")
}

/// The resource of [`test_crd`]'s kind `kind`.
pub fn test_resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase());
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.wasmop.io", "v1", kind),
        &plural,
    )
}

/// A minimal kind for the adversarial test plugin (`tests/guests/adversarial`).
pub fn probe_crd() -> Value {
    test_crd("Probe", "Namespaced")
}

/// A minimal kind `kind` of group `test.wasmop.io`, any spec and status, of `scope`
/// (`Namespaced` or `Cluster`).
pub fn test_crd(kind: &str, scope: &str) -> Value {
    let (singular, plural) = (kind.to_lowercase(), test_resource(kind).plural);
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.test.wasmop.io")},
        "spec": {
            "group": "test.wasmop.io",
            "names": {"kind": kind, "plural": plural, "singular": singular, "listKind": format!("{kind}List")},
            "scope": scope,
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    })
}

/// How a [`Host`] is started.
#[must_use = "a Launch does nothing until started"]
pub struct Launch {
    kubeconfig: PathBuf,
    namespace: String,
    watch: Option<String>,
    args: Vec<String>,
    envs: Vec<(String, String)>,
}

impl Launch {
    /// Reconciles only in `namespace`.
    pub fn watch(mut self, namespace: &str) -> Self {
        self.watch = Some(namespace.to_string());
        self
    }

    /// Reconciles in every namespace (a sharded replica, or a host serving many tenants).
    pub fn everywhere(mut self) -> Self {
        self.watch = None;
        self
    }

    /// Runs as the pod `pod` (`POD_NAME`, its Lease identity).
    pub fn pod(self, pod: &str) -> Self {
        self.env("POD_NAME", pod)
    }

    /// Adds `args` to `wasmop run`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Sets the environment variable `key`.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_string(), value.to_string()));
        self
    }

    /// Starts it; its log goes to `target/e2e-logs/`.
    pub fn start(self) -> Host {
        let dir = test_artifacts::workspace_root().join("target/e2e-logs");
        std::fs::create_dir_all(&dir).unwrap();
        let name = self.watch.as_deref().unwrap_or(&self.namespace);
        let log = dir.join(format!("{name}-{}.log", nanos()));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(wasmop_bin());
        cmd.args(["run", "--namespace", &self.namespace]);
        if let Some(watch) = &self.watch {
            cmd.args(["--watch-namespace", watch]);
        }
        cmd
            // Hosts run side by side: let each pick free ports.
            .args([
                "--probe-addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,wasmop=debug")
            .envs(self.envs)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = testenv::spawn_tied(cmd).expect("start wasmop run");
        Host { child, log }
    }
}

/// The `wasmop` binary cargo built beside the running test (`target/<profile>/`: a test
/// binary runs from `deps/` below it).
pub fn wasmop_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary runs from target/<profile>/deps");
    let bin = dir.join("wasmop");
    assert!(
        bin.exists(),
        "{} is not built: run the suite with cargo test -p wasmop",
        bin.display()
    );
    bin
}

/// The host, `wasmop run`, as a real process; killed when dropped.
pub struct Host {
    child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Host {
    /// `wasmop run` with its plugins in `namespace`, reconciling there too unless the
    /// [`Launch`] says otherwise.
    pub fn build(kubeconfig: &Path, namespace: &str) -> Launch {
        Launch {
            kubeconfig: kubeconfig.to_path_buf(),
            namespace: namespace.to_string(),
            watch: Some(namespace.to_string()),
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The host's log so far, for assertion messages.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, no goodbye.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed");
        self.child.wait().expect("waiting for the host")
    }

    /// The address the host serves `/healthz`, `/readyz` and `/metrics` on (started with
    /// port 0, it logs the one it got).
    pub async fn http_addr(&self) -> String {
        testenv::wait_for("the host to log its HTTP address", TIMEOUT, || async {
            let logs = self.logs();
            let line = logs.lines().find(|l| l.contains("serving HTTP"));
            Ok::<_, String>(line.and_then(|l| {
                let start = l.find("127.0.0.1:")?;
                // In JSON logs a quote follows the address; in text logs it ends the line.
                let rest = &l[start..];
                let end = rest
                    .find(|c: char| c != '.' && c != ':' && !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                Some(rest[..end].to_string())
            }))
        })
        .await
        .expect("HTTP address")
    }

    /// The exit status, once the process has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.exit_status().is_none()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A plain HTTP/1.1 GET: status code and body.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Creates Probe `name`, a parent of the adversarial plugin; returns the Probes of the
/// test's namespace.
pub async fn put_probe(env: &Env, name: &str) -> Api<DynamicObject> {
    let probes =
        Api::<DynamicObject>::namespaced_with(env.client.clone(), env.name(), &probe_resource());
    let probe = json!({"apiVersion": "test.wasmop.io/v1", "kind": "Probe", "metadata": {"name": name}, "spec": {}});
    probes
        .patch(name, &PatchParams::apply("e2e"), &Patch::Apply(&probe))
        .await
        .unwrap();
    probes
}

/// Waits until parent `name` has `Ready=False`; returns that condition.
pub async fn wait_not_ready(api: &Api<DynamicObject>, name: &str, host: &Host) -> Value {
    let ready = |status: &Value| {
        status["conditions"]
            .as_array()
            .and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == "Ready" && c["status"] == "False")
            })
            .cloned()
    };
    let status = testenv::wait_until(
        &format!("{name} to be marked Ready=False"),
        TIMEOUT,
        || async { api.get(name).await.map(|p| p.data["status"].clone()) },
        |s| ready(s).is_some(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    ready(&status).expect("just seen")
}

/// The core/v1 Events in the test's namespace.
pub async fn events(env: &Env) -> Vec<Event> {
    let api: Api<Event> = env.ns.api();
    api.list(&ListParams::default()).await.unwrap().items
}

/// The core/v1 Events in the test's namespace about `kind/name`.
pub async fn events_for(env: &Env, kind: &str, name: &str) -> Vec<Event> {
    let about = |e: &Event| {
        e.involved_object.kind.as_deref() == Some(kind)
            && e.involved_object.name.as_deref() == Some(name)
    };
    events(env).await.into_iter().filter(about).collect()
}

/// Waits for ConfigMap `name` in the test's namespace (a plugin's child); the host's log in
/// the panic message if it never comes.
pub async fn wait_configmap(env: &Env, name: &str, host: &Host) -> ConfigMap {
    let configmaps: Api<ConfigMap> = env.ns.api();
    testenv::wait_until(
        &format!("ConfigMap {name}"),
        TIMEOUT,
        || async { configmaps.get_opt(name).await },
        Option::is_some,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()))
    .expect("just seen")
}

/// Waits for an Event with `reason` about `kind/name` in the test's namespace; returns it.
pub async fn wait_event(env: &Env, kind: &str, name: &str, reason: &str) -> Event {
    let has = |e: &Event| e.reason.as_deref() == Some(reason);
    testenv::wait_until(
        &format!("a {reason} Event on {kind} {name}"),
        TIMEOUT,
        || async { Ok::<_, kube::Error>(events_for(env, kind, name).await) },
        |events| events.iter().any(has),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .into_iter()
    .find(has)
    .expect("just seen")
}
