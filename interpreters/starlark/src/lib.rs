//! A plugin written in Starlark: this component implements the `script` world of
//! `guest-sdk/wit/plugin.wit` for any script.
//!
//! `init(file, source)` parses the script, runs its top level and freezes what it defined.
//! The host calls it once in each instance it makes, and the instance then serves call after
//! call: each evaluates one function on a heap of its own, freed when the call returns, and
//! the frozen globals cannot be changed, so no call sees what another did.
//!
//! A script defines what a compiled plugin exports, with the same shapes
//! (`docs/plugin-contract.md`):
//! - `MANIFEST`, a dict: `name`, `version`, `parent` and `children` (`{"apiVersion", "kind"}`),
//!   and optionally `related` (each also `metadataOnly`), `finalizer`, `clockSeconds`;
//! - `related(parent)`, returning a list of `{"apiVersion", "kind", "labelSelector"}`; needed
//!   only when the manifest names related kinds;
//! - `reconcile(request)`, returning a dict such as `{"children": [...], "status": {...}}`.
//!
//! `test-names` and `run-test` serve `wasmop test`: a test file runs beside the frozen script,
//! so its `test_*` functions call the script's own `reconcile` on the interpreter that serves
//! it in the cluster.
//!
//! Starlark has no clock, randomness or I/O, and this build adds none: `print` goes to the
//! host's log. A call stack deeper than [`MAX_CALL_STACK`] is an error, so recursion ends
//! there (the host's deadline and memory cap bound the rest).

mod json;

use std::sync::OnceLock;

use serde::Deserialize;
use starlark::environment::{FrozenModule, Globals, GlobalsBuilder, LibraryExtension, Module};
use starlark::eval::Evaluator;
use starlark::starlark_module;
use starlark::syntax::{AstModule, Dialect};
use starlark::values::none::NoneType;
use starlark::values::{OwnedFrozenValue, Value};

// The generated glue for `run-test` passes four strings as eight words.
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../guest-sdk/wit",
        world: "script",
    });
}

use bindings::exports::wasmop::plugin::reconciler::{
    Guest as Reconciler, KindRef, PluginManifest, RelatedKind, RelatedSelector,
};
use bindings::wasmop::plugin::host::{Level, log};
use bindings::{Guest, export};

/// Frames a call may nest: deep enough for any reconcile, shallow enough that a runaway
/// recursion stops with a message instead of the stack.
const MAX_CALL_STACK: usize = 100;

/// The script, once `init` ran.
struct Script {
    file: String,
    module: FrozenModule,
    manifest: PluginManifest,
}

static SCRIPT: OnceLock<Script> = OnceLock::new();

struct Interpreter;

impl Guest for Interpreter {
    fn init(file: String, source: String) -> Result<(), String> {
        if SCRIPT.get().is_some() {
            return Err("init was called twice".into());
        }
        let module = evaluate(&file, source)?;
        let manifest = manifest(&file, &module)?;
        if !manifest.related.is_empty() && module.get_option("related").ok().flatten().is_none() {
            return Err(format!(
                "{file}: MANIFEST names related kinds, so the script must define related(parent)"
            ));
        }
        for required in ["reconcile"] {
            if module.get_option(required).ok().flatten().is_none() {
                return Err(format!(
                    "{file}: the script must define {required}(request)"
                ));
            }
        }
        let _ = SCRIPT.set(Script {
            file,
            module,
            manifest,
        });
        Ok(())
    }

    fn test_names(file: String, source: String, fixtures: String) -> Result<Vec<String>, String> {
        script().test_file(&file, source, &fixtures, None)
    }

    fn run_test(
        file: String,
        source: String,
        fixtures: String,
        name: String,
    ) -> Result<(), String> {
        script()
            .test_file(&file, source, &fixtures, Some(&name))
            .map(drop)
    }
}

