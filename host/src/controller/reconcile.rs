//! One reconcile of one parent, as a list of steps (`steps` reads as that list):
//! finalizer → related selectors → gather → call the plugin → validate → apply and prune
//! children → status → Events → finalizer removal.
//!
//! A plugin is a deterministic function of its request (see `docs/security.md`), so a request
//! byte-identical to the last one the same version answered with nothing to do — no child
//! applied or pruned, no status written, no Event, not finalizing — would change nothing again:
//! it is not sent ([`Quiet`]). A resync at rest costs a gather and a hash, not a call.
//!
//! A failure anywhere puts `Ready=False` with a reason on the parent and a Warning Event naming
//! the plugin version, and the controller retries with backoff. Children already applied stay
//! as they are.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::core::Selector;
use kube::runtime::events::{Event, EventType};
use serde_json::{Value, json};
use std::sync::OnceLock;
use tracing::Instrument;
use wasmop_contract::validate::{self, Target, Validated};
use wasmop_contract::wire::{WireEvent, WireResponse};
use wasmop_contract::{KindRef, Manifest, RelatedSelector};

use super::Shared;
use super::error::{Error, ReconcileError};
use super::finalizers;
use super::queue::Reason;
use super::related::Related;
use crate::apply::preview::{FieldChange, ParentPreview};
use crate::apply::{self, Children};
use crate::gather::{self, Observed};
use crate::kinds::Kinds;
use crate::plugin::Loaded;
use crate::plugin::access::{self, Resource};
use crate::sandbox::PluginError;
use crate::status::{self, Ready};
use crate::telemetry::metrics;
use crate::telemetry::metrics::{CallLabels, PluginLabels, ReasonLabels, ResultLabels};
use crate::text::truncate;
use crate::watch::{ObjKey, Object};
use sha2::{Digest, Sha256};

/// The last request of a parent that changed nothing: its version, the request's hash, and
/// the requeue it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quiet {
    // The version: what the host writes besides the plugin's answer (the `Ready` message)
    // names the revision too.
    digest: String,
    revision: Option<i64>,
    request: [u8; 32],
    requeue_after: Option<Duration>,
}

impl Quiet {
    fn of(loaded: &Loaded, encoded: &str, requeue_after: Option<Duration>) -> Quiet {
        Quiet {
            digest: loaded.plugin.digest().to_owned(),
            revision: loaded.revision,
            request: Sha256::digest(encoded.as_bytes()).into(),
            requeue_after,
        }
    }

    /// Whether `encoded` is the request this one recorded, for the same version.
    fn matches(&self, loaded: &Loaded, encoded: &str) -> bool {
        self.digest == loaded.plugin.digest()
            && self.revision == loaded.revision
            && self.request == <[u8; 32]>::from(Sha256::digest(encoded.as_bytes()))
    }
}

/// What a successful reconcile asks of the queue.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The parent no longer exists (or is gone from our concern): forget it.
    pub gone: bool,
    /// The plugin asked to be called again after this long.
    pub requeue_after: Option<Duration>,
    /// Children were just changed, so the status was left for the reconcile their watch
    /// events bring, which sees them.
    pub status_deferred: bool,
}

/// A failed step, and the plugin's status when the failure came after the plugin answered (it
/// is still written, beside `Ready=False`).
#[derive(Debug)]
struct Failure {
    error: ReconcileError,
    status: Option<Value>,
}

impl From<ReconcileError> for Failure {
    fn from(error: ReconcileError) -> Self {
        Failure {
            error,
            status: None,
        }
    }
}

impl From<PluginError> for Failure {
    fn from(e: PluginError) -> Self {
        ReconcileError::from(e).into()
    }
}

