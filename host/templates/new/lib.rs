//! The `__NAME__` plugin: each `__KIND__` gets a Deployment of `spec.replicas` pods running
//! `spec.image`, and reports how many are ready.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wasmop_guest::k8s_openapi::api::apps::v1::Deployment;
use wasmop_guest::schemars::{self, JsonSchema};
use wasmop_guest::{Condition, Crd, Error, Manifest, Plugin, Request, Response};

/// `__KIND__.spec`: what the user asks for. Fields that may be absent are `Option`s or
/// `#[serde(default)]`; every such type gives a schema the API server accepts.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct __KIND__Spec {
    /// How many pods to run.
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// The container image.
    pub image: String,
    /// When to pull the image; Kubernetes' default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<PullPolicy>,
    /// The port the container listens on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Labels added to every pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
}

/// `spec.pullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when the node does not have it.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// `__KIND__.status`: what the plugin reports. The host adds `observedGeneration`, the `Ready`
/// condition and each condition's `lastTransitionTime`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct __KIND__Status {
    /// Pods ready, as the Deployment reports.
    pub ready_replicas: i64,
    /// Standard conditions; this plugin sets `Available`.
    pub conditions: Vec<Condition>,
}

wasmop_guest::custom_resource! {
    /// A __KIND__: a Deployment of spec.replicas pods running spec.image.
    pub struct __KIND__("__GROUP__", "__VERSION__", "__PLURAL__", __KIND__Spec, __KIND__Status);
}

/// The plugin.
pub struct __KIND__Plugin;

impl Plugin for __KIND__Plugin {
    type Parent = __KIND__;

    fn manifest() -> Manifest {
        Manifest::new("__NAME__", env!("CARGO_PKG_VERSION"))
            .parent::<__KIND__>()
            .child::<Deployment>()
    }

    fn reconcile(req: &Request<__KIND__>) -> Result<Response, Error> {
        let spec = &req.parent().spec;
        let replicas = spec.replicas;
        wasmop_guest::ensure!(replicas >= 0, "spec.replicas must be ≥ 0, got {replicas}");
        wasmop_guest::ensure!(!spec.image.is_empty(), "spec.image must not be empty");

        // Read one field of the observed Deployment; `req.child::<Deployment>` reads it whole.
        let ready = req
            .child_json::<Deployment>(req.name())
            .and_then(|d| d.pointer("/status/readyReplicas")?.as_i64())
            .unwrap_or(0);
        let available = ready == i64::from(replicas);
        let reason = if available { "Available" } else { "Progressing" };
        let message = format!("{ready}/{replicas} pods ready");
        let condition = Condition::new("Available", available, reason, message)
            .observed_generation(req.generation());

        Ok(Response::new()
            .child_json(deployment(req.name(), req.namespace(), spec))
            .status(__KIND__Status {
                ready_replicas: ready,
                conditions: vec![condition],
            }))
    }
}

wasmop_guest::export!(__KIND__Plugin);

/// The desired Deployment for the `__KIND__` `namespace/name`.
pub fn deployment(name: &str, namespace: Option<&str>, spec: &__KIND__Spec) -> Value {
    let labels = json!({"app.kubernetes.io/name": "__NAME__", "app.kubernetes.io/instance": name});
    // The user's pod labels, under the plugin's own: the selector must keep matching.
    let mut pod_labels = json!(spec.pod_labels);
    pod_labels
        .as_object_mut()
        .expect("a map serialises as an object")
        .extend(labels.as_object().expect("an object").clone());
    let mut container = json!({"name": "main", "image": spec.image});
    if let Some(policy) = spec.pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }
    if let Some(port) = spec.port {
        container["ports"] = json!([{"containerPort": port}]);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [container]},
            },
        },
    })
}

/// The `__KIND__` CRD, written from the types above: `cargo run --example crd > crd.yaml`.
pub fn crd() -> Crd {
    Crd::of::<__KIND__>()
        .scale(".spec.replicas", ".status.readyReplicas")
        .column("Replicas", "integer", ".spec.replicas")
        .column("Ready Pods", "integer", ".status.readyReplicas")
}
