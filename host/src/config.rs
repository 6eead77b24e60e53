//! Every default of the host, documented once.
//!
//! The stages take their `Default` impls from here ([`crate::sandbox::Limits`],
//! [`crate::controller::Config`], [`crate::sandbox::SandboxConfig`]) and the command line takes
//! its `--flag` defaults from here, so a default is changed in one place. This module sits
//! below every stage and imports none of them.

use std::time::Duration;

/// The namespace the host loads plugin ConfigMaps from when it runs outside a pod (in a pod,
/// its own namespace). `wasmop package` and `wasmop rbac` use it too.
pub const NAMESPACE: &str = "wasmop-system";

/// The host's ServiceAccount, as `deploy/` installs it.
pub const SERVICE_ACCOUNT: &str = "wasmop";

/// Deadline of one plugin call (wall time while the guest runs), in milliseconds (`--deadline-ms`, annotation
/// `wasmop.io/deadline-ms`).
pub const DEADLINE_MS: u64 = 1000;

/// Linear-memory cap of one plugin instance, in MiB (`--memory-mib`, annotation
/// `wasmop.io/memory-mib`).
pub const MEMORY_MIB: u64 = 64;

/// Largest response of one plugin call, in KiB (`--max-response-kib`, annotation
/// `wasmop.io/max-response-kib`).
pub const MAX_RESPONSE_KIB: u64 = 4096;

/// Most JSON values one response may hold (object keys count as values), counted before it
/// is parsed: bytes alone do not bound the parse, as 4 MiB of `[0],[0],…` is a million arrays
/// of a few hundred heap bytes each. A legitimate response is far below: at most 500 children
/// (`wasmop_contract::validate::MAX_CHILDREN`) and 50 Events, and a Deployment with its pod
/// template is one or two hundred values, so 250,000 leaves 500 values for each of 500
/// children; a response of a million values is refused whole. Not an annotation: what the host
/// parses is the host's to bound.
pub const RESPONSE_MAX_VALUES: u64 = 250_000;

/// Deepest nesting of objects and arrays in one response, counted with
/// [`RESPONSE_MAX_VALUES`]. A child sits two levels down (`{"children":[…]}`) and a
/// Kubernetes object nests about 20 deep (a CRD's schema a few more per level of properties),
/// so 64 leaves a wide margin and stays well below `serde_json`'s own limit of 128, which the
/// host's caches could not parse back anyway.
pub const RESPONSE_MAX_DEPTH: u32 = 64;

/// The values a plugin ConfigMap's `wasmop.io/deadline-ms` may take: up to one minute.
pub const DEADLINE_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=60_000;

/// The values of `wasmop.io/memory-mib`: up to the sandbox's 1 GiB ceiling.
pub const MEMORY_MIB_RANGE: std::ops::RangeInclusive<u64> = 1..=1024;

/// The values of `wasmop.io/max-response-kib`: up to 64 MiB.
pub const MAX_RESPONSE_KIB_RANGE: std::ops::RangeInclusive<u64> = 1..=65_536;

/// The values of `wasmop.io/resync-seconds`: up to 30 days.
pub const RESYNC_SECONDS_RANGE: std::ops::RangeInclusive<u64> = 1..=2_592_000;

/// Parents reconciled at the same time, per plugin, over every shard a host holds
/// (`--concurrency`).
pub const CONCURRENCY: usize = 4;

/// Every parent is reconciled this often even when nothing changed, in seconds
/// (`--resync-seconds`, annotation `wasmop.io/resync-seconds`).
pub const RESYNC_SECONDS: u64 = 600;

/// How long a reconcile waits after a child or related object changed, in milliseconds
/// (`--debounce-ms`), so a burst becomes one reconcile. Parent changes are not delayed.
pub const DEBOUNCE_MS: u64 = 500;

/// First retry delay after a failed reconcile; each further failure doubles it.
pub const BACKOFF_BASE: Duration = Duration::from_millis(250);

