//! The operator-sdk Memcached operator as a wasmop plugin: the reconcile logic.
//!
//! For each `Memcached` (`cache.example.com/v1alpha1`) [`MemcachedPlugin`] keeps a Deployment
//! of `spec.size` memcached pods named after the object, and reports the pod names in
//! `status.nodes` and whether every replica is available in the `Available` condition.
//!
//! This crate exports nothing: the `memcached` crate builds it into `memcached.wasm` and holds
//! its tests; `memcached-v2` builds on it. `deploy/crds/memcached.yaml` is written from these
//! types (`cargo run -p memcached --example crd`).

use std::collections::BTreeMap;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wasmop_guest::schemars::{self, JsonSchema};
use wasmop_guest::{Condition, Error, Manifest, Plugin, RelatedSelector, Request, Response};

/// The image used when the settings name none.
pub const DEFAULT_IMAGE: &str = "memcached:1.4.36-alpine";
/// The memcached port, on the container and (in v2) the Service.
pub const PORT: i32 = 11211;

/// `Memcached.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemcachedSpec {
    /// The number of memcached pods.
    #[schemars(range(min = 0))]
    pub size: i32,
}

/// `Memcached.status`, as the plugin writes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemcachedStatus {
    /// The names of the memcached pods, sorted.
    pub nodes: Vec<String>,
    /// How many there are: what `kubectl scale` and autoscalers read.
    #[serde(default)]
    pub replicas: i32,
    /// Standard conditions; the plugin sets `Available`.
    pub conditions: Vec<Condition>,
}

wasmop_guest::custom_resource! {
    /// A memcached cluster of spec.size pods.
    pub struct Memcached("cache.example.com", "v1alpha1", "memcacheds", MemcachedSpec, MemcachedStatus);
}

/// The Memcached plugin.
pub struct MemcachedPlugin;

impl Plugin for MemcachedPlugin {
    type Parent = Memcached;

    fn manifest() -> Manifest {
        // Every build is named `memcached`, so that builds replace one another.
        Manifest::new("memcached", env!("CARGO_PKG_VERSION"))
            .parent::<Memcached>()
            .child::<Deployment>()
            .related_meta::<Pod>()
    }

    fn related(parent: &Memcached) -> Result<Vec<RelatedSelector>, Error> {
        Ok(vec![RelatedSelector::labels::<Pod>(labels(parent.name()))])
    }

    fn reconcile(req: &Request<Memcached>) -> Result<Response, Error> {
        let (name, size) = (req.name(), i64::from(req.parent().spec.size));
        wasmop_guest::ensure!(size >= 0, "spec.size must be ≥ 0, got {size}");
        // The one setting, `image` (settings.yaml beside the module).
        let image: Option<String> = req.setting("image")?;
        // Two fields of the observed Deployment: a whole k8s-openapi one would double the module.
        let observed = req.child_json::<Deployment>(name);
        let field = |p: &str| observed.and_then(|d| d.pointer(p)?.as_i64());
        let replicas = field("/spec/replicas");
        let available = field("/status/availableReplicas").unwrap_or(0);

        let ready = replicas == Some(size) && available == size;
        let counts = format!("{available}/{size} replicas available");
        let (reason, message) = match (observed, ready) {
            (None, _) => ("Creating", format!("Deployment {name} does not exist yet")),
            (_, true) => ("Available", counts),
            (_, false) => ("Scaling", counts),
        };
        let condition = Condition::new("Available", ready, reason, message);
        let nodes = req.related_names::<Pod>();
        let status = MemcachedStatus {
            replicas: i32::try_from(nodes.len()).unwrap_or(i32::MAX),
            nodes,
            conditions: vec![condition.observed_generation(req.generation())],
        };
        let response = Response::new()
            .child_json(deployment(name, req.namespace(), size, image.as_deref()))
            .status(status);

        // Events follow observed state only, so a steady state records none.
        let from = replicas.unwrap_or(1);
        let created = format!("Created Deployment {name} with {size} replicas");
        let scaled = format!("Scaled Deployment {name} from {from} to {size} replicas");
        Ok(match observed {
            None => response.normal("Created", created),
            Some(_) if from != size => response.normal("Scaled", scaled),
            Some(_) => response,
        })
    }
}

/// The labels on the Deployment, its selector and its pods: `app=memcached,memcached_cr=<name>`.
pub fn labels(name: &str) -> BTreeMap<&str, &str> {
    BTreeMap::from([("app", "memcached"), ("memcached_cr", name)])
}

/// The desired Deployment for the `Memcached` `namespace/name`; `image` defaults to
/// [`DEFAULT_IMAGE`].
pub fn deployment(name: &str, namespace: Option<&str>, size: i64, image: Option<&str>) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {"replicas": size, "selector": {"matchLabels": labels(name)}, "template": {
            "metadata": {"labels": labels(name)},
            "spec": {"containers": [{"name": "memcached", "image": image.unwrap_or(DEFAULT_IMAGE),
                "command": ["memcached", "-m=64", "-o", "modern", "-v"],
                "ports": [{"name": "memcached", "containerPort": PORT}]}]},
        }},
    })
}
