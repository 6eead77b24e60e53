//! A loaded plugin: its digest, manifest and limits, and the pre-instantiated component every
//! call instantiates afresh (a script's calls take an instance that kept the script parsed,
//! see `script.rs`). Immutable once loaded and cheap to clone.
//!
//! Calls come in two flavours: `*_blocking`, which run the guest on the calling thread, and
//! `async`, which hand the blocking call to `tokio::task::spawn_blocking` (synchronous WASI must
//! not run on a runtime worker) inside the caller's tracing span. Both wait for a free slot of
//! the sandbox's instance pool first.
//!
//! A response is parsed only after its size, its count of values and its depth passed the
//! bounds (`scan.rs`), and only while the host's memory budget holds what the parse will
//! allocate: until the parsed response is handed to the caller.

use std::sync::Arc;

use serde_json::Value;
use wasmop_contract::validate::MAX_SELECTORS;
use wasmop_contract::wire::{WireRequest, WireResponse};
use wasmop_contract::{Manifest, RelatedSelector};
use wasmtime::Engine;

use super::bindings::{Plugin as Bindings, PluginPre};
use super::error::{Call, PluginError, PluginErrorKind, human_bytes};
use super::invoke::{CallState, Invocation};
use super::limits::{Held, Limits, Shared};
use super::manifest::{SelectorProblem, selector_from_wit};
use super::scan::Shape;
use super::script::ScriptText;
use crate::config::{RESPONSE_MAX_DEPTH, RESPONSE_MAX_VALUES};
use crate::text::truncate;

/// Longest guest error message kept in a [`PluginErrorKind::PluginFailed`].
const MAX_GUEST_ERROR: usize = 4 << 10;

/// A plugin ready to be called. Cheap to clone; every call gets a fresh instance (a script's,
/// one that kept the script parsed).
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<Parts>,
}

/// What a [`Plugin`] is made of, as the sandbox loads it.
pub(crate) struct Parts {
    /// `sha256:<hex>` of the module.
    pub digest: String,
    /// What it declared.
    pub manifest: Manifest,
    /// The module's size in bytes.
    pub size: usize,
    /// Its limits.
    pub limits: Limits,
    /// The engine it was compiled for.
    pub engine: Engine,
    /// The component, linked and ready to instantiate.
    pub pre: PluginPre<CallState>,
    /// What every call of the sandbox shares.
    pub shared: Arc<Shared>,
    /// A script plugin's script, which `pre` (the interpreter) runs.
    pub script: Option<ScriptParts>,
}

/// What a script plugin's calls need besides the interpreter.
pub(crate) struct ScriptParts {
    /// What a new instance is made from.
    pub text: ScriptText,
    /// Its instances' id in the pool of idle ones.
    pub id: u64,
}

impl Drop for Parts {
    fn drop(&mut self) {
        if let Some(script) = &self.script {
            self.shared.warm.forget(script.id);
        }
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.inner.manifest.name)
            .field("digest", &self.inner.digest)
            .field("size", &self.inner.size)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    pub(crate) fn new(parts: Parts) -> Self {
        Self {
            inner: Arc::new(parts),
        }
    }

    /// `sha256:<hex>` of the module bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// The manifest the plugin reported when it loaded.
    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// The size of the module in bytes.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The selectors of the related objects to gather for `parent`.
    pub async fn related(&self, parent: &Value) -> Result<Vec<RelatedSelector>, PluginError> {
        self.related_encoded(parent.to_string()).await
    }

    /// [`Plugin::related`] for a parent given as its JSON text.
    pub async fn related_encoded(
        &self,
        parent: String,
    ) -> Result<Vec<RelatedSelector>, PluginError> {
        self.spawn(move |plugin| plugin.related_json(&parent)).await
    }

    /// [`Plugin::related`] on the calling thread. Don't call it on an async runtime worker.
    pub fn related_blocking(&self, parent: &Value) -> Result<Vec<RelatedSelector>, PluginError> {
        let _slot = self.wait_slot_blocking()?;
        self.related_json(&parent.to_string())
    }

    /// One reconcile.
    pub async fn reconcile(&self, req: &WireRequest) -> Result<WireResponse, PluginError> {
        let json = self.request_json(req)?;
        self.spawn(move |plugin| plugin.reconcile_json(&json)).await
    }

