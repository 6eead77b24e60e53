//! What a plugin's own identity may read, asked of the API server and remembered for a while.
//!
//! The host watches each kind once, with its own identity, for every plugin that declares it,
//! so its caches hold the union of what the plugins may read. A plugin is handed only what its
//! own ServiceAccount may read: before a request goes out, the host asks, as that account
//! (a SelfSubjectAccessReview through the impersonating client), whether it may `list` each
//! kind in each namespace the request would draw from, and leaves out whatever it may not; a
//! parent it may not read is not reconciled at all.
//!
//! The host's own namespace holds the plugins' ConfigMaps and settings, the host's records, its
//! artifacts and their key, its Leases: none of it is ever handed to a plugin, whatever the
//! plugin's account may read, and no child is written there ([`HostNamespace`]). A host
//! serving other namespaces keeps its whole namespace out of every plugin's reach. A host an
//! admin told to serve its own namespace (`--watch-namespace` equal to `--namespace`, a
//! one-namespace install) serves the parents there, but still keeps its own objects out:
//! every object named `wasmop-…` or carrying a `wasmop.io/` label (which children cannot).
//!
//! Answers are kept for [`config::READ_REVIEW_TTL`](crate::config::READ_REVIEW_TTL), so a
//! grant or a revocation takes effect within that time, and a steady state asks no review per
//! reconcile. A review that cannot be sent is an error, never an allowance.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use kube::Client;
use tokio::time::Instant;
use wasmop_contract::wire::WireRequest;

use super::access::{self, AccessError, Resource};
use crate::gather::WireObject;

/// Answers kept at most; past it, expired ones are dropped first, then all (a host watching
/// thousands of namespaces asks again, no more).
const MAX_ANSWERS: usize = 4096;

/// What of the host's namespace is the host's, and so never a plugin's to read or write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNamespace {
    /// The host's namespace.
    pub name: String,
    /// Whether the host serves parents in it too (a one-namespace install).
    pub served: bool,
}

/// The label children carry: the one `wasmop.io/` label that does not make an object the host's.
const MANAGED_BY: &str = "wasmop.io/managed-by";

impl HostNamespace {
    /// Whether the object named `name` in `namespace`, with these label keys, is the host's:
    /// anything in its namespace, or in a one-namespace install what is named `wasmop-…` or
    /// carries a `wasmop.io/` label other than the one every child carries.
    pub fn owns(&self, namespace: Option<&str>, name: &str, label_keys: &[&str]) -> bool {
        if namespace != Some(self.name.as_str()) {
            return false;
        }
        !self.served
            || name.starts_with("wasmop-")
            || label_keys
                .iter()
                .any(|k| k.starts_with("wasmop.io/") && *k != MANAGED_BY)
    }

    /// [`Self::owns`] for an observed object or a desired child.
    pub fn owns_object<O: WireObject>(&self, obj: &O) -> bool {
        // Every object of every request passes here: its labels are gathered only in the
        // host's namespace.
        obj.namespace() == Some(self.name.as_str())
            && self.owns(obj.namespace(), obj.name(), &obj.label_keys())
    }
}

/// One question: may the account list this resource in this namespace (`None`: everywhere).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Question {
    group: String,
    plural: String,
    namespace: Option<String>,
}

/// Answers with the time they were given; pure, so its expiry and bound are tested alone.
#[derive(Debug, Default)]
struct Answers {
    kept: HashMap<Question, (bool, Instant)>,
}

impl Answers {
    fn get(&self, q: &Question, now: Instant, ttl: Duration) -> Option<bool> {
        self.kept
            .get(q)
            .filter(|(_, at)| now.saturating_duration_since(*at) < ttl)
            .map(|(allowed, _)| *allowed)
    }

    fn put(&mut self, q: Question, allowed: bool, now: Instant, ttl: Duration) {
        if self.kept.len() >= MAX_ANSWERS && !self.kept.contains_key(&q) {
            self.kept
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
            if self.kept.len() >= MAX_ANSWERS {
                self.kept.clear();
            }
        }
        self.kept.insert(q, (allowed, now));
    }
}

/// The kinds of one plugin's request, by the key the request files them under
/// (`Deployment.apps/v1`), as RBAC names them.
pub type RequestKinds = Vec<(String, Resource)>;

/// What one plugin's identity may read.
pub struct Reads {
    client: Client,
    host: HostNamespace,
    ttl: Duration,
    plugin: String,
    answers: Mutex<Answers>,
}