/// Longest retry delay after failed reconciles.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Linear memory all plugin calls together may hold, in MiB (`--sandbox-memory-mib`): with the
/// host's own baseline it fits the 256 Mi limit of `deploy/`.
pub const SANDBOX_MEMORY_MIB: u64 = 160;

/// What the on-disk compile cache may hold, in MiB: 64 of the 160 Mi `emptyDir` of `deploy/`
/// (a compiled plugin takes one or two, the Starlark interpreter 16), and compiled functions half
/// as much again.
pub const COMPILE_CACHE_MIB: u64 = 64;
/// What the on-disk cache of modules pulled from registries may hold, in MiB
/// (`plugin::oci::ModuleCache`): with the compile cache and its compiled functions, 128 MiB,
/// within the 160 Mi `emptyDir` of `deploy/`. A module past it is still kept, alone.
pub const MODULE_CACHE_MIB: u64 = 32;
/// How long compiling one module may take before its load fails. Compiling cannot be
/// interrupted, so the thread runs on to the end in the background, holding its slot.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(60);
/// Modules compiled at once: one slow module cannot hold up the loads of the others, and a
/// flood of slow modules cannot take every core (each compile is parallel inside already).
pub const COMPILE_SLOTS: usize = 2;

/// The largest module a plugin ConfigMap may hold, inflated, in MiB: a `.wasm.gz` whose gzip
/// trailer declares more, or that inflates past what it declares, is refused (a gzip bomb).
/// The compiler child refuses the same.
pub const MODULE_MAX_MIB: u64 = 64;
/// Inflated module bytes that plugin loads may hold at once, in MiB: those being inflated,
/// waiting for a compile slot ([`COMPILE_SLOTS`]) or being compiled. A load reserves its
/// module's size (a `.wasm.gz`'s as its gzip trailer declares it, the most it is let inflate
/// to) before inflating anything; one that would pass the budget waits, in order, for earlier
/// loads to end, so however many plugin ConfigMaps arrive at once the host never holds more
/// than this for their sources. It is [`MODULE_MAX_MIB`], so the largest module always loads
/// (alone), and small ones load side by side. Outside it: the stored (gzipped) form each
/// ConfigMap keeps while its version runs or waits (at most a ConfigMap's size), and the copy
/// a child compiler is sent while it compiles.
pub const MODULE_BUDGET_MIB: u64 = MODULE_MAX_MIB;

/// How long a host waits for a compiled artifact another replica shared before compiling the
/// plugin itself.
pub const ARTIFACT_FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Plugin calls that may run at once over all plugins; more wait for a slot.
pub const MAX_INSTANCES: u32 = 64;

/// Script instances kept between calls, over all script plugins (each holds its pool slot
/// and its linear memory); a script whose instance was pushed out parses again.
pub const WARM_SCRIPTS: usize = 16;

/// Linear memory, in MiB, that script instances kept between calls may hold together (out of
/// the sandbox's budget); an instance larger than that is dropped after its call.
pub const WARM_SCRIPTS_MIB: u64 = 32;

/// How often the finalizers of plugins whose ConfigMaps are gone are looked for (besides
/// after every list and deletion of plugin ConfigMaps): a sweep that failed, or that waited
/// for this replica to lead or hold its shard, is tried again this often.
pub const FINALIZER_SWEEP: Duration = Duration::from_secs(60);

/// How often `wasmop run` hands back the pages of its binary's code: those it runs come back on
/// their next use, the rest (start-up's, a plugin load's, a burst's) stay out
/// ([`crate::memory::release_code_pages`]). One release took 6–10 ms (reading
/// `/proc/self/smaps`), then a fault per 64 KiB of code in use.
pub const CODE_PAGES_RELEASE: Duration = Duration::from_secs(10);

/// How often a plugin whose kinds are not served yet (a missing CRD) is checked again.
pub const KIND_RETRY: Duration = Duration::from_secs(5);