    /// The request as the guest receives it (JSON), for [`Plugin::reconcile_encoded`]. Objects
    /// may be held in any form that serialises to their JSON.
    pub fn encode<O: serde::Serialize>(&self, req: &WireRequest<O>) -> Result<String, PluginError> {
        self.request_json(req)
    }

    /// One reconcile of a request [`Plugin::encode`]d already.
    pub async fn reconcile_encoded(&self, json: String) -> Result<WireResponse, PluginError> {
        self.spawn(move |plugin| plugin.reconcile_json(&json)).await
    }

    /// [`Plugin::reconcile`] on the calling thread. Don't call it on an async runtime worker.
    pub fn reconcile_blocking(&self, req: &WireRequest) -> Result<WireResponse, PluginError> {
        let json = self.request_json(req)?;
        let _slot = self.wait_slot_blocking()?;
        self.reconcile_json(&json)
    }

    fn failed(&self, call: Call, message: String) -> PluginError {
        let message = truncate(message, MAX_GUEST_ERROR);
        self.error(PluginErrorKind::PluginFailed { call, message })
    }

    fn error(&self, kind: PluginErrorKind) -> PluginError {
        PluginError::new(&self.inner.manifest.name, &self.inner.digest, kind)
    }

    fn request_json<O: serde::Serialize>(
        &self,
        req: &WireRequest<O>,
    ) -> Result<String, PluginError> {
        serde_json::to_string(req).map_err(|e| {
            self.error(PluginErrorKind::Internal(format!(
                "encoding the request: {e}"
            )))
        })
    }

