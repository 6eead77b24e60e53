//! One call into a plugin: a fresh [`Store`] and a fresh instance from the pre-instantiated
//! component, so nothing a call does can leak into the next, and a failed call leaves nothing
//! behind to clean up.
//!
//! A script's calls are the exception ([`Invocation::run_warm`]): its interpreter instance,
//! with the script parsed and frozen, serves call after call, because parsing again would
//! cost more than the call. Nothing leaks between them all the same: the script's globals are
//! frozen (Starlark refuses to mutate them), each call evaluates on a heap of its own that
//! is freed when it returns, and an instance whose call failed is dropped.
//!
//! The store grants the guest WASI p2 with no capabilities (no preopens, environment,
//! arguments or sockets) and deterministic clocks and randomness that never block (see
//! `wasi.rs`), stdout and stderr captured by a [`TailSink`], the [`MemoryLimiter`] and an
//! epoch deadline.
//! The `log` import becomes `tracing` events under the target `wasmop::plugin`.
//!
//! Failures are classified here, in this order: the limiter hit its cap → `MemoryCap` (the
//! guest then aborts with `unreachable`, which alone would look like a panic); an epoch
//! interrupt → `DeadlineExceeded`; any other trap → `Trap` with the guest's panic message (or
//! its stderr tail); a full pool → `Internal`; an instantiation error while probing →
//! `WrongInterface` (a type mismatch between the world and the component shows only then).

use wasmtime::component::{Instance, InstancePre, ResourceTable};
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::wasmop::plugin::host::{self, Level};
use super::bindings::{Plugin as Bindings, PluginPre};
use super::engine::EPOCH_PERIOD;
use super::error::{Call, PluginErrorKind};
use std::sync::Arc;

use super::error::human_bytes;
use super::limits::{Limits, MemoryBudget, MemoryLimiter};
use super::output::TailSink;
use super::warm::WarmPool;
use crate::text::truncate;

/// Bytes of guest stdout/stderr kept for error messages.
const OUTPUT_TAIL: usize = 4 << 10;
/// Log lines one call may emit; the rest are counted and dropped.
const MAX_LOG_LINES: u32 = 1000;
/// Longest log line passed on; longer ones are cut.
const MAX_LOG_LINE: usize = 8 << 10;

/// The state of one store: WASI, the limiter and what the guest logged.
pub(crate) struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    log: GuestLog,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl host::Host for CallState {
    fn log(&mut self, level: Level, message: String) {
        self.log.record(level, message);
    }
}

/// Forwards guest log lines to `tracing` and keeps the last panic message.
struct GuestLog {
    plugin: String,
    lines: u32,
    dropped: u32,
    last_panic: Option<String>,
}

impl GuestLog {
    fn new(plugin: &str) -> Self {
        Self {
            plugin: plugin.to_owned(),
            lines: 0,
            dropped: 0,
            last_panic: None,
        }
    }

    fn record(&mut self, level: Level, mut message: String) {
        if level == Level::Error
            && let Some(panic) = message.strip_prefix("panic: ")
        {
            self.last_panic = Some(truncate(panic.to_owned(), MAX_LOG_LINE));
        }
        if self.lines >= MAX_LOG_LINES {
            self.dropped += 1;
            return;
        }
        self.lines += 1;
        message = truncate(message, MAX_LOG_LINE);
        let plugin = self.plugin.as_str();
        match level {
            Level::Trace => tracing::trace!(target: "wasmop::plugin", plugin, "{message}"),
            Level::Debug => tracing::debug!(target: "wasmop::plugin", plugin, "{message}"),
            Level::Info => tracing::info!(target: "wasmop::plugin", plugin, "{message}"),
            Level::Warn => tracing::warn!(target: "wasmop::plugin", plugin, "{message}"),
            Level::Error => tracing::error!(target: "wasmop::plugin", plugin, "{message}"),
        }
    }
}

/// What a call instantiates: the `plugin` world's bindings, or a bare instance (a script
/// interpreter's, whose `init` is not in that world).
pub(crate) trait Instantiate {
    type Instance;
    fn instantiate(&self, store: &mut Store<CallState>) -> wasmtime::Result<Self::Instance>;
}