/// How often a plugin the host may not serve (missing RBAC) is checked again.
pub const ACCESS_RETRY: Duration = Duration::from_secs(30);
/// How soon a version whose registry was down, slow or refused its pull Secret is first
/// fetched again; the version before it keeps running meanwhile.
pub const REGISTRY_RETRY: Duration = Duration::from_secs(10);
/// The longest wait between fetches of such a version: each failed fetch doubles the wait
/// from [`REGISTRY_RETRY`] up to this.
pub const REGISTRY_RETRY_MAX: Duration = Duration::from_secs(300);

/// Where `/healthz` and `/readyz` are served (`--probe-addr`).
pub const PROBE_ADDR: &str = "0.0.0.0:8081";

/// Where `/metrics` is served (`--metrics-addr`).
pub const METRICS_ADDR: &str = "0.0.0.0:8080";

/// The leader-election Lease in the host's namespace (`--lease-name`).
pub const LEASE_NAME: &str = "wasmop-leader";

/// Prefix of the shard Leases of a sharded host (`--shards`).
pub const SHARD_LEASE_PREFIX: &str = "wasmop-shard";

/// How long a leader's Lease is valid without renewal, in seconds
/// (`--lease-duration-seconds`; controller-runtime's default).
pub const LEASE_DURATION_SECONDS: u64 = 15;

/// How long before its Lease expires the leader renews it, in seconds
/// (`--lease-renew-grace-seconds`): renewal after 10 s by default.
pub const LEASE_RENEW_GRACE_SECONDS: u64 = 5;

/// Longest wait for a TCP and TLS connection to the API server.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for the API server's answer (between reads of one response, counted from the
/// request): a connection that stops answering fails the call after this, and the caller
/// retries with backoff.
pub const API_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest time sending one request may take.
pub const API_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The server ends each watch after this many seconds and the host watches again from where
/// it was; a watch silent 5 s longer than this is taken for dead and re-established. It is
/// below [`API_READ_TIMEOUT`], which would otherwise cut a quiet watch first.
pub const WATCH_TIMEOUT_SECONDS: u32 = 25;

/// A leader that lost its Lease waits this long for its reconciles in flight, then exits
/// anyway (their writes are already refused by the fence).
pub const LOST_LEASE_GRACE: Duration = Duration::from_secs(5);

/// `/healthz` fails once the plugin registry's loop has not turned for this long.
pub const REGISTRY_STALL: Duration = Duration::from_secs(60);

/// `/healthz` fails once a watch has failed without a success for this long.
pub const WATCH_STALL: Duration = Duration::from_secs(120);

/// After the shutdown signal the host waits this long for its reconciles in flight (and the
/// Lease's release), then exits anyway: well inside a pod's default 30 s grace period.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// How long a controller being stopped (a swap that changes kinds, a CRD gone, the host
/// stopping) may take to finish its reconciles in flight before it is aborted, so that the
/// plugin registry's loop never waits longer on it. A stop that releases the plugin's
/// finalizer is not cut short.
pub const CONTROLLER_STOP_GRACE: Duration = Duration::from_secs(30);

/// Longest retry delay after a reconcile failed because the API server could not be reached
/// or could not serve it (no answer, 429, 5xx): failures piled up during an outage must not
/// push the retry long past its end.
pub const TRANSIENT_RETRY_MAX: Duration = Duration::from_secs(8);

/// A watched kind is taken for gone (its CRD deleted), and its plugin paused, once the API
/// server has answered its watch with 404 for this long: an apiserver that just started
/// answers 404 for custom resources until it has read their CRDs.
pub const KIND_GONE_AFTER: Duration = Duration::from_secs(10);

/// How long the answer to "may this plugin's identity read this kind here" is kept: a grant or
/// a revocation of a plugin's read takes effect within this time (`plugin::reads`).
pub const READ_REVIEW_TTL: Duration = Duration::from_secs(30);

/// Objects one plugin may create a minute, with a burst of as many (`--creates-per-minute`): a
/// chain of plugins and built-in controllers that multiplies objects is slowed to this and
/// reported (`apply::budget`). Generous: a host starting on 1000 new parents creates their
/// children at once.
pub const CREATES_PER_MINUTE: u32 = 3000;
