//! The command line of the `wasmop` binary.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config;
use crate::sandbox::Limits;

/// A Kubernetes operator host whose reconcile logic runs in WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "wasmop", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `wasmop`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host: load plugins from ConfigMaps and reconcile their parents.
    Run(RunArgs),
    /// Call a plugin offline on a parent and observed objects, and print what the host would
    /// apply.
    #[command(after_help = crate::cmd::render::AFTER_HELP)]
    Render(RenderArgs),
    /// Print a plugin's manifest, digest and size.
    Inspect(InspectArgs),
    /// Print a plugin module as the ConfigMap the host loads it from (gzipped when that is
    /// smaller), after checking that it loads.
    Package(PackageArgs),
    /// Print what a plugin needs: its ServiceAccount, the rights it writes and reads with, the
    /// host's rights to watch its kinds and to impersonate it (ClusterRoles, or Roles in one
    /// namespace with --watch-namespace; resource plurals are guessed offline from kind names:
    /// see --plural).
    Rbac(RbacArgs),
    /// Record, from a live cluster, the requests the host would send a plugin's live revision
    /// and its answers, one file per parent, for `wasmop replay`.
    Capture(CaptureArgs),
    /// Run a build on captured requests and print how its answers differ; non-zero exit when
    /// any does.
    Replay(ReplayArgs),
    /// Push a plugin module to an OCI registry as a wasm artifact, after checking that it
    /// loads, and print the reference pinned to the digest it was stored under.
    Push(PushArgs),
    /// Build this host's container image (no container engine needed) and push it to an OCI
    /// registry; print the reference pinned to its digest.
    Image(ImageArgs),
    /// Show and steer how a plugin's revisions go live: status, history, diff, undo, promote,
    /// abort.
    Rollout(RolloutArgs),
    /// Create a standalone plugin crate: a parent kind, reconcile logic with tests, the CRD
    /// written from the Rust types, a sample, and the commands to build and install it.
    New(NewArgs),
    /// Run a script plugin's tests: the `test_*` functions of the `*_test.star` files beside
    /// it, each in the sandbox under the plugin's limits; non-zero exit when any fails.
    #[command(after_help = crate::cmd::test::AFTER_HELP)]
    Test(TestArgs),
    /// What `wasmop run` starts to compile a plugin in a process of its own: a module on
    /// stdin, the compiled artifact on stdout.
    #[command(name = "compile-plugin", hide = true)]
    CompilePlugin(CompilePluginArgs),
}

/// `wasmop compile-plugin`.
#[derive(Debug, Args)]
pub struct CompilePluginArgs {
    /// The pool size of the host's engine, which this one must match.
    #[arg(long)]
    pub max_instances: u32,
    /// The host's cache directory, whose compiled functions (`functions.pack`) this compile
    /// reads and adds to.
    #[arg(long)]
    pub functions: Option<PathBuf>,
    /// What `functions.pack` may hold, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub functions_max_bytes: u64,
    /// Write the artifact to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `wasmop test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// A directory holding one script (`*.star`) and its tests, or the script itself.
    #[arg(default_value = ".")]
    pub path: PathBuf,
    /// Sandbox limits, for each test function (its file's top level included).
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// `wasmop new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The plugin's name: the crate, the plugin and its ConfigMap (lowercase letters, digits
    /// and '-').
    pub name: String,
    /// Where to create it (absent or empty). Default: ./NAME.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Depend on the SDK in this directory (`guest-sdk/` of a wasmop checkout) instead of the
    /// copy this binary writes into the new crate's `sdk/`.
    #[arg(long, value_name = "DIR")]
    pub sdk_path: Option<PathBuf>,
    /// The parent kind. Default: NAME in UpperCamelCase (`web-app` → `WebApp`).
    #[arg(long)]
    pub kind: Option<String>,
    /// The parent's API group.
    #[arg(long, default_value = "example.com")]
    pub group: String,
    /// The parent's API version.
    #[arg(long, default_value = "v1alpha1")]
    pub version: String,
    /// The parent's resource plural. Default: guessed from the kind, as `wasmop rbac` does.
    #[arg(long)]
    pub plural: Option<String>,
    /// The plugin's language: a Rust crate built to WebAssembly, or a Starlark script that
    /// the `wasmop` binary runs (no toolchain).
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
}