    fn wait_slot_blocking(&self) -> Result<tokio::sync::SemaphorePermit<'_>, PluginError> {
        futures::executor::block_on(self.inner.shared.slots.acquire())
            .map_err(|e| self.error(PluginErrorKind::Internal(e.to_string())))
    }

    /// Waits for a pool slot, then runs `f` on a blocking thread in the current span.
    async fn spawn<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Plugin) -> Result<R, PluginError> + Send + 'static,
    ) -> Result<R, PluginError> {
        let slot = Arc::clone(&self.inner.shared.slots)
            .acquire_owned()
            .await
            .map_err(|e| self.error(PluginErrorKind::Internal(e.to_string())))?;
        let (dispatch, span) = current_tracing();
        let plugin = self.clone();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            tracing::dispatcher::with_default(&dispatch, || span.in_scope(|| f(&plugin)))
        })
        .await
        .map_err(|e| {
            self.error(PluginErrorKind::Internal(format!(
                "plugin call thread: {e}"
            )))
        })?
    }

    fn invocation(&self, call: Call) -> Invocation<'_> {
        Invocation {
            engine: &self.inner.engine,
            pre: &self.inner.pre,
            limits: &self.inner.limits,
            budget: &self.inner.shared.budget,
            plugin: &self.inner.manifest.name,
            call,
            probing: false,
        }
    }

    /// Runs `f` in a fresh instance, or for a script in one that kept it parsed, which goes
    /// back to the pool afterwards.
    fn run<R>(
        &self,
        call: Call,
        f: impl FnOnce(&Bindings, &mut wasmtime::Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let invocation = self.invocation(call);
        let Some(script) = &self.inner.script else {
            return invocation.run(f).map_err(|kind| self.error(kind));
        };
        let warm = &self.inner.shared.warm;
        let (value, instance) = invocation
            .run_warm(
                warm.take(script.id),
                &|instance, store| script.text.init(instance, store),
                f,
            )
            .map_err(|kind| self.error(kind))?;
        warm.keep(script.id, instance);
        Ok(value)
    }

    fn related_json(&self, parent: &str) -> Result<Vec<RelatedSelector>, PluginError> {
        let call = Call::Related;
        let wire = self
            .run(call, |bindings, store| {
                bindings
                    .wasmop_plugin_reconciler()
                    .call_related(store, parent)
            })?
            .map_err(|message| self.failed(call, message))?;
        let size: usize = wire
            .iter()
            .map(|s| s.api_version.len() + s.kind.len() + s.label_selector.len())
            .sum();
        self.check_size(call, size)?;
        if wire.len() > MAX_SELECTORS {
            return Err(self.error(PluginErrorKind::InvalidOutput {
                call,
                detail: format!(
                    "{} selectors; at most {MAX_SELECTORS} per parent",
                    wire.len()
                ),
            }));
        }
        // The selectors are one response: their values count together, each nests on its own.
        let mut shape = Shape::default();
        for (index, selector) in wire.iter().enumerate() {
            let one = Shape::of(selector.label_selector.as_bytes(), RESPONSE_MAX_DEPTH);
            one.check(u64::MAX, RESPONSE_MAX_DEPTH)
                .map_err(|excess| self.too_complex(call, format!("selector #{index}: {excess}")))?;
            shape = shape.plus(one);
        }
        let _held = self.admit(call, shape, size)?;
        wire.into_iter()
            .map(|s| {
                selector_from_wit(&self.inner.manifest, s).map_err(|p| {
                    self.error(match p {
                        SelectorProblem::Json(detail) => {
                            PluginErrorKind::InvalidJson { call, detail }
                        }
                        SelectorProblem::Invalid(detail) => {
                            PluginErrorKind::InvalidOutput { call, detail }
                        }
                    })
                })
            })
            .collect()
    }

    fn reconcile_json(&self, request: &str) -> Result<WireResponse, PluginError> {
        let call = Call::Reconcile;
        let json = self
            .run(call, |bindings, store| {
                bindings
                    .wasmop_plugin_reconciler()
                    .call_reconcile(store, request)
            })?
            .map_err(|message| self.failed(call, message))?;
        self.check_size(call, json.len())?;
        let shape = Shape::of(json.as_bytes(), RESPONSE_MAX_DEPTH);
        let _held = self.admit(call, shape, json.len())?;
        // The path (`children[0].metadata`) is what an author needs to find the mistake.
        let mut json = serde_json::Deserializer::from_str(&json);
        serde_path_to_error::deserialize(&mut json).map_err(|e| {
            let detail = match e.path().to_string() {
                path if path == "." => e.inner().to_string(),
                path => format!("{path}: {}", e.inner()),
            };
            self.error(PluginErrorKind::InvalidJson { call, detail })
        })
    }

    /// Refuses a response past the value and depth bounds (the guest's fault), then holds what
    /// parsing it will allocate from the host's memory budget, or fails as the host's fault
    /// (retried) when the budget cannot give it now, as a store's growth past it does.
    fn admit(&self, call: Call, shape: Shape, len: usize) -> Result<Held, PluginError> {
        shape
            .check(RESPONSE_MAX_VALUES, RESPONSE_MAX_DEPTH)
            .map_err(|excess| self.too_complex(call, excess.to_string()))?;
        let cost = shape.parse_cost(len);
        let budget = &self.inner.shared.budget;
        budget.hold(cost).ok_or_else(|| {
            let need = format!(
                "parsing the response from {call} ({} values) takes about {}",
                shape.values,
                human_bytes(cost)
            );
            self.error(PluginErrorKind::Internal(if cost > budget.limit() {
                format!(
                    "{need}, more than the host's whole sandbox memory budget ({})",
                    human_bytes(budget.limit())
                )
            } else {
                format!(
                    "{need}, and the host's sandbox memory budget ({}) was taken by other calls",
                    human_bytes(budget.limit())
                )
            }))
        })
    }

    fn too_complex(&self, call: Call, detail: String) -> PluginError {
        self.error(PluginErrorKind::InvalidJson { call, detail })
    }

    fn check_size(&self, call: Call, size: usize) -> Result<(), PluginError> {
        let size = size as u64;
        let limit = self.inner.limits.response_bytes;
        if size > limit {
            return Err(self.error(PluginErrorKind::ResponseTooLarge { call, size, limit }));
        }
        Ok(())
    }
}

/// The caller's subscriber and span, to re-enter on a blocking thread: guest log lines then
/// land where the caller's own events go, nested in its span.
pub(crate) fn current_tracing() -> (tracing::Dispatch, tracing::Span) {
    (
        tracing::dispatcher::get_default(Clone::clone),
        tracing::Span::current(),
    )
}
