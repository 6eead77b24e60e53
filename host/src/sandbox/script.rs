//! Script plugins: a script becomes a component of the `plugin` world by running it once in
//! the interpreter the host carries and snapshotting the instance.
//!
//! The interpreter (`interpreters/starlark`, built by `build.rs` and embedded here) implements
//! the `script` world: the `plugin` world plus `init(file, source)`. A load instruments it
//! (`wasmtime-wizer`), compiles that once for all scripts (the artifact cache keeps it), and
//! calls `init` with the script under the plugin's own limits: a top level that loops runs
//! into the deadline, one that allocates into the memory cap, and a syntax error comes back
//! as the interpreter's message naming `file:line:column`. The instance is then snapshotted
//! into a new component, with the script parsed and frozen in its memory; that component loads
//! like any compiled plugin, under the script's digest. The cache keeps it compiled under the
//! interpreter's and the script's digests together, so a load that finds it there runs
//! nothing of the script, and shares it with other replicas under that name (compiled, a
//! snapshot is about 16 MB, 5 MB gzipped: the store splits it over several ConfigMaps). The
//! snapshot compiles fast because its functions are the interpreter's, compiled before
//! (`functions.rs`). With a child compiler (`wasmop run`), the child does all of this and
//! hands back the compiled snapshot (`compile.rs`), so the interpreter, the script's top level
//! and the snapshot's bytes stay out of the host's memory.
//!
//! [`Sandbox::test_script`] runs a script's test files for `wasmop test` on that same snapshot,
//! each test function in an instance of its own under the plugin's limits.

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use futures::executor::block_on;
use wasmtime::Store;
use wasmtime::component::{Instance, WasmList};
use wasmtime_wizer::{ComponentInstanceState, Wizer};

use super::cache::Got;
use super::compile::{self, Input};
use super::error::{Call, PluginError, PluginErrorKind, UNKNOWN_PLUGIN};
use super::invoke::{CallState, error_chain};
use super::limits::Limits;
use super::{Sandbox, Vouched, digest_of};
use crate::text::hex;

/// The Starlark interpreter component.
const STARLARK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/wasmop_starlark.wasm"));

/// The export that takes the script.
const INIT: &str = "init";
/// The exports that run a test file (see the `script` world).
const TEST_NAMES: &str = "test-names";
const RUN_TEST: &str = "run-test";

/// A test file of a script: its name (for messages) and its text.
#[derive(Debug, Clone)]
pub struct TestFile {
    /// The file's name, as `file:line:column` in failures gives it.
    pub name: String,
    /// The Starlark text.
    pub source: String,
}

impl TestFile {
    fn outcome(
        &self,
        test: Option<String>,
        failure: Option<String>,
        since: Instant,
    ) -> TestOutcome {
        TestOutcome {
            file: self.name.clone(),
            test,
            failure,
            elapsed: since.elapsed(),
        }
    }
}

/// What one test function, or a test file that could not run, came to.
#[derive(Debug, Clone)]
pub struct TestOutcome {
    /// The test file.
    pub file: String,
    /// The `test_*` function, or `None` when the file itself failed (a syntax error, a
    /// failing top level).
    pub test: Option<String>,
    /// Why it failed, naming `file:line:column`; `None` when it passed.
    pub failure: Option<String>,
    /// How long the call took, instantiation included.
    pub elapsed: Duration,
}

/// A language plugins may be written in besides WebAssembly, named by the extension of the
/// ConfigMap key that holds the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Language {
    /// Starlark, in a key ending `.star`.
    Starlark,
}

impl Language {
    /// The language of a script held under `key`, if it names one.
    pub fn of_key(key: &str) -> Option<Self> {
        key.strip_suffix(Self::Starlark.extension())
            .is_some_and(|rest| rest.ends_with('.'))
            .then_some(Self::Starlark)
    }

    /// The file extension of its scripts, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Starlark => "star",
        }
    }

    /// The language's name, as a child compiler is told it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Starlark => "starlark",
        }
    }

    /// The language [`Language::name`] gives `name`.
    pub fn named(name: &str) -> Option<Self> {
        (name == "starlark").then_some(Self::Starlark)
    }

    fn interpreter(self) -> &'static [u8] {
        match self {
            Self::Starlark => STARLARK,
        }
    }

    /// The interpreter's digest, hex: a snapshot is of one script in one interpreter build.
    fn interpreter_digest(self) -> &'static str {
        static STARLARK_DIGEST: OnceLock<String> = OnceLock::new();
        match self {
            Self::Starlark => STARLARK_DIGEST.get_or_init(|| hex(&Sha256::digest(STARLARK))),
        }
    }

    /// Where the cache keeps the compiled snapshot of the script `digest`: the interpreter
    /// and the script together, so that another interpreter build snapshots again.
    pub(crate) fn cache_key(self, digest: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.interpreter_digest());
        hasher.update(digest);
        hex(&hasher.finalize())
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Starlark => "Starlark",
        })
    }
}