/// Reconciles the parent at `key` with `loaded`. A failure is logged and recorded on the
/// parent (its `Ready` condition and a Warning Event), then returned for the controller to
/// decide when to try again.
pub async fn run(
    shared: &Shared,
    loaded: &Loaded,
    key: &ObjKey,
    reason: &Reason,
    may_defer_status: bool,
) -> Result<Outcome, Error> {
    let manifest = loaded.plugin.manifest();
    let span = tracing::info_span!(
        "reconcile",
        plugin = %manifest.name,
        version = %manifest.version,
        digest = %loaded.plugin.digest(),
        namespace = key.namespace().unwrap_or(""),
        name = %key.name,
        reason = %reason,
    );
    async {
        let Some(parent) = shared.parents.get(key.namespace(), &key.name) else {
            return Ok(Outcome { gone: true, ..Default::default() });
        };
        let started = std::time::Instant::now();
        let m = metrics();
        let labels = |result| ResultLabels { plugin: manifest.name.clone(), result };
        let result = match steps(shared, loaded, &parent, may_defer_status).await {
            Ok(outcome) => {
                tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "reconciled");
                m.reconciles.get_or_create(&labels("success")).inc();
                Ok(outcome)
            }
            Err(failure) => {
                let reason = failure.error.reason();
                tracing::warn!(reason, guest_fault = failure.error.is_guest_fault(), error = %failure.error, "reconcile failed");
                m.reconciles.get_or_create(&labels("error")).inc();
                m.reconcile_errors
                    .get_or_create(&ReasonLabels { plugin: manifest.name.clone(), reason: reason.to_string() })
                    .inc();
                let error = record_failure(shared, loaded, &parent, failure).await;
                Err(Error { parent: key.clone(), error: Box::new(error) })
            }
        };
        m.reconcile_duration
            .get_or_create(&PluginLabels { plugin: manifest.name.clone() })
            .observe(started.elapsed().as_secs_f64());
        result
    }
    .instrument(span)
    .await
}

/// The reconcile, as its list of steps.
async fn steps(
    shared: &Shared,
    loaded: &Loaded,
    parent: &Arc<Object>,
    may_defer_status: bool,
) -> Result<Outcome, Failure> {
    // 0. An object the watch could not decode is only reported, never handed to the plugin.
    if let Some(error) = parent.undecodable() {
        return Err(ReconcileError::Undecodable(error.to_string()).into());
    }
    // The host's own objects are out of every plugin's reach, whatever its rights.
    if shared.reads.host().owns_object(parent) {
        tracing::debug!("the host's own object is never a plugin's parent");
        return Ok(Outcome::gone());
    }
    let step = Step::new(shared, loaded, parent);
    // 0b. Only a parent the plugin's own identity may read is handed to it.
    step.may_read_parent().await?;
    // 1. Finalizer: deletion is the garbage collector's job unless the plugin asked to run.
    if !step.ensure_finalizer().await? {
        return Ok(Outcome::gone());
    }
    // 2. Related selectors.
    let selectors = step.related_selectors().await?;
    // 3. Gather what the plugin may read and call, unless the last reconcile of this very
    // request changed nothing.
    let encoded = step.encode(&selectors).await?;
    if !step.deleting
        && let Some(requeue_after) = step.quiet(&encoded)
    {
        count_skipped(step.manifest());
        return Ok(Outcome {
            gone: false,
            requeue_after,
            status_deferred: false,
        });
    }
    let response = step.call(encoded.clone()).await?;
    // 4. Validate: the same code `wasmop render` runs.
    let Validated {
        children,
        status,
        events,
        requeue_after,
        finalized,
        warnings,
    } = step.validate(response)?;
    for w in &warnings {
        tracing::warn!(warning = %w, "plugin output adjusted");
    }
    // 5. Children.
    let applied = match step.apply_children(children).await {
        Ok(report) => report,
        Err(failures) => {
            let error = if !failures.errors.is_empty() {
                ReconcileError::Apply(failures.errors)
            } else if let Some((held_back, per_minute)) = failures.held_back {
                ReconcileError::CreateBudget {
                    held_back,
                    per_minute,
                }
            } else {
                ReconcileError::ChildConflict(failures.conflicts)
            };
            return Err(Failure { error, status });
        }
    };
    // 6. Status, only when it changed. Right after children changed it would describe what
    // they were before, and be written again as soon as their watch events come back; so it
    // waits for that reconcile (once: a plugin whose children never settle still gets status).
    let status_deferred = may_defer_status && (applied.applied > 0 || applied.pruned > 0);
    let mut status_written = false;
    if !step.deleting && !status_deferred {
        status_written = step.write_status(status.as_ref()).await?;
    }
    let quiet = !step.deleting
        && applied.applied == 0
        && applied.pruned == 0
        && !status_written
        && events.is_empty();
    step.remember(quiet.then(|| Quiet::of(step.loaded, &encoded, requeue_after)));
    // 7. Events the plugin asked for.
    step.publish_events(&events);
    // 8. Finalizer removal once the plugin is done.
    if step.deleting && finalized {
        step.release_finalizer().await?;
        return Ok(Outcome::gone());
    }
    Ok(Outcome {
        gone: false,
        requeue_after,
        status_deferred,
    })
}

