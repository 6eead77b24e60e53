//! What each plugin has left in the cluster, kept across host restarts: its child kinds and
//! the finalizer it puts on its parents.
//!
//! A version that drops a child kind still has children of that kind out there, and only the
//! host knows they were the plugin's. The host records every plugin's child kinds, declared and
//! retired, in the ConfigMap [`LEDGER`] of its own namespace, one key per plugin ConfigMap, so
//! a host that starts after the swap — or was down during it — still prunes them.
//!
//! Likewise a plugin's finalizer outlives a ConfigMap deleted while no host ran (or while a
//! shard had no holder): the host records each plugin's parent kind and finalizer in
//! [`FINALIZERS`], and takes that finalizer off the parents of any plugin on record whose
//! ConfigMap is gone (`finalizers::release_listed`).
//!
//! A record is input like any ConfigMap: it is bounded, and what it names only widens what a
//! plugin's own identity does to its own objects (prunes its children of a kind, takes a
//! `wasmop.io/` finalizer off its parents). It is trusted only if the host made it: it carries
//! [`RECORD_LABEL`], a `wasmop.io/` label that no plugin's child may carry, and no plugin's
//! field manager has written it. One that fails this is ignored with a warning and replaced
//! whole on the host's next write, never patched into trust. A record an older host made
//! (without the label) is trusted while no plugin's field manager has touched it, and gets the
//! label on the next write.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use wasmop_contract::KindRef;

/// The ConfigMap of child kinds, in the host's namespace.
pub const LEDGER: &str = "wasmop-child-kinds";
/// The ConfigMap of finalizers, in the host's namespace.
pub const FINALIZERS: &str = "wasmop-finalizers";
/// Kinds kept per plugin; more are dropped, oldest retired first.
pub const MAX_KINDS: usize = 32;
/// Finalizer records read at most.
pub const MAX_FINALIZERS: usize = 1024;

/// The label the host puts on its records, `host`.
pub const RECORD_LABEL: &str = "wasmop.io/record";

/// Field managers of plugins: `wasmop/<plugin>` (`Manifest::field_manager`).
const PLUGIN_MANAGER_PREFIX: &str = "wasmop/";

/// Whether `cm` is a record the host made (see the module's docs).
pub fn made_by_host(cm: &ConfigMap) -> bool {
    let label = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(RECORD_LABEL));
    let plugin_touched = cm.metadata.managed_fields.iter().flatten().any(|f| {
        f.manager
            .as_deref()
            .is_some_and(|m| m.starts_with(PLUGIN_MANAGER_PREFIX))
    });
    !plugin_touched && label.is_none_or(|v| v == "host")
}

/// What every finalizer the host records starts with.
const FINALIZER_PREFIX: &str = "wasmop.io/";

/// One `apiVersion kind` per line.
pub fn format(kinds: &[KindRef]) -> String {
    kinds
        .iter()
        .map(|k| format!("{} {}\n", k.api_version, k.kind))
        .collect()
}

fn plausible(word: &str) -> bool {
    word.len() <= 253 && word.chars().all(|c| c.is_ascii_graphic())
}

/// The kinds in `text`: well-formed lines only, at most [`MAX_KINDS`].
pub fn parse(text: &str) -> Vec<KindRef> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (api_version, kind) = (words.next()?, words.next()?);
            (words.next().is_none() && plausible(api_version) && plausible(kind))
                .then(|| KindRef::new(api_version, kind))
        })
        .take(MAX_KINDS)
        .collect()
}

/// The finalizer a plugin puts on parents of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalizer {
    /// The parent kind.
    pub parent: KindRef,
    /// `wasmop.io/<plugin>`.
    pub name: String,
}

impl Finalizer {
    /// `apiVersion kind finalizer`, one line.
    pub fn format(&self) -> String {
        format!(
            "{} {} {}\n",
            self.parent.api_version, self.parent.kind, self.name
        )
    }

