//! The sandbox: loads WebAssembly plugins and calls them under limits.
//!
//! A [`Sandbox`] owns one wasmtime engine (pooling allocator, epoch interruption; see
//! `engine.rs`), the linker with the host's imports, and the artifact cache. [`Sandbox::load`]
//! turns module bytes into a [`Plugin`]:
//!
//! 1. digest the bytes (`sha256:<hex>`);
//! 2. compile them, or take the compiled component from the cache (`cache.rs`) or from
//!    another replica through an [`ArtifactStore`] (`shared.rs`, checked against its MAC), on a
//!    blocking thread;
//! 3. link them against the `wasmop:plugin@0.2.0` world (`bindings.rs`) and pre-instantiate;
//! 4. probe: instantiate once and call `manifest`, so a wrong interface fails at load, not on
//!    the first reconcile;
//! 5. validate the manifest (`wasmop_contract::Manifest::validate`).
//!
//! [`Sandbox::load_script`] loads a script instead: the interpreter it names, compiled once for
//! every script, runs the script's top level in an instance that then serves the plugin's calls
//! (`script.rs`, `warm.rs`).
//!
//! Every call then runs in a fresh store and instance (`invoke.rs`; a script's, in its kept
//! instance) with the plugin's [`Limits`]: a deadline, a memory cap and a response-size cap.
//! Before a response is parsed, one pass over its bytes (`scan.rs`) refuses more values or
//! deeper nesting than the host's bounds, and the parse's cost is held from the same memory
//! budget as the stores'. A call that fails, however badly, leaves the plugin usable for the
//! next one. Failures are typed ([`PluginErrorKind`]),
//! each with a reason string for Events.
//!
//! ```no_run
//! # async fn demo(wasm: Vec<u8>, req: wasmop_contract::wire::WireRequest) -> anyhow::Result<()> {
//! use wasmop::sandbox::{Limits, Sandbox, SandboxConfig};
//!
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let plugin = sandbox.load(wasm, Limits::default()).await?;
//! let response = plugin.reconcile(&req).await?;
//! # Ok(()) }
//! ```

mod bindings;
mod cache;
mod compile;
mod engine;
mod error;
mod functions;
mod invoke;
mod limits;
mod manifest;
mod output;
mod plugin;
mod scan;
mod script;
mod shared;
mod warm;
mod wasi;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::{Component, HasSelf, Linker};

pub use compile::{COMPILE_COMMAND, Compiler, Order as CompileOrder, serve as serve_compile};
pub use engine::KEEP_RESIDENT;
pub use error::{Call, PluginError, PluginErrorKind, SandboxError, UNKNOWN_PLUGIN};
pub use limits::{Limits, MEMORY_CEILING, MemoryBudget};
pub use plugin::Plugin;
pub use script::{Language, TestFile, TestOutcome};
pub use shared::{Artifact, ArtifactName, ArtifactStore, SealKey, Sealed, ShortKey, Vouched};

use crate::text::hex;
use bindings::{Plugin as Bindings, PluginPre};
use cache::{ArtifactCache, Origin};
use compile::Compiling;
use functions::FunctionCache;
use invoke::{CallState, Instantiate, Invocation, error_chain};
use limits::Shared;
use script::ScriptText;
use warm::WarmPool;