/// What a test file sees besides the standard library.
#[starlark_module]
fn assertions(builder: &mut GlobalsBuilder) {
    /// Fails the test when `got != want`, saying both.
    fn assert_eq<'v>(
        got: Value<'v>,
        want: Value<'v>,
        #[starlark(default = NoneType)] msg: Value<'v>,
    ) -> anyhow::Result<NoneType> {
        if got.equals(want).map_err(|e| anyhow::anyhow!("{e}"))? {
            return Ok(NoneType);
        }
        let note = msg
            .unpack_str()
            .map(|m| format!("{m}: "))
            .unwrap_or_default();
        Err(anyhow::anyhow!(
            "{note}assert_eq: got {}, want {}",
            got.to_repr(),
            want.to_repr()
        ))
    }

    /// Fails the test unless calling `f` with no arguments fails with a message holding
    /// `want`.
    fn assert_fails<'v>(
        f: Value<'v>,
        want: &str,
        eval: &mut Evaluator<'v, '_, '_>,
    ) -> anyhow::Result<NoneType> {
        match eval.eval_function(f, &[], &[]) {
            Ok(v) => {
                let mut got = v.to_repr();
                if got.len() > 200 {
                    let cut = (0..=200)
                        .rev()
                        .find(|&i| got.is_char_boundary(i))
                        .unwrap_or(0);
                    got.truncate(cut);
                    got.push_str(" …");
                }
                Err(anyhow::anyhow!(
                    "assert_fails: the call returned {got} instead of failing with {want:?}"
                ))
            }
            Err(e) => {
                let message = e.without_diagnostic().to_string();
                if message.contains(want) {
                    Ok(NoneType)
                } else {
                    Err(anyhow::anyhow!(
                        "assert_fails: the call failed with {message:?}, which lacks {want:?}"
                    ))
                }
            }
        }
    }

    /// Fails the test when `cond` is not true.
    fn assert_true<'v>(
        cond: Value<'v>,
        #[starlark(default = NoneType)] msg: Value<'v>,
    ) -> anyhow::Result<NoneType> {
        if cond.to_bool() {
            return Ok(NoneType);
        }
        let note = msg
            .unpack_str()
            .map(|m| format!("{m}: "))
            .unwrap_or_default();
        Err(anyhow::anyhow!("{note}assert_true: got {}", cond.to_repr()))
    }
}

impl Reconciler for Interpreter {
    fn manifest() -> PluginManifest {
        script().manifest.clone()
    }

    fn related(parent: String) -> Result<Vec<RelatedSelector>, String> {
        let s = script();
        if s.manifest.related.is_empty() {
            return Ok(Vec::new());
        }
        let (out, _) = s.call("related", &parent)?;
        let selectors: Vec<Selector> =
            serde_json::from_str(&out).map_err(|e| format!("{}: related returned {e}", s.file))?;
        Ok(selectors
            .into_iter()
            .map(|s| RelatedSelector {
                api_version: s.api_version,
                kind: s.kind,
                label_selector: s.label_selector.to_string(),
            })
            .collect())
    }

    fn reconcile(request: String) -> Result<String, String> {
        let s = script();
        let (out, starlark_type) = s.call("reconcile", &request)?;
        if starlark_type != "dict" {
            return Err(format!(
                "{}: reconcile returned {}, not a dict such as {{\"children\": [], \"status\": {{}}}}",
                s.file,
                kind_of(starlark_type)
            ));
        }
        Ok(out)
    }
}

export!(Interpreter with_types_in bindings);

fn script() -> &'static Script {
    // The host calls anything else only in an instance whose init succeeded.
    SCRIPT
        .get()
        .expect("the host calls init before anything else")
}

fn globals() -> Globals {
    library().build()
}

fn test_globals() -> Globals {
    library().with(assertions).build()
}

fn library() -> GlobalsBuilder {
    GlobalsBuilder::extended_by(&[
        LibraryExtension::StructType,
        LibraryExtension::Map,
        LibraryExtension::Filter,
        LibraryExtension::Partial,
        LibraryExtension::Json,
        LibraryExtension::Print,
    ])
}

fn dialect() -> Dialect {
    Dialect {
        enable_f_strings: true,
        enable_load: false,
        ..Dialect::Extended
    }
}

/// An evaluator for `module`: `print` to the host's log, the call stack bounded.
fn evaluator<'v, 'a, 'e>(module: &'a Module<'v>) -> Result<Evaluator<'v, 'a, 'e>, String> {
    let mut eval = Evaluator::new(module);
    eval.set_print_handler(&ToHostLog);
    eval.set_max_callstack_size(MAX_CALL_STACK)
        .map_err(|e| e.to_string())?;
    Ok(eval)
}

/// `print` lines go to the host's log, inside the reconcile's span.
struct ToHostLog;

impl starlark::PrintHandler for ToHostLog {
    fn println(&self, text: &str) -> starlark::Result<()> {
        log(Level::Info, text);
        Ok(())
    }
}

fn evaluate(file: &str, source: String) -> Result<FrozenModule, String> {
    let ast = AstModule::parse(file, source, &dialect()).map_err(|e| located(file, &e))?;
    let globals = globals();
    Module::with_temp_heap(|module| {
        {
            let mut eval = evaluator(&module)?;
            eval.eval_module(ast, &globals)
                .map_err(|e| located(file, &e))?;
        }
        module
            .freeze()
            .map_err(|e| format!("{file}: freezing the module: {e:?}"))
    })
}

