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
/// The condition type reporting whether all replicas are available.
pub const AVAILABLE: &str = "Available";

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
    /// Standard conditions; the plugin sets `Available`.
    pub conditions: Vec<Condition>,
}

wasmop_guest::custom_resource! {
    /// A memcached cluster of spec.size pods.
    pub struct Memcached("cache.example.com", "v1alpha1", "memcacheds", MemcachedSpec, MemcachedStatus);
}

/// The plugin's settings (`settings.yaml` beside the module).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Settings {
    /// The memcached image; [`DEFAULT_IMAGE`] when unset.
    pub image: Option<String>,
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
        let (name, size) = (req.name(), req.parent().spec.size);
        wasmop_guest::ensure!(size >= 0, "spec.size must be ≥ 0, got {size}");
        let image = req.settings::<Settings>()?.image;
        let image = image.as_deref().unwrap_or(DEFAULT_IMAGE);
        // Two fields of the observed Deployment: a whole k8s-openapi one would double the module.
        let observed = req.child_json::<Deployment>(name);
        let field = |p: &str| observed.and_then(|d| d.pointer(p)?.as_i64());
        let (replicas, available) = (field("/spec/replicas"), field("/status/availableReplicas"));

        let (want, available) = (i64::from(size), available.unwrap_or(0));
        let ready = replicas == Some(want) && available == want;
        let counts = format!("{available}/{size} replicas available");
        let (reason, message) = match (observed, ready) {
            (None, _) => ("Creating", format!("Deployment {name} does not exist yet")),
            (_, true) => ("Available", counts),
            (_, false) => ("Scaling", counts),
        };
        let condition = Condition::new(AVAILABLE, ready, reason, message);
        let status = MemcachedStatus {
            nodes: req.related_names::<Pod>(),
            conditions: vec![condition.observed_generation(req.generation())],
        };
        let response = Response::new()
            .child_json(deployment(name, req.namespace(), size, image))
            .status(status);

        // Events follow observed state only, so a steady state records none.
        let from = replicas.unwrap_or(1);
        let event = match observed {
            None => (
                "Created",
                format!("Created Deployment {name} with {size} replicas"),
            ),
            Some(_) if from != want => (
                "Scaled",
                format!("Scaled Deployment {name} from {from} to {size} replicas"),
            ),
            Some(_) => return Ok(response),
        };
        Ok(response.normal(event.0, event.1))
    }
}

/// The labels on the Deployment, its selector and its pods: `app=memcached,memcached_cr=<name>`.
pub fn labels(name: &str) -> [(&str, &str); 2] {
    [("app", "memcached"), ("memcached_cr", name)]
}

/// The desired Deployment for the `Memcached` `namespace/name`.
pub fn deployment(name: &str, namespace: Option<&str>, size: i32, image: &str) -> Value {
    let labels = BTreeMap::from(labels(name));
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": size, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "memcached", "image": image,
                "command": ["memcached", "-m=64", "-o", "modern", "-v"],
                "ports": [{"name": "memcached", "containerPort": PORT}]}]},
        }},
    })
}
