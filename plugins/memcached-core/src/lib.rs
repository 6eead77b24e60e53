//! The operator-sdk Memcached operator as a wasmop plugin: the reconcile logic.
//!
//! For each `Memcached` (`cache.example.com/v1alpha1`) [`MemcachedPlugin`] keeps a Deployment
//! of `spec.size` memcached pods named after the object, and reports the pod names in
//! `status.nodes` and whether every replica is available in the `Available` condition.
//!
//! This crate exports nothing: the `memcached` crate builds it into `memcached.wasm` and holds
//! its tests; `memcached-v2` builds on it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::{NamespaceResourceScope, Resource};
use serde::{Deserialize, Serialize};
use wasmop_guest::{Condition, Error, Manifest, Plugin, RelatedSelector, Request, Response};

/// The image used when the settings name none.
pub const DEFAULT_IMAGE: &str = "memcached:1.4.36-alpine";
/// The memcached port, on the container and (in v2) the Service.
pub const PORT: i32 = 11211;
/// The condition type reporting whether all replicas are available.
pub const AVAILABLE: &str = "Available";

/// The parent: a `Memcached` custom resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Memcached {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: MemcachedSpec,
}

impl Resource for Memcached {
    const API_VERSION: &'static str = "cache.example.com/v1alpha1";
    const GROUP: &'static str = "cache.example.com";
    const KIND: &'static str = "Memcached";
    const VERSION: &'static str = "v1alpha1";
    const URL_PATH_SEGMENT: &'static str = "memcacheds";
    type Scope = NamespaceResourceScope;
}

/// `Memcached.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemcachedSpec {
    /// The number of memcached pods.
    pub size: i32,
}

/// `Memcached.status`. The host adds `observedGeneration`, a `Ready` condition and each
/// condition's `lastTransitionTime`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemcachedStatus {
    /// The names of the memcached pods, sorted.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Standard conditions; only `Available` is set.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The plugin's settings (`settings.yaml` beside the module).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// The memcached image.
    pub image: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.to_owned(),
        }
    }
}

/// The two fields read from the observed Deployment. Reading a whole k8s-openapi `Deployment`
/// would link its deserialiser (pod spec and all) and roughly double the module.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ObservedDeployment {
    spec: ObservedSpec,
    status: ObservedStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ObservedSpec {
    replicas: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ObservedStatus {
    available_replicas: Option<i32>,
}

/// The Memcached plugin.
pub struct MemcachedPlugin;

impl Plugin for MemcachedPlugin {
    type Parent = Memcached;

    fn manifest() -> Manifest {
        // The name stays `memcached` in every build so that builds replace one another; this
        // crate's version is the first build's.
        Manifest::new("memcached", env!("CARGO_PKG_VERSION"))
            .parent::<Memcached>()
            .child::<Deployment>()
            .related_meta::<Pod>()
    }

    fn related(parent: &Memcached) -> Result<Vec<RelatedSelector>, Error> {
        Ok(vec![RelatedSelector::labels::<Pod>(labels(name(
            &parent.metadata,
        )))])
    }

    fn reconcile(req: &Request<Memcached>) -> Result<Response, Error> {
        let cr = req.parent();
        let size = cr.spec.size;
        if size < 0 {
            wasmop_guest::bail!("spec.size must be ≥ 0, got {size}");
        }
        let settings: Settings = req.settings()?;
        let name = req.name();

        let observed = req.child_as::<Deployment, ObservedDeployment>(name)?;
        let observed_replicas = observed.as_ref().and_then(|d| d.spec.replicas);
        let available = observed
            .as_ref()
            .and_then(|d| d.status.available_replicas)
            .unwrap_or(0);

        let mut nodes: Vec<String> = req
            .related_meta::<Pod>()?
            .into_iter()
            .filter_map(|m| m.name)
            .collect();
        nodes.sort();

        let counts = format!("{available}/{size} replicas available");
        let condition = match &observed {
            None => Condition::new(
                AVAILABLE,
                false,
                "Creating",
                format!("Deployment {name} does not exist yet"),
            ),
            Some(_) if observed_replicas == Some(size) && available == size => {
                Condition::new(AVAILABLE, true, "Available", counts)
            }
            Some(_) => Condition::new(AVAILABLE, false, "Scaling", counts),
        };
        let status = MemcachedStatus {
            nodes,
            conditions: vec![condition.observed_generation(req.generation())],
        };

        let mut response = Response::new()
            .child(deployment(&cr.metadata, size, &settings.image))
            .status(status);
        // Events follow observed state only, so a steady state records none.
        match (observed.is_some(), observed_replicas) {
            (false, _) => {
                response = response.normal(
                    "Created",
                    format!("Created Deployment {name} with {size} replicas"),
                );
            }
            (true, replicas) if replicas != Some(size) => {
                let from = replicas.unwrap_or(1);
                response = response.normal(
                    "Scaled",
                    format!("Scaled Deployment {name} from {from} to {size} replicas"),
                );
            }
            _ => {}
        }
        Ok(response)
    }
}

/// The labels on the Deployment, its selector and its pods: `app=memcached,memcached_cr=<name>`.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_owned(), "memcached".to_owned()),
        ("memcached_cr".to_owned(), name.to_owned()),
    ])
}

/// The desired Deployment for a `Memcached` with this metadata.
pub fn deployment(parent: &ObjectMeta, size: i32, image: &str) -> Deployment {
    let labels = labels(name(parent));
    Deployment {
        metadata: child_meta(parent),
        spec: DeploymentSpec {
            replicas: Some(size),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "memcached".to_owned(),
                        image: Some(image.to_owned()),
                        command: Some(
                            ["memcached", "-m=64", "-o", "modern", "-v"]
                                .map(str::to_owned)
                                .to_vec(),
                        ),
                        ports: Some(vec![ContainerPort {
                            name: Some("memcached".to_owned()),
                            container_port: PORT,
                            ..ContainerPort::default()
                        }]),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}

/// Metadata for a child of the parent: same name and namespace, the Memcached labels.
pub fn child_meta(parent: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: parent.name.clone(),
        namespace: parent.namespace.clone(),
        labels: Some(labels(name(parent))),
        ..ObjectMeta::default()
    }
}

fn name(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}