    /// The record in `text`, if it is one line of three plausible words and the finalizer is
    /// one the host gives plugins.
    pub fn parse(text: &str) -> Option<Finalizer> {
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let mut words = lines.next()?.split_whitespace();
        let (api_version, kind, name) = (words.next()?, words.next()?, words.next()?);
        let well_formed = lines.next().is_none()
            && words.next().is_none()
            && [api_version, kind, name].into_iter().all(plausible)
            && name.len() > FINALIZER_PREFIX.len()
            && name.starts_with(FINALIZER_PREFIX);
        well_formed.then(|| Finalizer {
            parent: KindRef::new(api_version, kind),
            name: name.to_string(),
        })
    }
}

/// Reads and writes one record ConfigMap, [`LEDGER`] or [`FINALIZERS`].
#[derive(Clone)]
pub struct Ledger {
    api: Api<ConfigMap>,
    name: &'static str,
}

impl Ledger {
    /// The child kinds on record in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Ledger {
            api: Api::namespaced(client, namespace),
            name: LEDGER,
        }
    }

    /// The finalizers on record in `namespace`.
    pub fn finalizers(client: Client, namespace: &str) -> Self {
        Ledger {
            api: Api::namespaced(client, namespace),
            name: FINALIZERS,
        }
    }

    /// Every entry, by plugin ConfigMap (none without the ConfigMap, or when the host did not
    /// make it).
    async fn entries(&self) -> kube::Result<BTreeMap<String, String>> {
        Ok(self
            .trusted()
            .await?
            .and_then(|cm| cm.data)
            .unwrap_or_default())
    }

    /// The record, `None` when there is none or it is not the host's (then warned about).
    async fn trusted(&self) -> kube::Result<Option<ConfigMap>> {
        let Some(cm) = self.api.get_opt(self.name).await? else {
            return Ok(None);
        };
        if made_by_host(&cm) {
            return Ok(Some(cm));
        }
        tracing::warn!(
            record = self.name,
            "ignoring a record the host did not make (no {RECORD_LABEL}=host label, or written by a plugin); the host's next write replaces it"
        );
        Ok(None)
    }

    /// The kinds recorded for `configmap` (none without a record); `None` when the record
    /// cannot be read, so that it is not overwritten either.
    pub async fn read(&self, configmap: &str) -> Option<Vec<KindRef>> {
        match self.entries().await {
            Ok(mut data) => Some(
                data.remove(configmap)
                    .map(|t| parse(&t))
                    .unwrap_or_default(),
            ),
            Err(e) => {
                tracing::warn!(configmap, error = %e, record = self.name, "could not read the record");
                None
            }
        }
    }

    /// Every well-formed finalizer record, at most [`MAX_FINALIZERS`]; `None` when the record
    /// cannot be read.
    pub async fn read_finalizers(&self) -> Option<BTreeMap<String, Finalizer>> {
        match self.entries().await {
            Ok(data) => Some(
                data.into_iter()
                    .filter_map(|(cm, text)| Some((cm, Finalizer::parse(&text)?)))
                    .take(MAX_FINALIZERS)
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, record = self.name, "could not read the record");
                None
            }
        }
    }

    /// Records `kinds` for `configmap`; `None` removes its record.
    pub async fn write(&self, configmap: &str, kinds: Option<&[KindRef]>) {
        self.put(configmap, kinds.map(format)).await
    }

    /// Records `finalizer` for `configmap` unless it is on record already; `None` removes
    /// its record.
    pub async fn write_finalizer(&self, configmap: &str, finalizer: Option<&Finalizer>) {
        let value = finalizer.map(Finalizer::format);
        let labelled = |cm: &ConfigMap| {
            cm.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(RECORD_LABEL))
                .is_some()
        };
        match self.trusted().await {
            Ok(Some(cm))
                if labelled(&cm)
                    && cm.data.as_ref().and_then(|d| d.get(configmap)) == value.as_ref() => {}
            Ok(None) if value.is_none() => {}
            _ => self.put(configmap, value).await,
        }
    }

    /// Sets the entry of `configmap` (`None` removes it), creating the ConfigMap if need be.
    /// A record the host did not make is deleted first and made anew, with this entry alone.
    async fn put(&self, configmap: &str, value: Option<String>) {
        let labels = json!({"app.kubernetes.io/part-of": "wasmop", RECORD_LABEL: "host"});
        let result = async {
            if let Some(cm) = self.api.get_opt(self.name).await?
                && !made_by_host(&cm)
            {
                tracing::warn!(
                    record = self.name,
                    "replacing a record the host did not make"
                );
                let precondition = kube::api::DeleteParams {
                    preconditions: cm.metadata.uid.clone().map(|uid| kube::api::Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                self.api.delete(self.name, &precondition).await?;
            }
            let patch = json!({"metadata": {"labels": labels}, "data": {configmap: value}});
            match self
                .api
                .patch(self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(kube::Error::Api(e)) if e.code == 404 && value.is_some() => {
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": {"name": self.name, "labels": labels},
                        "data": {configmap: value},
                    }))
                    .expect("a ConfigMap");
                    self.api
                        .create(&PostParams::default(), &cm)
                        .await
                        .map(|_| ())
                }
                r => r.map(|_| ()),
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(configmap, error = %e, record = self.name, "could not write the record");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_record_the_host_made_is_trusted() {
        let record = |labels: serde_json::Value, managers: &[&str]| -> ConfigMap {
            let fields: Vec<serde_json::Value> = managers
                .iter()
                .map(|m| json!({"manager": m, "operation": "Apply"}))
                .collect();
            serde_json::from_value(json!({
                "metadata": {"name": FINALIZERS, "labels": labels, "managedFields": fields},
            }))
            .unwrap()
        };
        assert!(made_by_host(&record(
            json!({RECORD_LABEL: "host"}),
            &["wasmop"]
        )));
        // An older host's, before the label.
        assert!(made_by_host(&record(json!({}), &["kube-rs"])));
        // Planted by a plugin as its child, with or without a forged label.
        assert!(!made_by_host(&record(json!({}), &["wasmop/evil"])));
        assert!(!made_by_host(&record(
            json!({RECORD_LABEL: "host"}),
            &["wasmop", "wasmop/evil"]
        )));
        assert!(!made_by_host(&record(
            json!({RECORD_LABEL: "plugin"}),
            &["kubectl"]
        )));
    }

    #[test]
    fn the_record_round_trips_and_is_bounded() {
        let kinds = vec![
            KindRef::new("apps/v1", "Deployment"),
            KindRef::new("v1", "Service"),
        ];
        assert_eq!(format(&kinds), "apps/v1 Deployment\nv1 Service\n");
        assert_eq!(parse(&format(&kinds)), kinds);
        let hostile = "apps/v1 Deployment extra\n\nv1\nv1 Ser\u{7f}vice\n".to_string()
            + &"v1 ConfigMap\n".repeat(1000);
        let parsed = parse(&hostile);
        assert_eq!(parsed.len(), MAX_KINDS);
        assert!(parsed.iter().all(|k| k.kind == "ConfigMap"));
    }

    #[test]
    fn a_finalizer_record_round_trips_and_names_only_wasmop_finalizers() {
        let record = Finalizer {
            parent: KindRef::new("cache.example.com/v1alpha1", "Memcached"),
            name: "wasmop.io/memcached".into(),
        };
        assert_eq!(
            record.format(),
            "cache.example.com/v1alpha1 Memcached wasmop.io/memcached\n"
        );
        assert_eq!(Finalizer::parse(&record.format()), Some(record));
        for hostile in [
            "",
            "v1 Pod",
            "v1 Pod kubernetes.io/pv-protection",
            "v1 Pod wasmop.io/",
            "v1 Pod wasmop.io/a extra",
            "v1 Pod wasmop.io/a\nv1 Secret wasmop.io/b",
            "v1 P\u{7f}od wasmop.io/a",
        ] {
            assert_eq!(Finalizer::parse(hostile), None, "{hostile:?}");
        }
        let long = format!("v1 Pod wasmop.io/{}", "a".repeat(300));
        assert_eq!(Finalizer::parse(&long), None);
    }
}