impl Sandbox {
    /// The compiled snapshot of the script `source` (its `digest`), from the cache when it
    /// has one (keyed by [`Language::cache_key`]) or from `shared` (another replica's), else
    /// made and compiled.
    pub(crate) fn compiled_script(
        &self,
        language: Language,
        file: &str,
        source: &str,
        digest: &str,
        limits: &Limits,
        shared: Option<Vouched>,
    ) -> Result<Got, PluginError> {
        let got = self.inner.cache.get_or_compile_with(
            &self.inner.engine,
            &language.cache_key(digest),
            shared,
            || {
                if self.inner.cache.compiles_in_child() {
                    return Ok(Input::Script(compile::Script {
                        language,
                        file,
                        source,
                        limits: *limits,
                    }));
                }
                self.snapshot(language, file, source, limits)
                    .map(|wasm| Input::Module(Cow::Owned(wasm)))
                    .map_err(wasmtime::Error::new)
            },
        );
        got.map_err(|e| {
            let kind = match e.downcast_ref::<PluginError>() {
                Some(refused) => refused.kind.clone(),
                None => PluginErrorKind::NotAComponent(error_chain(&e)),
            };
            PluginError::new(UNKNOWN_PLUGIN, digest, kind)
        })
    }

    /// The component that runs `source`, a script in `language` named `file`: the
    /// interpreter after `init(file, source)`, snapshotted. Runs on the calling thread.
    pub fn snapshot(
        &self,
        language: Language,
        file: &str,
        source: &str,
        limits: &Limits,
    ) -> Result<Vec<u8>, PluginError> {
        let digest = digest_of(source.as_bytes());
        let fail = |kind| PluginError::new(UNKNOWN_PLUGIN, &digest, kind);
        let internal = |what: &str, e: &wasmtime::Error| {
            fail(PluginErrorKind::Internal(format!(
                "{what} the {language} interpreter: {}",
                error_chain(e)
            )))
        };
        let mut wizer = Wizer::new();
        // Dropping `init` leaves the component lifting a core export that is gone (wizer
        // 48.0.8 rewrites the core module's exports, not the component's aliases of them); kept,
        // it answers a second call with an error, and the host never makes one.
        wizer.init_func(INIT).keep_init_func(true);
        let (cx, instrumented) = wizer
            .instrument_component(language.interpreter())
            .map_err(|e| internal("instrumenting", &e))?;
        let own = digest_of(&instrumented);
        // The component alone: a compile's serialised bytes need not live through the run.
        let interpreter = self
            .inner
            .cache
            .get_or_compile(
                &self.inner.engine,
                &own["sha256:".len()..],
                &instrumented,
                None,
            )
            .map_err(|e| internal("compiling", &e))?
            .component;
        let pre = self
            .inner
            .linker
            .instantiate_pre(&interpreter)
            .map_err(|e| internal("linking", &e))?;
        let ran = self
            .run_unnamed(&pre, limits, Call::Init, false, |instance, store| {
                let init = instance
                    .get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut *store, INIT)?;
                if let (Err(message),) = init.call(&mut *store, (file, source))? {
                    return Ok(Err(message));
                }
                let mut state = Access {
                    store,
                    instance: *instance,
                    failed: None,
                };
                let snapshot = block_on(wizer.snapshot_component(&cx, &mut state))?;
                match state.failed {
                    Some(e) => Err(e),
                    None => Ok(Ok(snapshot)),
                }
            })
            .map_err(fail)?;
        // Needed again only for the next version: its code need not stay mapped till then.
        drop(pre);
        drop(interpreter);
        if self.inner.cache.has_disk() {
            self.inner.cache.forget(&own["sha256:".len()..]);
        }
        ran.map_err(|message| {
            fail(PluginErrorKind::PluginFailed {
                call: Call::Init,
                message,
            })
        })
    }
}

