//! The Memcached plugin run natively through `wasmop_guest::testing`: the same JSON path the
//! component runs.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use memcached::*;
use serde_json::{Value, json};
use wasmop_guest::Plugin;
use wasmop_guest::testing::{self, RequestBuilder};
use wasmop_guest::wire::{EventType, WireResponse};

fn memcached(size: i32) -> Memcached {
    let mut m = Memcached::new("memcached-sample", MemcachedSpec { size });
    m.metadata.generation = Some(4);
    m
}

/// [`labels`] as k8s-openapi holds them.
fn label_map(name: &str) -> BTreeMap<String, String> {
    labels(name)
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(label_map("memcached-sample")),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

/// The Deployment as the API server would report it: `replicas` wanted, `available` ready.
fn observed(replicas: i32, available: i32) -> Deployment {
    let desired = deployment("memcached-sample", Some("default"), replicas.into(), None);
    let mut d: Deployment = serde_json::from_value(desired).unwrap();
    d.status = Some(DeploymentStatus {
        available_replicas: Some(available),
        ..DeploymentStatus::default()
    });
    d
}

fn run(req: RequestBuilder) -> WireResponse {
    testing::reconcile::<MemcachedPlugin>(&req.build()).expect("reconcile succeeds")
}

fn the_deployment(resp: &WireResponse) -> Deployment {
    assert_eq!(resp.children.len(), 1, "one child: {:?}", resp.children);
    serde_json::from_value(resp.children[0].clone()).unwrap()
}

fn available(resp: &WireResponse) -> Value {
    resp.status.as_ref().unwrap()["conditions"][0].clone()
}

#[test]
fn manifest_declares_parent_deployment_and_metadata_only_pods() {
    let m = MemcachedPlugin::manifest();
    assert_eq!(m.name, "memcached");
    assert_eq!(m.version, "0.1.0");
    assert_eq!(
        (m.parent.api_version.as_str(), m.parent.kind.as_str()),
        ("cache.example.com/v1alpha1", "Memcached")
    );
    assert_eq!(m.children, vec![wasmop_guest::KindRef::of::<Deployment>()]);
    assert_eq!(m.related.len(), 1);
    assert!(m.related[0].metadata_only);
    assert!(!m.finalizer);
}

#[test]
fn related_selects_pods_by_the_labels() {
    let selectors = testing::related::<MemcachedPlugin>(&memcached(3)).unwrap();
    assert_eq!(selectors.len(), 1);
    assert_eq!(selectors[0].kind.kind, "Pod");
    assert_eq!(
        selectors[0].label_selector_json(),
        r#"{"matchLabels":{"app":"memcached","memcached_cr":"memcached-sample"}}"#
    );
}

#[test]
fn size_becomes_replicas_with_labels_everywhere() {
    let resp = run(RequestBuilder::new(&memcached(3)));
    let json = &resp.children[0];
    assert_eq!(json["apiVersion"], "apps/v1");
    assert_eq!(json["kind"], "Deployment");

    let d = the_deployment(&resp);
    assert_eq!(d.metadata.name.as_deref(), Some("memcached-sample"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
    let want = label_map("memcached-sample");
    assert_eq!(d.metadata.labels.as_ref(), Some(&want));
    let spec = d.spec;
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.selector.match_labels.as_ref(), Some(&want));
    assert_eq!(spec.template.metadata.unwrap().labels.as_ref(), Some(&want));

    let c = &spec.template.spec.unwrap().containers[0];
    assert_eq!(c.name, "memcached");
    assert_eq!(c.image.as_deref(), Some(DEFAULT_IMAGE));
    assert_eq!(
        c.command.as_deref().unwrap(),
        ["memcached", "-m=64", "-o", "modern", "-v"]
    );
    let port = &c.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("memcached"), 11211)
    );
}

#[test]
fn image_comes_from_settings() {
    let resp = run(RequestBuilder::new(&memcached(1)).settings(json!({"image": "memcached:1.6"})));
    let d = the_deployment(&resp);
    let image = d.spec.template.spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("memcached:1.6"));
}

#[test]
fn nodes_are_the_sorted_pod_names() {
    let req = RequestBuilder::new(&memcached(3))
        .child(&observed(3, 3))
        .related_meta(&pod("memcached-sample-c"))
        .related_meta(&pod("memcached-sample-a"))
        .related_meta(&pod("memcached-sample-b"));
    let resp = run(req);
    assert_eq!(
        resp.status.unwrap()["nodes"],
        json!([
            "memcached-sample-a",
            "memcached-sample-b",
            "memcached-sample-c"
        ])
    );
}