/// Objects left out of one request because the plugin may not read them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// `kind key` and namespace (empty for cluster-scoped objects), once each.
    pub from: BTreeSet<(String, String)>,
    /// Objects left out.
    pub objects: usize,
}

impl Reads {
    /// Reads as `client` (the plugin's impersonating client), for the plugin `plugin` of a host
    /// whose namespace is `host`.
    pub fn new(client: Client, host: HostNamespace, plugin: &str, ttl: Duration) -> Self {
        Reads {
            client,
            host,
            ttl,
            plugin: plugin.to_string(),
            answers: Mutex::default(),
        }
    }

    /// The host's namespace and what of it is the host's.
    pub fn host(&self) -> &HostNamespace {
        &self.host
    }

    /// Whether the plugin may read `resource` in `namespace` (`None` for cluster-scoped
    /// objects). Allowed everywhere answers for every namespace; otherwise the namespace is
    /// asked on its own.
    pub async fn may_read(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
    ) -> Result<bool, AccessError> {
        if self.ask(resource, None).await? {
            return Ok(true);
        }
        match namespace.filter(|_| resource.namespaced) {
            Some(ns) => self.ask(resource, Some(ns)).await,
            None => Ok(false),
        }
    }

    async fn ask(&self, resource: &Resource, namespace: Option<&str>) -> Result<bool, AccessError> {
        let q = Question {
            group: resource.group.clone(),
            plural: resource.plural.clone(),
            namespace: namespace.map(str::to_string),
        };
        let now = Instant::now();
        if let Some(allowed) = self.answers().get(&q, now, self.ttl) {
            return Ok(allowed);
        }
        crate::telemetry::metrics()
            .access_reviews
            .get_or_create(&crate::telemetry::metrics::PluginLabels {
                plugin: self.plugin.clone(),
            })
            .inc();
        let need = access::Need {
            group: q.group.clone(),
            resource: q.plural.clone(),
            subresource: None,
            verbs: vec!["list"],
            namespaced: resource.namespaced,
        };
        let allowed = access::allowed(&self.client, &need, "list", namespace, None).await?;
        self.answers().put(q, allowed, now, self.ttl);
        Ok(allowed)
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers.lock().expect("answers lock")
    }

    /// Leaves out of `request` every child and related object the plugin may not read, and
    /// every one that is the host's.
    pub async fn withhold<O: WireObject>(
        &self,
        request: &mut WireRequest<O>,
        kinds: &RequestKinds,
    ) -> Result<Withheld, AccessError> {
        let mut verdicts: HashMap<(String, Option<String>), bool> = HashMap::new();
        for (key, namespace) in wanted(request) {
            let Some((_, resource)) = kinds.iter().find(|(k, _)| *k == key) else {
                // A kind the plugin did not declare reads nothing.
                verdicts.insert((key, namespace), false);
                continue;
            };
            let allowed = self.may_read(resource, namespace.as_deref()).await?;
            verdicts.insert((key, namespace), allowed);
        }
        let mut withheld = Withheld::default();
        let host = &self.host;
        retain(request, |key, obj| {
            let namespace = obj.namespace();
            let allowed = !host.owns_object(obj)
                && verdicts
                    .get(&(key.to_string(), namespace.map(str::to_string)))
                    .copied()
                    .unwrap_or(false);
            if !allowed {
                withheld
                    .from
                    .insert((key.to_string(), namespace.unwrap_or_default().to_string()));
                withheld.objects += 1;
            }
            allowed
        });
        Ok(withheld)
    }
}

/// Every kind key and namespace a request draws its children and related objects from.
fn wanted<O: WireObject>(request: &WireRequest<O>) -> BTreeSet<(String, Option<String>)> {
    request
        .children
        .iter()
        .chain(&request.related)
        .flat_map(|(key, objects)| {
            objects
                .values()
                .map(move |o| (key.clone(), o.namespace().map(str::to_string)))
        })
        .collect()
}