impl Script {
    /// Runs a test file's top level beside the script, with `FIXTURES` in scope; then its
    /// function `run` if given, else gives the names of its `test_*` functions.
    fn test_file(
        &self,
        file: &str,
        source: String,
        fixtures: &str,
        run: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let fixtures: serde_json::Value = serde_json::from_str(fixtures)
            .map_err(|e| format!("the host sent bad fixtures: {e}"))?;
        let ast = AstModule::parse(file, source, &dialect()).map_err(|e| located(file, &e))?;
        let globals = test_globals();
        Module::with_temp_heap(|module| {
            module.import_public_symbols(&self.module);
            module.set("FIXTURES", module.heap().alloc(fixtures));
            let mut eval = evaluator(&module)?;
            eval.eval_module(ast, &globals)
                .map_err(|e| located(file, &e))?;
            if let Some(name) = run {
                let function = module
                    .get(name)
                    .ok_or_else(|| format!("{file}: {name} is not defined"))?;
                eval.eval_function(function, &[], &[])
                    .map_err(|e| located(file, &e))?;
                return Ok(Vec::new());
            }
            let mut names: Vec<String> = module
                .names()
                .map(|n| n.as_str().to_owned())
                .filter(|n| {
                    n.starts_with("test_") && self.module.get_option(n).ok().flatten().is_none()
                })
                .filter(|n| module.get(n).is_some_and(|v| v.get_type() == "function"))
                .collect();
            names.sort();
            Ok(names)
        })
    }

    /// Calls the script's function `name` with one argument, `json` decoded; its result as
    /// JSON text, and the Starlark type it had.
    fn call(&self, name: &str, json: &str) -> Result<(String, &'static str), String> {
        let file = &self.file;
        let function: OwnedFrozenValue = self
            .module
            .get(name)
            .map_err(|_| format!("{file}: {name} is not defined"))?;
        Module::with_temp_heap(|module| {
            let mut eval = evaluator(&module)?;
            let arg = json::decode(module.heap(), json)
                .map_err(|e| format!("the host sent bad JSON: {e}"))?;
            // SAFETY: `owned_frozen_value` makes this call's frozen heap hold the script's, so
            // the value lives as long as the call (and the script, in a static, forever).
            let function = unsafe { function.owned_frozen_value(module.frozen_heap()) }.to_value();
            let out: Value = eval
                .eval_function(function, &[arg], &[])
                .map_err(|e| located(file, &e))?;
            let text = out
                .to_json()
                .map_err(|e| format!("{file}: {name} returned a value JSON cannot hold: {e}"))?;
            Ok((text, out.get_type()))
        })
    }
}

/// `file:line:column: message`, from where the error was raised (or the innermost frame of
/// the script that was running).
fn located(file: &str, e: &starlark::Error) -> String {
    let place = e
        .span()
        .cloned()
        .or_else(|| {
            e.call_stack()
                .frames
                .iter()
                .rev()
                .find_map(|f| f.location.clone())
        })
        .map(|span| {
            let pos = span.resolve_span().begin;
            format!("{}:{}:{}", span.filename(), pos.line + 1, pos.column + 1)
        })
        .unwrap_or_else(|| file.to_owned());
    format!("{place}: {}", e.without_diagnostic())
}

/// How a Starlark type reads in a message.
fn kind_of(starlark_type: &str) -> String {
    match starlark_type {
        "NoneType" => "None".to_owned(),
        "int" | "float" => "a number".to_owned(),
        "string" => "a string".to_owned(),
        "bool" => "a bool".to_owned(),
        "list" | "tuple" => "a list".to_owned(),
        other => format!("a {other}"),
    }
}

/// `MANIFEST` as the script wrote it: the manifest's JSON shape, nothing more.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Manifest {
    name: String,
    version: String,
    parent: Kind,
    #[serde(default)]
    children: Vec<Kind>,
    #[serde(default)]
    related: Vec<Related>,
    #[serde(default)]
    finalizer: bool,
    #[serde(default)]
    clock_seconds: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kind {
    api_version: String,
    kind: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Related {
    api_version: String,
    kind: String,
    #[serde(default)]
    metadata_only: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Selector {
    api_version: String,
    kind: String,
    #[serde(default)]
    label_selector: serde_json::Value,
}

fn manifest(file: &str, module: &FrozenModule) -> Result<PluginManifest, String> {
    let value = module
        .get_option("MANIFEST")
        .ok()
        .flatten()
        .ok_or_else(|| format!("{file}: the script must define MANIFEST, a dict"))?;
    let json = value
        .value()
        .to_json_value()
        .map_err(|e| format!("{file}: MANIFEST: {e}"))?;
    let m: Manifest = serde_json::from_value(json).map_err(|e| format!("{file}: MANIFEST: {e}"))?;
    let kind = |k: Kind| KindRef {
        api_version: k.api_version,
        kind: k.kind,
    };
    Ok(PluginManifest {
        name: m.name,
        version: m.version,
        parent: kind(m.parent),
        children: m.children.into_iter().map(kind).collect(),
        related: m
            .related
            .into_iter()
            .map(|r| RelatedKind {
                api_version: r.api_version,
                kind: r.kind,
                metadata_only: r.metadata_only,
            })
            .collect(),
        finalizer: m.finalizer,
        clock_seconds: m.clock_seconds,
    })
}