impl Instantiate for PluginPre<CallState> {
    type Instance = Bindings;
    fn instantiate(&self, store: &mut Store<CallState>) -> wasmtime::Result<Bindings> {
        PluginPre::instantiate(self, store)
    }
}

impl Instantiate for InstancePre<CallState> {
    type Instance = Instance;
    fn instantiate(&self, store: &mut Store<CallState>) -> wasmtime::Result<Instance> {
        InstancePre::instantiate(self, store)
    }
}

/// What a call needs besides its arguments.
pub(crate) struct Invocation<'a, P: Instantiate = PluginPre<CallState>> {
    pub engine: &'a Engine,
    pub pre: &'a P,
    pub limits: &'a Limits,
    /// The host's memory budget, shared by every call.
    pub budget: &'a Arc<MemoryBudget>,
    /// The manifest name, or `<unknown>` while probing.
    pub plugin: &'a str,
    pub call: Call,
    /// The load-time probe: an instantiation failure means a wrong interface.
    pub probing: bool,
}

impl<P: Instantiate> Invocation<'_, P> {
    /// Instantiates the component in a fresh store and runs `f` on it.
    pub(crate) fn run<R>(
        &self,
        f: impl FnOnce(&P::Instance, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginErrorKind> {
        let (mut store, output) = self.store();
        let result = match self.pre.instantiate(&mut store) {
            Ok(instance) => f(&instance, &mut store).map_err(|e| (e, false)),
            Err(e) => Err((e, true)),
        };
        self.conclude(result, &store, &output)
    }

    /// A fresh store under the call's limits, and the sink of its stdout and stderr.
    fn store(&self) -> (Store<CallState>, TailSink) {
        let output = TailSink::new(OUTPUT_TAIL);
        let wasi = super::wasi::ctx_builder()
            .stdout(output.clone())
            .stderr(output.clone())
            .build();
        let state = CallState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(self.limits.memory_bytes, self.budget.clone()),
            log: GuestLog::new(self.plugin),
        };
        let mut store = Store::new(self.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.set_epoch_deadline(self.limits.deadline_ticks(EPOCH_PERIOD));
        (store, output)
    }

    /// The call's value, or why it failed; `instantiating` tells a failure to instantiate.
    fn conclude<R>(
        &self,
        result: Result<R, (wasmtime::Error, bool)>,
        store: &Store<CallState>,
        output: &TailSink,
    ) -> Result<R, PluginErrorKind> {
        let log = &store.data().log;
        if log.dropped > 0 {
            tracing::warn!(
                target: "wasmop::plugin",
                plugin = self.plugin,
                dropped = log.dropped,
                "plugin log lines dropped: more than {MAX_LOG_LINES} in one call"
            );
        }
        result.map_err(|(err, instantiating)| self.classify(&err, instantiating, store, output))
    }

    fn classify(
        &self,
        err: &wasmtime::Error,
        instantiating: bool,
        store: &Store<CallState>,
        output: &TailSink,
    ) -> PluginErrorKind {
        let call = self.call;
        if store.data().limiter.hit() {
            return PluginErrorKind::MemoryCap {
                call,
                limit: self.limits.memory_bytes,
            };
        }
        // The host's limit, not the plugin's: a retry when other calls are done may succeed.
        if store.data().limiter.budget_hit() {
            return PluginErrorKind::Internal(format!(
                "the host's sandbox memory budget ({}) was taken by other calls",
                human_bytes(self.budget.limit())
            ));
        }
        if let Some(trap) = err.downcast_ref::<Trap>() {
            if *trap == Trap::Interrupt {
                return PluginErrorKind::DeadlineExceeded {
                    call,
                    limit: self.limits.deadline,
                };
            }
            return PluginErrorKind::Trap {
                call,
                message: trap.to_string(),
                guest_message: store
                    .data()
                    .log
                    .last_panic
                    .clone()
                    .or_else(|| output.text()),
            };
        }
        let detail = error_chain(err);
        if err
            .downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
            .is_some()
        {
            return PluginErrorKind::Internal(detail);
        }
        if instantiating && self.probing {
            return PluginErrorKind::WrongInterface(detail);
        }
        if instantiating {
            return PluginErrorKind::Internal(format!("instantiating: {detail}"));
        }
        // Anything else the guest caused while running, e.g. a string that is not UTF-8.
        PluginErrorKind::Trap {
            call,
            message: detail,
            guest_message: store
                .data()
                .log
                .last_panic
                .clone()
                .or_else(|| output.text()),
        }
    }
}

/// A script's instance kept between its calls (see `script.rs`): the interpreter with the
/// script parsed and frozen, its store and where its output goes.
pub(crate) struct Warm {
    store: Store<CallState>,
    bindings: Bindings,
    output: TailSink,
}

impl WarmPool<Warm> {
    /// Keeps `warm`, an instance of plugin `id`, for its next call, counted at the linear
    /// memory its limiter granted it.
    pub(crate) fn keep(&self, id: u64, warm: Warm) {
        let memory = warm.store.data().limiter.granted();
        self.put(id, warm, memory);
    }
}

/// How a script's new instance is prepared: `init(file, source)` on the bare instance; its
/// `Err` is the script's own error (a syntax error, a failing top level).
pub(crate) type Prepare<'a> =
    &'a dyn Fn(&Instance, &mut Store<CallState>) -> wasmtime::Result<Result<(), String>>;

impl Invocation<'_> {
    /// Runs `f` in `warm`, an instance that served this script before, or in a new one that
    /// `prepare` readies; gives the instance back with the value. A call that failed drops
    /// its instance, so whatever state a trap left never serves again; a script's own error
    /// (a `fail()`, a type error) unwinds inside the interpreter and does not.
    pub(crate) fn run_warm<R>(
        &self,
        warm: Option<Warm>,
        prepare: Prepare<'_>,
        f: impl FnOnce(&Bindings, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<(R, Warm), PluginErrorKind> {
        let mut warm = match warm {
            Some(mut warm) => {
                let state = warm.store.data_mut();
                state.log = GuestLog::new(self.plugin);
                state.limiter.clear_flags();
                warm.output.clear();
                warm.store
                    .set_epoch_deadline(self.limits.deadline_ticks(EPOCH_PERIOD));
                warm
            }
            None => self.prepare(prepare)?,
        };
        let result = f(&warm.bindings, &mut warm.store).map_err(|e| (e, false));
        self.conclude(result, &warm.store, &warm.output)
            .map(|value| (value, warm))
    }

    /// A new instance of the interpreter, `prepare`d, with the whole deadline left for the
    /// call: the script's top level ran within the same deadline when it loaded.
    fn prepare(&self, prepare: Prepare<'_>) -> Result<Warm, PluginErrorKind> {
        let (mut store, output) = self.store();
        let made = match self.pre.instance_pre().instantiate(&mut store) {
            Err(e) => Err((e, true)),
            Ok(instance) => match prepare(&instance, &mut store) {
                Err(e) => Err((e, false)),
                Ok(Err(message)) => {
                    return Err(PluginErrorKind::PluginFailed {
                        call: Call::Init,
                        message,
                    });
                }
                Ok(Ok(())) => Bindings::new(&mut store, &instance).map_err(|e| (e, true)),
            },
        };
        // What fails here fails in `init`, whichever call needed the instance.
        let init = Invocation {
            call: Call::Init,
            ..*self
        };
        let bindings = init.conclude(made, &store, &output)?;
        store.set_epoch_deadline(self.limits.deadline_ticks(EPOCH_PERIOD));
        Ok(Warm {
            store,
            bindings,
            output,
        })
    }
}

/// The error and its causes on one line, without wasm backtraces.
pub(crate) fn error_chain(err: &wasmtime::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        // wasmtime puts a multi-line backtrace in a context layer: keep its first line.
        let line = text.lines().next().unwrap_or_default().trim().to_owned();
        if !line.is_empty() && !parts.contains(&line) {
            parts.push(line);
        }
    }
    parts.join(": ")
}