/// Keeps the children and related objects for which `keep(kind key, object)` holds. Every
/// kind stays in the maps, empty if need be, as the contract promises.
pub fn retain<O: WireObject>(request: &mut WireRequest<O>, mut keep: impl FnMut(&str, &O) -> bool) {
    for (key, objects) in request.children.iter_mut().chain(&mut request.related) {
        objects.retain(|_, o| keep(key, o));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn q(ns: Option<&str>) -> Question {
        Question {
            group: String::new(),
            plural: "secrets".into(),
            namespace: ns.map(str::to_string),
        }
    }

    #[test]
    fn an_answer_is_kept_for_its_lifetime_then_asked_again() {
        let ttl = Duration::from_secs(30);
        let t0 = Instant::now();
        let mut answers = Answers::default();
        assert_eq!(answers.get(&q(Some("a")), t0, ttl), None);
        answers.put(q(Some("a")), false, t0, ttl);
        assert_eq!(
            answers.get(&q(Some("a")), t0 + Duration::from_secs(29), ttl),
            Some(false)
        );
        assert_eq!(answers.get(&q(Some("b")), t0, ttl), None, "per namespace");
        assert_eq!(
            answers.get(&q(None), t0, ttl),
            None,
            "everywhere is its own question"
        );
        assert_eq!(answers.get(&q(Some("a")), t0 + ttl, ttl), None, "expired");
    }

    #[test]
    fn answers_are_bounded_dropping_expired_ones_first() {
        let ttl = Duration::from_secs(30);
        let t0 = Instant::now();
        let mut answers = Answers::default();
        for i in 0..MAX_ANSWERS {
            answers.put(q(Some(&format!("old{i}"))), true, t0, ttl);
        }
        let later = t0 + ttl;
        answers.put(q(Some("fresh")), true, later, ttl);
        assert_eq!(answers.kept.len(), 1, "the expired ones went");
        for i in 0..MAX_ANSWERS {
            answers.put(q(Some(&format!("new{i}"))), true, later, ttl);
        }
        assert!(answers.kept.len() <= MAX_ANSWERS);
        assert_eq!(
            answers.get(&q(Some(&format!("new{}", MAX_ANSWERS - 1))), later, ttl),
            Some(true)
        );
    }

    #[test]
    fn the_hosts_namespace_is_the_hosts_or_its_own_objects_are_in_one_namespace_installs() {
        let mut host = HostNamespace {
            name: "wasmop-system".into(),
            served: false,
        };
        let other = Some("team-a");
        let mine = Some("wasmop-system");
        assert!(!host.owns(other, "wasmop-finalizers", &["wasmop.io/record"]));
        assert!(
            !host.owns(None, "wasmop-system", &[]),
            "cluster-scoped objects are not in it"
        );
        assert!(host.owns(mine, "anything", &[]));
        assert!(host.owns(mine, "settings", &["app"]));
        // One namespace for all: the parents there are served, the host's objects are not.
        host.served = true;
        assert!(!host.owns(mine, "cache", &["app", "wasmop.io/managed-by"]));
        for (name, labels) in [
            ("wasmop-finalizers", vec![]),
            ("wasmop-artifact-key", vec![]),
            ("memcached", vec!["wasmop.io/plugin"]),
            ("memcached-5d8f", vec!["wasmop.io/revision-of"]),
            ("planted", vec!["wasmop.io/record"]),
        ] {
            assert!(host.owns(mine, name, &labels), "{name}");
        }
        let cm = json!({"metadata": {"name": "memcached", "namespace": "wasmop-system", "labels": {"wasmop.io/plugin": ""}}});
        assert!(host.owns_object(&cm));
    }

    fn obj(ns: Option<&str>, name: &str) -> Value {
        match ns {
            Some(ns) => json!({"metadata": {"name": name, "namespace": ns}}),
            None => json!({"metadata": {"name": name}}),
        }
    }

    #[test]
    fn retain_keeps_every_kind_and_drops_only_the_refused_objects() {
        let mut request: WireRequest<Value> = WireRequest {
            parent: obj(None, "p"),
            children: [(
                "ConfigMap.v1".to_string(),
                [("a/x".to_string(), obj(Some("a"), "x"))].into(),
            )]
            .into(),
            related: [(
                "Secret.v1".to_string(),
                [
                    ("a/s".to_string(), obj(Some("a"), "s")),
                    ("b/s".to_string(), obj(Some("b"), "s")),
                ]
                .into(),
            )]
            .into(),
            finalizing: false,
            settings: Value::Null,
            now: None,
        };
        let asked = wanted(&request);
        assert_eq!(asked.len(), 3);
        retain(&mut request, |key, o| {
            !(key == "Secret.v1" && o.namespace() == Some("b"))
        });
        assert_eq!(request.children["ConfigMap.v1"].len(), 1);
        let secrets: Vec<&String> = request.related["Secret.v1"].keys().collect();
        assert_eq!(secrets, ["a/s"]);
        retain(&mut request, |_, _| false);
        assert!(request.related["Secret.v1"].is_empty());
        assert!(
            request.related.contains_key("Secret.v1"),
            "the kind stays, empty"
        );
    }
}