impl Sandbox {
    /// Runs the `test_*` functions of each test file against the script `file` (`source`):
    /// on its snapshot, as a cluster would run it, each function in an instance of its own
    /// under `limits`, so one test that loops or allocates without bound fails alone.
    /// `fixtures`, a JSON object, is `FIXTURES` in every test file. Fails only when the script
    /// itself does not load.
    pub fn test_script(
        &self,
        language: Language,
        file: &str,
        source: &str,
        tests: &[TestFile],
        fixtures: &serde_json::Value,
        limits: &Limits,
    ) -> Result<Vec<TestOutcome>, PluginError> {
        let limits = limits.clamped();
        let digest = digest_of(source.as_bytes());
        let got = self.compiled_script(language, file, source, &digest, &limits, None)?;
        let pre = self
            .inner
            .linker
            .instantiate_pre(&got.component)
            .map_err(|e| {
                PluginError::new(
                    UNKNOWN_PLUGIN,
                    &digest,
                    PluginErrorKind::WrongInterface(error_chain(&e)),
                )
            })?;
        let fixtures = fixtures.to_string();
        let call = |test: &TestFile, name: Option<&str>| {
            self.run_unnamed(
                &pre,
                &limits,
                Call::Test,
                false,
                |instance, store| match name {
                    None => {
                        let f = instance
                            .get_typed_func::<(&str, &str, &str), (Result<Vec<String>, String>,)>(
                                &mut *store,
                                TEST_NAMES,
                            )?;
                        Ok(f.call(&mut *store, (&test.name, &test.source, &fixtures))?
                            .0)
                    }
                    Some(name) => {
                        let f = instance
                            .get_typed_func::<(&str, &str, &str, &str), (Result<(), String>,)>(
                                &mut *store,
                                RUN_TEST,
                            )?;
                        Ok(
                            f.call(&mut *store, (&test.name, &test.source, &fixtures, name))?
                                .0
                                .map(|()| Vec::new()),
                        )
                    }
                },
            )
        };
        let mut outcomes = Vec::new();
        for test in tests {
            let started = Instant::now();
            let names = match call(test, None) {
                Ok(Ok(names)) => names,
                Ok(Err(message)) => {
                    outcomes.push(test.outcome(None, Some(message), started));
                    continue;
                }
                Err(kind) => {
                    outcomes.push(test.outcome(None, Some(kind.to_string()), started));
                    continue;
                }
            };
            for name in names {
                let started = Instant::now();
                let failure = match call(test, Some(&name)) {
                    Ok(Ok(_)) => None,
                    Ok(Err(message)) => Some(message),
                    Err(kind) => Some(kind.to_string()),
                };
                outcomes.push(test.outcome(Some(name), failure, started));
            }
        }
        Ok(outcomes)
    }
}

/// What the snapshot reads out of the instance `init` ran in, through the accessors the
/// instrumentation exported. Every call is synchronous; the futures are ready at once.
struct Access<'a> {
    store: &'a mut Store<CallState>,
    instance: Instance,
    // The first accessor that failed (the trait cannot say so): the snapshot is then refused.
    failed: Option<wasmtime::Error>,
}

impl Access<'_> {
    fn call<R: wasmtime::component::Lift + 'static>(
        &mut self,
        instance: &str,
        func: &str,
    ) -> wasmtime::Result<R> {
        let (_, outer) = self
            .instance
            .get_export(&mut *self.store, None, instance)
            .ok_or_else(|| wasmtime::format_err!("no export {instance}"))?;
        let (_, index) = self
            .instance
            .get_export(&mut *self.store, Some(&outer), func)
            .ok_or_else(|| wasmtime::format_err!("no export {instance}#{func}"))?;
        let typed = self
            .instance
            .get_typed_func::<(), (R,)>(&mut *self.store, index)?;
        Ok(typed.call(&mut *self.store, ())?.0)
    }

    fn expect<R: wasmtime::component::Lift + Default + 'static>(
        &mut self,
        instance: &str,
        func: &str,
    ) -> R {
        if self.failed.is_some() {
            return R::default();
        }
        self.call(instance, func).unwrap_or_else(|e| {
            self.failed = Some(e.context(format!("reading {instance}#{func} for the snapshot")));
            R::default()
        })
    }
}

impl ComponentInstanceState for Access<'_> {
    async fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) {
        if self.failed.is_some() {
            return contents(&[]);
        }
        match self.call::<WasmList<u8>>(instance, func) {
            Ok(list) => contents(list.as_le_slice(&*self.store)),
            Err(e) => {
                self.failed =
                    Some(e.context(format!("reading {instance}#{func} for the snapshot")));
                contents(&[]);
            }
        }
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.expect(instance, func)
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.expect(instance, func)
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.expect::<f32>(instance, func).to_bits()
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.expect::<f64>(instance, func).to_bits()
    }
}