/// The languages `wasmop new` writes a plugin in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A crate with the SDK, built for `wasm32-wasip2`.
    Rust,
    /// `plugin.star`, with a CRD written out as YAML.
    Starlark,
}

/// `wasmop capture`.
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// The plugin's ConfigMap.
    pub plugin: String,
    /// The directory to write the capture to.
    #[arg(long)]
    pub out: PathBuf,
    /// Capture this parent only, as `namespace/name` (repeatable). Default: every parent.
    #[arg(long = "parent", value_name = "NAMESPACE/NAME")]
    pub parents: Vec<String>,
    /// The host's namespace, where the plugin ConfigMaps and their revisions are.
    #[arg(long, short, default_value = config::NAMESPACE)]
    pub namespace: String,
    /// List parents, children and related objects in this namespace only.
    #[arg(long)]
    pub watch_namespace: Option<String>,
}

/// `wasmop replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The build to replay (`.wasm`, or a script such as `plugin.star`).
    #[arg(long)]
    pub plugin: PathBuf,
    /// A directory `wasmop capture` wrote.
    pub dir: PathBuf,
    /// Sandbox limits.
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// `wasmop rollout`.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// What to do.
    #[command(subcommand)]
    pub verb: RolloutVerb,
    /// The plugin's ConfigMap.
    #[arg(global = true, default_value = "")]
    pub plugin: String,
    /// The host's namespace, where the plugin ConfigMaps and their revisions are.
    #[arg(long, short, global = true, default_value = config::NAMESPACE)]
    pub namespace: String,
}

/// The verbs of `wasmop rollout`, as `kubectl rollout` names them.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum RolloutVerb {
    /// The live revision, and a candidate's progress.
    Status,
    /// Every revision kept, oldest first.
    History,
    /// What a previewed candidate would change, parent by parent.
    Diff,
    /// Put an earlier revision back in the ConfigMap: the one live before, or --to-revision.
    Undo {
        /// The revision to go back to.
        #[arg(long)]
        to_revision: Option<i64>,
    },
    /// Make the candidate (or an aborted revision) live for every parent now.
    Promote,
    /// Abort the canary: its parents go back to the live revision.
    Abort,
}

/// Sandbox limits for one plugin. Defaults are the host's defaults.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Deadline of one plugin call (wall time while the guest runs), in milliseconds.
    #[arg(long, default_value_t = config::DEADLINE_MS)]
    pub deadline_ms: u64,
    /// Linear-memory cap of one plugin instance, in MiB.
    #[arg(long, default_value_t = config::MEMORY_MIB)]
    pub memory_mib: u64,
    /// Largest response a plugin may return, in KiB.
    #[arg(long, default_value_t = config::MAX_RESPONSE_KIB)]
    pub max_response_kib: u64,
}

impl From<&LimitArgs> for Limits {
    fn from(args: &LimitArgs) -> Self {
        Limits::new(args.deadline_ms, args.memory_mib, args.max_response_kib)
    }
}