impl Outcome {
    fn gone() -> Self {
        Outcome {
            gone: true,
            ..Default::default()
        }
    }
}

/// What every step of one reconcile works with.
struct Step<'a> {
    shared: &'a Shared,
    loaded: &'a Loaded,
    parent: &'a Arc<Object>,
    // Parsed only for the steps that read it (validation), after a call.
    parent_json: OnceLock<Value>,
    api: Api<DynamicObject>,
    deleting: bool,
}

impl<'a> Step<'a> {
    fn new(shared: &'a Shared, loaded: &'a Loaded, parent: &'a Arc<Object>) -> Self {
        Step {
            shared,
            loaded,
            parent,
            parent_json: OnceLock::new(),
            api: shared.kinds.parent.api(&shared.writer, parent.namespace()),
            deleting: parent.is_deleting(),
        }
    }

    fn manifest(&self) -> &'a Manifest {
        self.loaded.plugin.manifest()
    }

    fn parent_value(&self) -> &Value {
        self.parent_json.get_or_init(|| self.parent.value())
    }

    fn has_finalizer(&self) -> bool {
        let finalizer = self.manifest().finalizer_name();
        self.parent.finalizers().contains(&finalizer)
    }

    /// Adds the plugin's finalizer if it wants one; `false` when the parent is being deleted
    /// without it, so there is nothing for the plugin to do.
    async fn ensure_finalizer(&self) -> Result<bool, ReconcileError> {
        let has = self.has_finalizer();
        if self.deleting && !has {
            return Ok(false);
        }
        if self.manifest().finalizer && !self.deleting && !has {
            finalizers::set(
                &self.api,
                self.parent,
                &self.manifest().finalizer_name(),
                true,
            )
            .await?;
        }
        Ok(true)
    }

    /// The related selectors, kept for mapping related changes back to this parent. They
    /// depend on the parent's spec and metadata only, so they are asked again when those
    /// change or a new plugin version runs.
    async fn related_selectors(&self) -> Result<Vec<RelatedSelector>, Failure> {
        let plugin = &self.loaded.plugin;
        let key = self.parent.key();
        let fingerprint = super::triggers::fingerprint(self.parent);
        let known = {
            let cached = self.shared.selectors.lock().expect("selectors lock");
            cached
                .get(&key)
                .filter(|r| r.fingerprint == fingerprint && r.digest == plugin.digest())
                .map(|r| r.selectors.clone())
        };
        if let Some(selectors) = known {
            return Ok(selectors);
        }
        let selectors = timed(
            self.manifest(),
            "related",
            plugin.related_encoded(self.parent.json().to_owned()),
        )
        .await?;
        let parsed = parse_selectors(&self.shared.kinds, &selectors)?;
        self.shared
            .selectors
            .lock()
            .expect("selectors lock")
            .insert(
                key,
                Related {
                    digest: plugin.digest().to_owned(),
                    fingerprint,
                    selectors: selectors.clone(),
                    parsed,
                },
            );
        Ok(selectors)
    }

    /// Fails unless the plugin's identity may read its parent where it is.
    async fn may_read_parent(&self) -> Result<(), ReconcileError> {
        let parent = &self.shared.kinds.parent;
        let resource = Resource::from(parent);
        let namespace = self.parent.namespace();
        if self.shared.reads.may_read(&resource, namespace).await? {
            return Ok(());
        }
        Err(ReconcileError::Unreadable {
            account: self.loaded.identity.username(),
            resource: access::Need::display_of(&resource),
            namespace: namespace.map(str::to_string),
        })
    }

    /// Gathers the request from the caches, as the guest will receive it: only what the
    /// plugin's identity may read.
    async fn encode(&self, selectors: &[RelatedSelector]) -> Result<String, ReconcileError> {
        let mut request = gather::request(
            self.manifest(),
            self.parent,
            self.shared.kinds.parent.scope(),
            selectors,
            &CacheObserved(self.shared),
            &self.loaded.settings,
            self.deleting,
        );
        let withheld = self
            .shared
            .reads
            .withhold(&mut request, &self.shared.request_kinds)
            .await?;
        if withheld.objects > 0 {
            tracing::debug!(objects = withheld.objects, from = ?withheld.from, "left out what the plugin may not read");
        }
        gather::stamp(&mut request, self.manifest(), Timestamp::now());
        Ok(self.loaded.plugin.encode(&request)?)
    }

    /// Calls `reconcile` with an encoded request.
    async fn call(&self, encoded: String) -> Result<WireResponse, PluginError> {
        timed(
            self.manifest(),
            "reconcile",
            self.loaded.plugin.reconcile_encoded(encoded),
        )
        .await
    }

    /// The requeue of the last quiet reconcile, if `encoded` is its request again.
    fn quiet(&self, encoded: &str) -> Option<Option<Duration>> {
        let key = self.parent.key();
        let quiet = self.shared.quiet.lock().expect("quiet lock");
        quiet
            .get(&key)
            .filter(|q| q.matches(self.loaded, encoded))
            .map(|q| q.requeue_after)
    }

    /// Records (or, with `None`, forgets) the request of a reconcile that changed nothing.
    fn remember(&self, quiet: Option<Quiet>) {
        let key = self.parent.key();
        let mut memo = self.shared.quiet.lock().expect("quiet lock");
        match quiet {
            Some(q) => memo.insert(key, q),
            None => memo.remove(&key),
        };
    }

    fn validate(&self, response: WireResponse) -> Result<Validated, ReconcileError> {
        let kinds = &self.shared.kinds;
        let scope_of = |k: &KindRef| kinds.scope_of(k);
        let target = Target {
            manifest: self.manifest(),
            parent: self.parent_value(),
            scope_of: &scope_of,
            parent_scope: kinds.parent.scope(),
        };
        let validated =
            validate::validate(&target, response).map_err(ReconcileError::InvalidOutput)?;
        // A cluster-scoped parent's children may name any namespace, but never write what is
        // the host's there.
        let host = self.shared.reads.host();
        if let Some(child) = validated.children.iter().find(|c| host.owns_object(*c)) {
            return Err(ReconcileError::HostNamespace(describe_child(child)));
        }
        Ok(validated)
    }

    /// The desired children beside the observed ones, for [`apply`].
    fn children<'s>(&'s self, desired: Vec<Value>, field_manager: &'s str) -> Children<'s> {
        let kinds = &self.shared.kinds;
        let uid = self.parent.uid().unwrap_or_default();
        Children {
            kinds: &self.shared.child_kinds,
            desired,
            observed: self
                .shared
                .children
                .iter()
                .map(|c| c.controlled_by(uid))
                .collect(),
            owner: apply::ssa::owner_reference(
                self.parent,
                &kinds.parent.kind.api_version,
                &kinds.parent.kind.kind,
            ),
            existing: &self.shared.children,
            plugin: &self.manifest().name,
            field_manager,
        }
    }

    /// Applies the desired children and prunes this plugin's ones no longer desired.
    async fn apply_children(&self, desired: Vec<Value>) -> Result<apply::Report, apply::Failures> {
        let field_manager = self.manifest().field_manager();
        let children = self.children(desired, &field_manager);
        let report =
            apply::reconcile_children(&self.shared.writer, children, &self.shared.creates).await?;
        if report != apply::Report::default() {
            tracing::info!(
                applied = report.applied,
                pruned = report.pruned,
                unchanged = report.unchanged,
                "children updated"
            );
        }
        Ok(report)
    }

    /// The plugin's status with `Ready=True`, written only when it changed; whether it was.
    async fn write_status(&self, plugin_status: Option<&Value>) -> Result<bool, ReconcileError> {
        // A built-in kind's status belongs to its own controller, in its own schema.
        if self.shared.kinds.parent.is_builtin() {
            return Ok(false);
        }
        let ready = status::reconciled(&self.loaded.describe());
        let desired = status::desired(
            self.parent.field("status").as_ref(),
            plugin_status,
            self.parent.generation(),
            &ready,
            &status::now(),
        );
        status::write(
            &self.api,
            self.parent,
            desired,
            &self.manifest().field_manager(),
        )
        .await
        .map_err(ReconcileError::Status)
    }

    fn publish_events(&self, events: &[WireEvent]) {
        for ev in events {
            let type_ = match ev.type_ {
                wasmop_contract::wire::EventType::Normal => EventType::Normal,
                wasmop_contract::wire::EventType::Warning => EventType::Warning,
            };
            publish(self.shared, self.parent, type_, &ev.reason, &ev.message);
        }
    }

    async fn release_finalizer(&self) -> Result<(), ReconcileError> {
        finalizers::set(
            &self.api,
            self.parent,
            &self.manifest().finalizer_name(),
            false,
        )
        .await
    }
}