#[test]
fn new_parent_creates_the_deployment_and_is_not_available() {
    let resp = run(RequestBuilder::new(&memcached(3)));
    let cond = available(&resp);
    assert_eq!(cond["type"], "Available");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "Creating");
    assert_eq!(cond["observedGeneration"], 4);
    assert!(cond.get("lastTransitionTime").is_none());
    assert_eq!(resp.events.len(), 1);
    assert_eq!(resp.events[0].type_, EventType::Normal);
    assert_eq!(resp.events[0].reason, "Created");
    assert_eq!(resp.requeue_after_seconds, None);
}

#[test]
fn all_replicas_available_is_a_quiet_steady_state() {
    let req = RequestBuilder::new(&memcached(3)).child(&observed(3, 3));
    let resp = run(req.clone());
    let cond = available(&resp);
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "Available");
    assert_eq!(cond["message"], "3/3 replicas available");
    assert!(resp.events.is_empty(), "{:?}", resp.events);
    // Deterministic: the host writes nothing when nothing changed.
    assert_eq!(resp, run(req));
}

#[test]
fn resize_scales_and_reports_scaling() {
    let resp = run(RequestBuilder::new(&memcached(5)).child(&observed(3, 3)));
    assert_eq!(the_deployment(&resp).spec.replicas, Some(5));
    let cond = available(&resp);
    assert_eq!(
        (cond["status"].as_str(), cond["reason"].as_str()),
        (Some("False"), Some("Scaling"))
    );
    assert_eq!(cond["message"], "3/5 replicas available");
    assert_eq!(resp.events.len(), 1);
    assert_eq!(resp.events[0].reason, "Scaled");
    assert_eq!(
        resp.events[0].message,
        "Scaled Deployment memcached-sample from 3 to 5 replicas"
    );
}

#[test]
fn losing_a_replica_flips_available_without_a_clock() {
    let resp = run(RequestBuilder::new(&memcached(3)).child(&observed(3, 2)));
    let cond = available(&resp);
    assert_eq!(
        (cond["status"].as_str(), cond["reason"].as_str()),
        (Some("False"), Some("Scaling"))
    );
    assert_eq!(cond["observedGeneration"], 4);
    // The host stamps the transition time; the plugin stays deterministic.
    assert!(cond.get("lastTransitionTime").is_none());
    assert!(resp.events.is_empty());
}

#[test]
fn size_zero_is_available_with_no_replicas() {
    let d = observed(0, 0);
    let resp = run(RequestBuilder::new(&memcached(0)).child(&d));
    assert_eq!(the_deployment(&resp).spec.replicas, Some(0));
    assert_eq!(available(&resp)["status"], "True");
}

#[test]
fn negative_size_is_an_error() {
    let err = testing::reconcile::<MemcachedPlugin>(&RequestBuilder::new(&memcached(-1)).build())
        .unwrap_err();
    assert_eq!(err, "spec.size must be ≥ 0, got -1");
}

#[test]
fn a_parent_without_spec_is_an_error() {
    let parent = json!({"metadata": {"name": "m", "namespace": "default"}});
    let err =
        testing::reconcile::<MemcachedPlugin>(&RequestBuilder::new(&parent).build()).unwrap_err();
    assert!(err.starts_with("parent: missing field `spec`"), "{err}");
}

#[test]
fn deploy_crd_is_the_one_written_from_the_types() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/crds/memcached.yaml"
    );
    let file: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        file,
        memcached::crd().to_json(),
        "deploy/crds/memcached.yaml is stale: cargo run -p memcached --example crd > deploy/crds/memcached.yaml"
    );
}

#[test]
fn a_status_the_host_wrote_alone_does_not_make_the_parent_unreadable() {
    // After a failed call the host writes Ready=False without the plugin's fields.
    let mut parent = serde_json::to_value(memcached(2)).unwrap();
    parent["status"] = json!({"observedGeneration": 4, "conditions": [
        {"type": "Ready", "status": "False", "reason": "PluginFailed", "message": "x",
         "lastTransitionTime": "2026-12-01T00:00:00Z"}]});
    let m: Memcached = serde_json::from_value(parent.clone()).unwrap();
    assert!(m.status.is_none());
    let resp = run(RequestBuilder::new(&parent));
    assert_eq!(the_deployment(&resp).spec.replicas, Some(2));
}