/// How a [`Sandbox`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Plugin calls that may run at once, over all plugins; more wait for a free slot.
    /// Each slot reserves about 4 GiB of address space (not memory). Default 64.
    pub max_instances: u32,
    /// Where compiled components are cached across restarts; `None` keeps them in memory only.
    /// Default: `$XDG_CACHE_HOME/wasmop`, else `~/.cache/wasmop`, if it can be written to.
    pub cache_dir: Option<PathBuf>,
    /// Bytes the disk cache may hold; the least recently used artifacts are evicted past it.
    /// Compiled functions (`functions.rs`) may take half as much again.
    /// Default [`crate::config::COMPILE_CACHE_MIB`] MiB.
    pub cache_max_bytes: u64,
    /// Linear memory all calls together may hold, in bytes, whatever each plugin's cap says.
    /// Default [`crate::config::SANDBOX_MEMORY_MIB`] MiB.
    pub memory_budget: u64,
    /// How long one compile may take before the load fails. Default
    /// [`crate::config::COMPILE_TIMEOUT`].
    pub compile_timeout: Duration,
    /// Where modules are compiled: in this process (the default), or in a child process of
    /// this program (`wasmop run`), which takes the compiler's memory with it when it exits
    /// and is killed at the timeout.
    pub compiler: Compiler,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            max_instances: crate::config::MAX_INSTANCES,
            cache_dir: default_cache_dir(),
            cache_max_bytes: crate::config::COMPILE_CACHE_MIB << 20,
            memory_budget: crate::config::SANDBOX_MEMORY_MIB << 20,
            compile_timeout: crate::config::COMPILE_TIMEOUT,
            compiler: Compiler::InProcess,
        }
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?;
    let dir = base.join("wasmop");
    writable(&dir).then_some(dir)
}