/// What reconciling the parent at `key` with `loaded` would change, writing nothing (the
/// candidate of a preview): the same steps as a reconcile up to validation, then the children
/// dry-run (see [`apply::preview`]) and the status compared. `None` when the parent is gone or
/// being deleted.
pub async fn preview(shared: &Shared, loaded: &Loaded, key: &ObjKey) -> Option<ParentPreview> {
    let parent = shared.parents.get(key.namespace(), &key.name)?;
    if parent.is_deleting() || shared.reads.host().owns_object(&parent) {
        return None;
    }
    let step = Step::new(shared, loaded, &parent);
    let result: Result<ParentPreview, ReconcileError> = async {
        if let Some(error) = parent.undecodable() {
            return Err(ReconcileError::Undecodable(error.to_string()));
        }
        step.may_read_parent().await?;
        // Asked afresh, and not kept: the kept selectors are the live version's.
        let selectors = timed(
            step.manifest(),
            "related",
            loaded.plugin.related_encoded(parent.json().to_owned()),
        )
        .await?;
        parse_selectors(&shared.kinds, &selectors)?;
        let response = step.call(step.encode(&selectors).await?).await?;
        let validated = step.validate(response)?;
        let field_manager = step.manifest().field_manager();
        let planned = apply::plan(step.children(validated.children, &field_manager));
        let children = apply::preview::preview(&shared.writer, &planned, &field_manager).await;
        let status = status_changes(parent.field("status").as_ref(), validated.status.as_ref());
        Ok(ParentPreview {
            children,
            status,
            error: None,
        })
    }
    .await;
    Some(result.unwrap_or_else(|e| ParentPreview {
        error: Some(format!("{}: {e}", e.reason())),
        ..ParentPreview::default()
    }))
}