/// `wasmop run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Namespace whose ConfigMaps labelled `wasmop.io/plugin` hold the plugins. Defaults to the
    /// pod's namespace in a cluster, `wasmop-system` outside one.
    #[arg(long, env = "WASMOP_NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile parents in this namespace only (children and related objects are watched
    /// there too). By default the host watches every namespace.
    #[arg(long, env = "WASMOP_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Default sandbox limits, for plugins whose ConfigMap sets none.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Linear memory all plugin calls together may hold, in MiB, whatever each plugin's cap:
    /// a call that would pass it fails (and is retried) instead of growing the host.
    #[arg(long, default_value_t = config::SANDBOX_MEMORY_MIB)]
    pub sandbox_memory_mib: u64,
    /// Do not share compiled plugins with the host's other replicas through the cluster (the
    /// Secret `wasmop-artifact-key` and ConfigMaps `wasmop-artifact-*` in `--namespace`); each
    /// pod then compiles every plugin itself.
    #[arg(long)]
    pub no_shared_artifacts: bool,
    /// Parents reconciled at the same time, per plugin, over every shard this host holds.
    #[arg(long, default_value_t = config::CONCURRENCY)]
    pub concurrency: usize,
    /// Reconcile every parent this often even when nothing changed, in seconds (a plugin's
    /// ConfigMap can override it with the annotation `wasmop.io/resync-seconds`).
    #[arg(long, default_value_t = config::RESYNC_SECONDS)]
    pub resync_seconds: u64,
    /// How long a reconcile waits after a child or related object changes, in milliseconds,
    /// so a burst of changes (pods coming up one by one) becomes one reconcile and one status
    /// write. Changes to the parent are not delayed.
    #[arg(long, default_value_t = config::DEBOUNCE_MS)]
    pub debounce_ms: u64,
    /// Objects each plugin may create a minute, with a burst of as many. A create past it
    /// waits, and its parent says `CreateBudgetExceeded`: a chain of plugins and built-in
    /// controllers that multiplies objects is slowed, not unbounded. Updates are not counted.
    #[arg(long, default_value_t = config::CREATES_PER_MINUTE)]
    pub creates_per_minute: u32,
    /// A kind that may be one plugin's child kind and another's (or the same resource's)
    /// parent kind, as `Kind.group` (`Deployment.apps`, or `Pod` for the core group);
    /// repeatable. Without it such a pair is refused at load: each child would become a
    /// parent, which is how a plugin feeds itself.
    #[arg(long, value_name = "KIND")]
    pub allow_chain: Vec<String>,
    /// Where `/healthz` and `/readyz` are served.
    #[arg(long, default_value = config::PROBE_ADDR)]
    pub probe_addr: std::net::SocketAddr,
    /// Where `/metrics` is served (may equal `--probe-addr`).
    #[arg(long, default_value = config::METRICS_ADDR)]
    pub metrics_addr: std::net::SocketAddr,
    /// Reconcile only while holding the leader Lease (`--lease-name`, `wasmop-leader`) in
    /// `--namespace`, so several replicas can run with one active.
    #[arg(long)]
    pub leader_elect: bool,
    /// A YAML file saying which registry plugins must carry a cosign signature and by which
    /// keys (`docs/security.md`). The cluster admin's: mount it from an object that plugin
    /// authors may not write. Without it, registry plugins load unsigned.
    #[arg(long, env = "WASMOP_SIGNATURE_POLICY")]
    pub signature_policy: Option<PathBuf>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = config::LEASE_NAME)]
    pub lease_name: String,
    /// How long a leader's (or a shard's) Lease is valid without renewal, in seconds (with
    /// `--shards`, at least 6).
    #[arg(long, default_value_t = config::LEASE_DURATION_SECONDS)]
    pub lease_duration_seconds: u64,
    /// How long before the Lease expires the leader renews it, in seconds (the leader renews
    /// after `lease-duration − renew-grace`, 10 s by default).
    #[arg(long, default_value_t = config::LEASE_RENEW_GRACE_SECONDS)]
    pub lease_renew_grace_seconds: u64,
    /// Share the parents with the other replicas: cut namespaces into this many shards (by
    /// hash), each held by one replica through a Lease of its own (`wasmop-shard-<i>-of-<n>`);
    /// give every replica the same number (replicas of another count, during a rolling update
    /// that changes it, take no shard until the old ones are gone). Not with `--leader-elect`.
    #[arg(long, conflicts_with = "leader_elect", value_parser = clap::value_parser!(u32).range(1..=crate::shard::MAX_SHARDS as i64))]
    pub shards: Option<u32>,
    /// Prefix of the shard Leases' names.
    #[arg(long, default_value = config::SHARD_LEASE_PREFIX)]
    pub shard_lease_prefix: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "WASMOP_LOG_FORMAT")]
    pub log_format: LogFormat,
}

/// How `wasmop run` writes its logs. `RUST_LOG` sets the level (default `info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the fields of every enclosing span.
    Json,
}

/// `wasmop render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The plugin module (`.wasm`), or a script (`.star`).
    #[arg(long)]
    pub plugin: PathBuf,
    /// The parent object (YAML or JSON).
    #[arg(long)]
    pub parent: PathBuf,
    /// Observed objects: multi-document YAML files, or directories of them. Repeatable.
    #[arg(long)]
    pub observed: Vec<PathBuf>,
    /// The plugin's settings (YAML).
    #[arg(long)]
    pub settings: Option<PathBuf>,
    /// Call the plugin as if the parent were being deleted.
    #[arg(long)]
    pub finalizing: bool,
    /// Sandbox limits.
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// `wasmop inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The plugin module (`.wasm`), or a script (`.star`).
    pub plugin: PathBuf,
}