fn writable(dir: &Path) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    let ok = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Loads plugins into one shared engine. Cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linker: Linker<CallState>,
    cache: ArtifactCache,
    shared: Arc<Shared>,
    // Loads (compile and probe) in progress; a timed-out one keeps its permit until it ends.
    compiles: Arc<Semaphore>,
    compile_timeout: Duration,
    // Where replicas share compiled artifacts, once [`Sandbox::share`] set it.
    store: std::sync::OnceLock<Arc<dyn ArtifactStore>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("slots", &self.inner.shared.slots.available_permits())
            .field("memory_in_use", &self.inner.shared.budget.in_use())
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Builds the engine, starts its epoch ticker and links the host functions.
    pub fn new(cfg: SandboxConfig) -> Result<Self, SandboxError> {
        let functions = cfg
            .cache_dir
            .as_deref()
            .map(|dir| Arc::new(FunctionCache::new(dir, cfg.cache_max_bytes / 2)));
        let engine = engine::new_engine(cfg.max_instances, functions.clone())?;
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker).map_err(|e| SandboxError::Linker(e.into()))?;
        Bindings::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |state| state)
            .map_err(|e| SandboxError::Linker(e.into()))?;
        let compiling = Compiling {
            compiler: cfg.compiler.clone(),
            max_instances: cfg.max_instances,
            timeout: cfg.compile_timeout,
            functions,
        };
        let cache = ArtifactCache::new(
            &engine,
            cfg.cache_dir.as_deref(),
            cfg.cache_max_bytes,
            compiling,
        );
        let shared = Arc::new(Shared {
            slots: Arc::new(Semaphore::new(cfg.max_instances.max(1) as usize)),
            budget: Arc::new(MemoryBudget::new(cfg.memory_budget)),
            warm: WarmPool::new(
                crate::config::WARM_SCRIPTS,
                crate::config::WARM_SCRIPTS_MIB << 20,
            ),
        });
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                linker,
                cache,
                shared,
                compiles: Arc::new(Semaphore::new(crate::config::COMPILE_SLOTS)),
                compile_timeout: cfg.compile_timeout,
                store: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The memory budget all calls draw from.
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.inner.shared.budget
    }

    /// Shares compiled artifacts with the host's other replicas through `store`: a module
    /// compiled nowhere here is first looked for there, and one compiled here is published.
    /// Set once; later calls change nothing.
    pub fn share(&self, store: Arc<dyn ArtifactStore>) {
        let _ = self.inner.store.set(store);
    }

    /// An artifact another replica compiled under `name`, its MAC checked; `None` when
    /// there is none, sharing is off, or this host has it already.
    async fn shared_artifact(&self, name: &ArtifactName) -> Option<Vouched> {
        let store = self.inner.store.get()?;
        if self.inner.cache.has(&name.digest) {
            return None;
        }
        let both = async { Some((store.key().await?, store.fetch(name).await?)) };
        let fetched = tokio::time::timeout(crate::config::ARTIFACT_FETCH_TIMEOUT, both).await;
        let (key, sealed) = fetched.ok().flatten()?;
        match key.open(name, sealed) {
            Some(vouched) => Some(vouched),
            None => {
                tracing::warn!(digest = %name.digest, "a shared compiled artifact fails its MAC; compiling instead");
                None
            }
        }
    }

    /// What the artifact compiled from `digest_hex` is shared as; `source_hex` is the digest
    /// the plugin's revisions record.
    fn artifact_name(&self, digest_hex: &str, source_hex: &str) -> ArtifactName {
        ArtifactName {
            engine: self.inner.cache.engine().to_owned(),
            digest: digest_hex.to_owned(),
            source: source_hex.to_owned(),
        }
    }

    /// Publishes what this host compiled, when sharing is on.
    fn publish(&self, name: ArtifactName, artifact: Artifact) {
        let Some(store) = self.inner.store.get().cloned() else {
            return;
        };
        tokio::spawn(async move {
            let Some(key) = store.key().await else {
                return;
            };
            // The interpreter's 16 MB are hashed from their file: off the runtime's threads.
            let sealed = tokio::task::spawn_blocking(move || {
                key.seal(&name, artifact).map(|sealed| (name, sealed))
            })
            .await;
            match sealed {
                Ok(Ok((name, sealed))) => store.publish(name, sealed).await,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot read a compiled artifact to share it")
                }
                Err(e) => tracing::warn!(error = %e, "sealing a compiled artifact"),
            }
        });
    }

    /// Loads a plugin without blocking the async runtime: compilation and the probe run on a
    /// blocking thread, in the caller's tracing span.
    pub async fn load(&self, wasm: Vec<u8>, limits: Limits) -> Result<Plugin, PluginError> {
        let digest = digest_of(&wasm);
        let digest_hex = &digest["sha256:".len()..];
        let name = self.artifact_name(digest_hex, digest_hex);
        let shared = self.shared_artifact(&name).await;
        let loaded = self
            .off_thread(&digest, move |this| this.load_from(&wasm, limits, shared))
            .await?;
        if let Some(artifact) = loaded.1 {
            self.publish(name, artifact);
        }
        Ok(loaded.0)
    }

    /// Loads a script plugin: `source`, in `language`, held under the key `file`. The
    /// interpreter runs its top level under `limits` (see `script.rs`); the plugin carries
    /// the digest of the script. The compiled interpreter is shared with other replicas as a
    /// compiled module is, under the interpreter's digest and owned by the script's revisions.
    pub async fn load_script(
        &self,
        language: Language,
        file: String,
        source: Vec<u8>,
        limits: Limits,
    ) -> Result<Plugin, PluginError> {
        let digest = digest_of(&source);
        let name = self.artifact_name(language.interpreter_digest(), &digest["sha256:".len()..]);
        let shared = self.shared_artifact(&name).await;
        let loaded = self
            .off_thread(&digest, move |this| {
                this.script_from(language, &file, &source, limits, shared)
            })
            .await?;
        if let Some(artifact) = loaded.1 {
            self.publish(name, artifact);
        }
        Ok(loaded.0)
    }

    /// [`Sandbox::load_script`] on the calling thread.
    pub fn load_script_blocking(
        &self,
        language: Language,
        file: &str,
        source: &[u8],
        limits: Limits,
    ) -> Result<Plugin, PluginError> {
        self.script_from(language, file, source, limits, None)
            .map(|(plugin, _, _)| plugin)
    }

    /// The interpreter comes from the caches, or from `shared`, when either has it; the
    /// script's top level runs in the first instance, which then serves the first call.
    fn script_from(
        &self,
        language: Language,
        file: &str,
        source: &[u8],
        limits: Limits,
        shared: Option<Vouched>,
    ) -> Result<(Plugin, Origin, Option<Artifact>), PluginError> {
        let digest = digest_of(source);
        let fail = |kind| PluginError::new(UNKNOWN_PLUGIN, &digest, kind);
        let text = std::str::from_utf8(source).map_err(|e| {
            fail(PluginErrorKind::NotAComponent(format!(
                "{file} is not UTF-8 text: {e}"
            )))
        })?;
        let limits = limits.clamped();
        let got = self.interpreter(language, &digest, shared)?;
        let script = ScriptText {
            file: file.to_owned(),
            source: text.to_owned(),
        };
        let plugin = self.finish(
            got.component,
            digest.clone(),
            limits,
            source.len(),
            Some(script),
        )?;
        Ok((plugin, got.origin, got.serialized))
    }

    /// Runs `job` (a compile and probe) on a blocking thread once a compile slot is free, in
    /// the caller's tracing span, abandoning it past the compile timeout.
    async fn off_thread(
        &self,
        digest: &str,
        job: impl FnOnce(&Sandbox) -> Result<(Plugin, Origin, Option<Artifact>), PluginError>
        + Send
        + 'static,
    ) -> Result<(Plugin, Option<Artifact>), PluginError> {
        let this = self.clone();
        let (dispatch, span) = plugin::current_tracing();
        let fail = |kind| PluginError::new(UNKNOWN_PLUGIN, digest, kind);
        // Waiting for a slot is not part of the deadline; the compile is.
        let permit = this
            .inner
            .compiles
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| fail(PluginErrorKind::Internal(format!("compile slots: {e}"))))?;
        let limit = self.inner.compile_timeout;
        let started = std::time::Instant::now();
        let load = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            tracing::dispatcher::with_default(&dispatch, || span.in_scope(|| job(&this)))
        });
        match tokio::time::timeout(limit, load).await {
            Ok(Ok(Ok((plugin, origin, serialized)))) => {
                tracing::info!(
                    plugin = %plugin.manifest().name,
                    digest = %plugin.digest(),
                    component = origin.as_str(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "plugin module ready"
                );
                Ok((plugin, serialized))
            }
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(e)) => Err(fail(PluginErrorKind::Internal(format!(
                "plugin load thread: {e}"
            )))),
            Err(_) => Err(fail(PluginErrorKind::NotAComponent(format!(
                "compiling took longer than {limit:?}; it was abandoned"
            )))),
        }
    }

    /// Bytes that freed pool slots keep resident (linear memories and tables), ready for the
    /// next call: at most [`KEEP_RESIDENT`] per memory or table slot ever used.
    pub fn pool_resident_bytes(&self) -> usize {
        self.inner
            .engine
            .pooling_allocator_metrics()
            .map_or(0, |m| {
                m.unused_memory_bytes_resident() + m.unused_table_bytes_resident()
            })
    }

    /// [`Sandbox::load`] on the calling thread (compiling may take 100 ms), without shared
    /// artifacts.
    pub fn load_blocking(&self, wasm: &[u8], limits: Limits) -> Result<Plugin, PluginError> {
        self.load_from(wasm, limits, None)
            .map(|(plugin, _, _)| plugin)
    }

    /// Loads, taking the component from `shared` if the caches lack it; says where it came
    /// from, and gives the serialised component when it was compiled here.
    fn load_from(
        &self,
        wasm: &[u8],
        limits: Limits,
        shared: Option<Vouched>,
    ) -> Result<(Plugin, Origin, Option<Artifact>), PluginError> {
        let limits = limits.clamped();
        let digest = digest_of(wasm);
        let digest_hex = &digest["sha256:".len()..];
        let fail = |kind| PluginError::new(UNKNOWN_PLUGIN, &digest, kind);

        let detail = match sniff(wasm) {
            Binary::Component => None,
            Binary::CoreModule => Some(
                "a core WebAssembly module, not a component (build the plugin for wasm32-wasip2)",
            ),
            Binary::NotWasm => Some("not WebAssembly at all (no `\\0asm` header)"),
        };
        if let Some(detail) = detail {
            return Err(fail(PluginErrorKind::NotAComponent(detail.into())));
        }
        let got = self
            .inner
            .cache
            .get_or_compile(&self.inner.engine, digest_hex, wasm, shared)
            .map_err(|e| fail(PluginErrorKind::NotAComponent(error_chain(&e))))?;
        let plugin = self.finish(got.component, digest, limits, wasm.len(), None)?;
        Ok((plugin, got.origin, got.serialized))
    }

    /// Runs `f` in a fresh instance of `pre` under `limits`, for a plugin not named yet (a
    /// load's probe, a script's `init` or tests), once a call slot is free.
    fn run_unnamed<P: Instantiate, R>(
        &self,
        pre: &P,
        limits: &Limits,
        call: Call,
        probing: bool,
        f: impl FnOnce(&P::Instance, &mut wasmtime::Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginErrorKind> {
        let _slot = self.slot()?;
        self.invocation(pre, limits, call, probing).run(f)
    }

    /// A call slot, waited for on this thread.
    fn slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, PluginErrorKind> {
        futures::executor::block_on(self.inner.shared.slots.acquire())
            .map_err(|e| PluginErrorKind::Internal(e.to_string()))
    }

    /// A call of a plugin not named yet.
    fn invocation<'a, P: Instantiate>(
        &'a self,
        pre: &'a P,
        limits: &'a Limits,
        call: Call,
        probing: bool,
    ) -> Invocation<'a, P> {
        Invocation {
            engine: &self.inner.engine,
            pre,
            limits,
            budget: &self.inner.shared.budget,
            plugin: UNKNOWN_PLUGIN,
            call,
            probing,
        }
    }

    /// Links a compiled component, asks its manifest under `limits` and checks it. A script's
    /// interpreter runs `init` first, in the instance that then waits for the first call.
    fn finish(
        &self,
        component: Component,
        digest: String,
        limits: Limits,
        size: usize,
        script: Option<ScriptText>,
    ) -> Result<Plugin, PluginError> {
        let fail = |kind| PluginError::new(UNKNOWN_PLUGIN, &digest, kind);
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| fail(PluginErrorKind::WrongInterface(error_chain(&e))))?;
        let pre = PluginPre::new(instance_pre)
            .map_err(|e| fail(PluginErrorKind::WrongInterface(error_chain(&e))))?;

        let ask = |bindings: &Bindings, store: &mut wasmtime::Store<CallState>| {
            bindings.wasmop_plugin_reconciler().call_manifest(store)
        };
        let (manifest, warm) = match &script {
            None => (
                self.run_unnamed(&pre, &limits, Call::Manifest, true, ask)
                    .map_err(fail)?,
                None,
            ),
            Some(script) => {
                let _slot = self.slot().map_err(fail)?;
                let (manifest, warm) = self
                    .invocation(&pre, &limits, Call::Manifest, true)
                    .run_warm(None, &|instance, store| script.init(instance, store), ask)
                    .map_err(fail)?;
                (manifest, Some(warm))
            }
        };
        let manifest = manifest::from_wit(manifest);
        if let Err(e) = manifest.validate() {
            // The name is known now, even if it is itself what is wrong.
            let name = if manifest.name.is_empty() {
                UNKNOWN_PLUGIN
            } else {
                &manifest.name
            };
            return Err(PluginError::new(
                name,
                &digest,
                PluginErrorKind::InvalidManifest(e.to_string()),
            ));
        }
        tracing::debug!(
            plugin = %manifest.name,
            version = %manifest.version,
            %digest,
            size,
            "plugin loaded"
        );
        let script = script.map(|text| plugin::ScriptParts {
            text,
            id: self.inner.shared.warm.id(),
        });
        if let (Some(script), Some(warm)) = (&script, warm) {
            self.inner.shared.warm.keep(script.id, warm);
        }
        let plugin = Plugin::new(plugin::Parts {
            digest,
            manifest,
            size,
            limits,
            engine: self.inner.engine.clone(),
            pre,
            shared: Arc::clone(&self.inner.shared),
            script,
        });
        crate::memory::give_back_freed_memory();
        Ok(plugin)
    }
}

enum Binary {
    Component,
    CoreModule,
    NotWasm,
}

/// Tells components from core modules by the header: the magic, a 2-byte version and a 2-byte
/// layer (0 for a core module, 1 for a component).
fn sniff(wasm: &[u8]) -> Binary {
    match wasm {
        [0, b'a', b's', b'm', _, _, 1, 0, ..] => Binary::Component,
        [0, b'a', b's', b'm', _, _, 0, 0, ..] => Binary::CoreModule,
        _ => Binary::NotWasm,
    }
}

/// `sha256:<hex>` of module bytes, as [`Plugin::digest`] reports it.
pub fn digest_of(wasm: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(wasm)))
}
