//! Script plugins: the interpreter the host carries, compiled once for every script, runs a
//! script in an instance that keeps it parsed and frozen from one call to the next.
//!
//! The interpreter (`interpreters/starlark`, built by `build.rs` and embedded here) implements
//! the `script` world: the `plugin` world plus `init(file, source)`. A load compiles the
//! interpreter, or takes it from the artifact cache or from another replica as it would a
//! module (keyed by the interpreter's digest, so every script shares one compiled copy, its
//! code mapped once), then makes an instance and calls `init` with the script under the
//! plugin's own limits: a top level that loops runs into the deadline, one that allocates
//! into the memory cap, and a syntax error comes back as the interpreter's message naming
//! `file:line:column`. That instance answers the manifest and then serves the plugin's calls
//! (`invoke.rs`, [`Warm`]): parsing costs milliseconds, a call of the Memcached script
//! hundreds of microseconds. Instances wait between calls in a bounded pool (`warm.rs`); a
//! call that finds none, or whose instance failed, makes a new one and runs `init` again.
//!
//! [`Sandbox::test_script`] runs a script's test files for `wasmop test` in that same
//! interpreter, each test function in an instance of its own under the plugin's limits.

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::Store;
use wasmtime::component::Instance;

use super::cache::Got;
use super::error::{Call, PluginError, PluginErrorKind, UNKNOWN_PLUGIN};
use super::invoke::{CallState, error_chain};
use super::limits::Limits;
use super::{Sandbox, Vouched};
use crate::text::hex;

/// The Starlark interpreter component.
const STARLARK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/wasmop_starlark.wasm"));

/// The export that takes the script.
const INIT: &str = "init";
/// The exports that run a test file (see the `script` world).
const TEST_NAMES: &str = "test-names";
const RUN_TEST: &str = "run-test";

/// A script as its instances are made from it: the key that holds it and its text.
#[derive(Debug)]
pub(crate) struct ScriptText {
    pub(crate) file: String,
    pub(crate) source: String,
}

impl ScriptText {
    /// `init(file, source)` in a new instance of the interpreter; `Err` inside is the
    /// script's own error.
    pub(crate) fn init(
        &self,
        instance: &Instance,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<Result<(), String>> {
        let init =
            instance.get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut *store, INIT)?;
        Ok(init.call(&mut *store, (&self.file, &self.source))?.0)
    }
}

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

    /// The interpreter's component.
    pub(crate) fn interpreter(self) -> &'static [u8] {
        match self {
            Self::Starlark => STARLARK,
        }
    }

    /// The interpreter's digest, hex: what its compiled form is cached and shared under.
    pub(crate) fn interpreter_digest(self) -> &'static str {
        static STARLARK_DIGEST: OnceLock<String> = OnceLock::new();
        match self {
            Self::Starlark => STARLARK_DIGEST.get_or_init(|| hex(&Sha256::digest(STARLARK))),
        }
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
    /// The interpreter of `language`, compiled: from the caches, from `shared` (another
    /// replica's), else compiled now, as a module would be.
    pub(crate) fn interpreter(
        &self,
        language: Language,
        digest: &str,
        shared: Option<Vouched>,
    ) -> Result<Got, PluginError> {
        self.inner
            .cache
            .get_or_compile(
                &self.inner.engine,
                language.interpreter_digest(),
                language.interpreter(),
                shared,
            )
            .map_err(|e| {
                PluginError::new(
                    UNKNOWN_PLUGIN,
                    digest,
                    PluginErrorKind::Internal(format!(
                        "compiling the {language} interpreter: {}",
                        error_chain(&e)
                    )),
                )
            })
    }
}

impl Sandbox {
    /// Runs the `test_*` functions of each test file against the script `file` (`source`):
    /// in the interpreter a cluster runs it in, each function in an instance of its own
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
        let digest = super::digest_of(source.as_bytes());
        let got = self.interpreter(language, &digest, None)?;
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
        let script = ScriptText {
            file: file.to_owned(),
            source: source.to_owned(),
        };
        // The script itself first: a test cannot run beside a script that does not load.
        self.run_unnamed(&pre, &limits, Call::Init, false, |instance, store| {
            script.init(instance, store)
        })
        .map_err(|kind| PluginError::new(UNKNOWN_PLUGIN, &digest, kind))?
        .map_err(|message| {
            PluginError::new(
                UNKNOWN_PLUGIN,
                &digest,
                PluginErrorKind::PluginFailed {
                    call: Call::Init,
                    message,
                },
            )
        })?;
        let fixtures = fixtures.to_string();
        let call = |test: &TestFile, name: Option<&str>| {
            self.run_unnamed(&pre, &limits, Call::Test, false, |instance, store| {
                if let Err(message) = script.init(instance, store)? {
                    return Ok(Err(message));
                }
                match name {
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
                }
            })
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