/// `wasmop package`.
#[derive(Debug, Args)]
pub struct PackageArgs {
    /// The plugin module (`.wasm`), a script (`.star`), or a module in a registry
    /// (`oci://REGISTRY/REPOSITORY[:TAG][@sha256:…]`: pulled and checked, a tag resolved to
    /// its digest now, and the ConfigMap names it pinned).
    pub plugin: PathBuf,
    /// Name of the ConfigMap and of its module key (`<name>.wasm` or `<name>.wasm.gz`; a script keeps its file name).
    /// Defaults to the plugin's manifest name.
    #[arg(long)]
    pub name: Option<String>,
    /// Namespace of the ConfigMap: the host's plugin namespace.
    #[arg(long, default_value = config::NAMESPACE)]
    pub namespace: String,
    /// Settings handed to every reconcile (YAML), stored as `settings.yaml`.
    #[arg(long)]
    pub settings: Option<PathBuf>,
    /// For a registry module: the Docker config whose entry for the registry holds the
    /// credentials to pull it here.
    #[arg(long)]
    pub docker_config: Option<PathBuf>,
    /// For a registry module: the pull Secret the host uses (`wasmop.io/pull-secret`).
    #[arg(long)]
    pub pull_secret: Option<String>,
}

/// `wasmop push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The plugin module (`.wasm`).
    pub plugin: PathBuf,
    /// Where to: `oci://REGISTRY/REPOSITORY[:TAG]` (a registry on loopback is spoken to over
    /// HTTP, any other over HTTPS).
    pub reference: String,
    /// A Docker config (`~/.docker/config.json`, or a `.dockerconfigjson`) whose entry for the
    /// registry holds the credentials.
    #[arg(long)]
    pub docker_config: Option<PathBuf>,
    /// Also sign what was pushed with this ECDSA P-256 key (unencrypted PKCS#8 PEM), as a
    /// cosign signature that a host's `--signature-policy` can require.
    #[arg(long)]
    pub sign_key: Option<PathBuf>,
}

/// `wasmop image`.
#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Where to: `oci://REGISTRY/REPOSITORY[:TAG]`.
    pub reference: String,
    /// The binary the image runs (default: this one). A static build
    /// (`--target x86_64-unknown-linux-musl`) makes an image of one file; a glibc build
    /// brings the libraries it loads, from this machine.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// A Docker config whose entry for the registry holds the credentials.
    #[arg(long)]
    pub docker_config: Option<PathBuf>,
}

/// `wasmop rbac`.
#[derive(Debug, Args)]
pub struct RbacArgs {
    /// The plugin module (`.wasm`), or a script (`.star`).
    pub plugin: PathBuf,
    /// Namespace of the host's ServiceAccount.
    #[arg(long, default_value = config::NAMESPACE)]
    pub namespace: String,
    /// The host's ServiceAccount.
    #[arg(long, default_value = config::SERVICE_ACCOUNT)]
    pub service_account: String,
    /// The plugin's ConfigMap, which names its ServiceAccount `wasmop-plugin-<configmap>`.
    /// Defaults to the manifest name.
    #[arg(long)]
    pub configmap: Option<String>,
    /// What the role and binding names start with. Defaults to the plugin's ServiceAccount
    /// name, `wasmop-plugin-<configmap>`.
    #[arg(long)]
    pub name: Option<String>,
    /// Grant in this namespace only (Roles, not ClusterRoles), for a host run with
    /// `--watch-namespace`.
    #[arg(long)]
    pub watch_namespace: Option<String>,
    /// Resource plural of a kind, as `Kind=plural` (repeatable). Plurals are otherwise guessed
    /// offline from the kind (lowercase, then `es` after s, x, ch or sh, `ies` for a consonant
    /// and y, else `s`); check irregular ones with `kubectl api-resources`.
    #[arg(long = "plural", value_name = "KIND=PLURAL", value_parser = parse_plural)]
    pub plurals: Vec<(String, String)>,
}

fn parse_plural(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((kind, plural)) if !kind.is_empty() && !plural.is_empty() => {
            Ok((kind.to_string(), plural.to_string()))
        }
        _ => Err(format!(
            "expected KIND=PLURAL, e.g. Endpoints=endpoints, got {s:?}"
        )),
    }
}