/// The fields of the plugin's status that would change; the host's own (`observedGeneration`,
/// the `Ready` condition, transition times) are left out.
fn status_changes(current: Option<&Value>, plugin: Option<&Value>) -> Vec<FieldChange> {
    let strip = |v: Option<&Value>| -> Value {
        let mut v = v.cloned().unwrap_or_else(|| json!({}));
        if let Some(m) = v.as_object_mut() {
            m.remove("observedGeneration");
            if let Some(Value::Array(conditions)) = m.get_mut("conditions") {
                conditions.retain(|c| c["type"] != status::READY);
                for c in conditions.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("lastTransitionTime");
                    c.remove("observedGeneration");
                }
                if conditions.is_empty() {
                    m.remove("conditions");
                }
            }
        }
        v
    };
    match plugin {
        // A plugin that returns no status leaves it as it is.
        None => Vec::new(),
        Some(p) => apply::preview::changes(&strip(current), &strip(Some(p))),
    }
}

fn count_skipped(manifest: &Manifest) {
    metrics()
        .reconciles_skipped
        .get_or_create(&PluginLabels {
            plugin: manifest.name.clone(),
        })
        .inc();
}

/// Runs one call into the sandbox and records how long it took.
async fn timed<T>(
    manifest: &Manifest,
    call: &'static str,
    f: impl std::future::Future<Output = T>,
) -> T {
    let started = std::time::Instant::now();
    let out = f.await;
    metrics()
        .plugin_call_duration
        .get_or_create(&CallLabels {
            plugin: manifest.name.clone(),
            call,
        })
        .observe(started.elapsed().as_secs_f64());
    out
}

/// Puts the failure on the parent: a Warning Event, and `Ready=False` (unless it is being
/// deleted) beside the plugin's status if it answered. Hands the error back.
async fn record_failure(
    shared: &Shared,
    loaded: &Loaded,
    parent: &Object,
    failure: Failure,
) -> ReconcileError {
    let Failure { error, status } = failure;
    let reason = error.reason();
    let message = format!("plugin {} failed: {error}", loaded.describe());
    publish(shared, parent, EventType::Warning, reason, &message);
    if parent.is_deleting() || shared.kinds.parent.is_builtin() {
        return error;
    }
    let ready = Ready {
        ok: false,
        reason: reason.to_string(),
        message: truncate(message, 1024),
    };
    let desired = status::desired(
        parent.field("status").as_ref(),
        status.as_ref(),
        parent.generation(),
        &ready,
        &status::now(),
    );
    let api = shared.kinds.parent.api(&shared.writer, parent.namespace());
    let field_manager = loaded.plugin.manifest().field_manager();
    if let Err(e) = status::write(&api, parent, desired, &field_manager).await {
        tracing::warn!(error = %crate::text::chain(&e), "could not record the failure in the parent's status");
    }
    error
}

fn publish(shared: &Shared, parent: &Object, type_: EventType, reason: &str, message: &str) {
    let owned = |s: Option<&str>| s.map(str::to_owned);
    let reference = ObjectReference {
        api_version: Some(parent.api_version().to_owned()),
        kind: Some(parent.kind().to_owned()),
        name: Some(parent.name().to_owned()),
        namespace: owned(parent.namespace()),
        uid: owned(parent.uid()),
        resource_version: owned(parent.resource_version()),
        ..Default::default()
    };
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(truncate(message.to_string(), 1000)),
        action: "Reconcile".into(),
        secondary: None,
    };
    shared.events.record(event, reference);
}

/// Parses what `related` returned, checking each kind was declared.
fn parse_selectors(
    kinds: &Kinds,
    selectors: &[RelatedSelector],
) -> Result<Vec<(usize, Selector)>, ReconcileError> {
    let mut parsed = Vec::with_capacity(selectors.len());
    for sel in selectors {
        let idx = kinds.related.iter().position(|(k, _)| k.kind == sel.kind);
        match (idx, Selector::try_from(sel.label_selector.clone())) {
            (Some(i), Ok(s)) => parsed.push((i, s)),
            (None, _) => {
                return Err(ReconcileError::InvalidSelector(format!(
                    "a selector for undeclared kind {}",
                    sel.kind
                )));
            }
            (_, Err(e)) => {
                return Err(ReconcileError::InvalidSelector(format!(
                    "a selector for {} that does not parse: {e}",
                    sel.kind
                )));
            }
        }
    }
    Ok(parsed)
}

/// `Kind namespace/name` of a desired child, for messages.
fn describe_child(child: &Value) -> String {
    let at = |p| child.pointer(p).and_then(Value::as_str).unwrap_or("?");
    format!(
        "{} {}/{}",
        at("/kind"),
        at("/metadata/namespace"),
        at("/metadata/name")
    )
}

/// Gathers from the shared caches: children through the owner-UID index, related objects by
/// namespace and label selector.
struct CacheObserved<'a>(&'a Shared);

impl Observed<Arc<Object>> for CacheObserved<'_> {
    fn controlled(&self, kind: &KindRef, parent_uid: &str) -> Vec<Arc<Object>> {
        self.0
            .child_kinds
            .iter()
            .position(|k| &k.kind == kind)
            .map(|i| self.0.children[i].controlled_by(parent_uid))
            .unwrap_or_default()
    }

    fn selected(
        &self,
        kind: &KindRef,
        namespace: Option<&str>,
        selector: &LabelSelector,
    ) -> Vec<Arc<Object>> {
        let kinds = &self.0.kinds;
        let Some(i) = kinds.related.iter().position(|(k, _)| &k.kind == kind) else {
            return Vec::new();
        };
        let ns = if kinds.parent.namespaced {
            namespace
        } else {
            None
        };
        self.0.related[i].select(ns, selector)
    }
}
