//! The plugin run natively, through the same JSON path the host uses.

use __CRATE__::*;
use wasmop_guest::k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use wasmop_guest::testing::{self, RequestBuilder, ResponseExt};

fn sample(replicas: i32) -> __KIND__ {
    let spec = __KIND__Spec {
        replicas,
        image: "nginx:1.27".into(),
        pull_policy: None,
        port: None,
        pod_labels: Default::default(),
    };
    __KIND__::new("sample", spec)
}

/// The Deployment as the API server reports it once `ready` pods are ready.
fn observed(parent: &__KIND__, ready: i32) -> Deployment {
    let desired = deployment(parent.name(), Some("default"), &parent.spec);
    let mut d: Deployment = serde_json::from_value(desired).unwrap();
    d.status = Some(DeploymentStatus {
        ready_replicas: Some(ready),
        ..DeploymentStatus::default()
    });
    d
}

#[test]
fn a_new_parent_gets_its_deployment_and_is_not_available_yet() {
    let req = RequestBuilder::new(&sample(2)).build();
    let resp = testing::reconcile::<__KIND__Plugin>(&req).unwrap();

    let d: Deployment = resp.child("sample").expect("a Deployment named sample");
    assert_eq!(d.spec.replicas, Some(2));
    let status = resp.status.unwrap();
    assert_eq!(status["conditions"][0]["status"], "False");
    assert_eq!(status["conditions"][0]["message"], "0/2 pods ready");
}

#[test]
fn ready_pods_make_it_available() {
    let parent = sample(2);
    let req = RequestBuilder::new(&parent).child(&observed(&parent, 2)).build();
    let resp = testing::reconcile::<__KIND__Plugin>(&req).unwrap();

    let status = resp.status.unwrap();
    assert_eq!(status["readyReplicas"], 2);
    assert_eq!(status["conditions"][0]["status"], "True");
}

#[test]
fn negative_replicas_is_an_error() {
    let req = RequestBuilder::new(&sample(-1)).build();
    let err = testing::reconcile::<__KIND__Plugin>(&req).unwrap_err();
    assert!(err.contains("spec.replicas must be ≥ 0"), "{err}");
}

#[test]
fn the_crd_carries_the_status_the_host_writes() {
    let crd = crd().to_json();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let status = &schema["properties"]["status"]["properties"];
    assert_eq!(status["readyReplicas"]["type"], "integer");
    assert_eq!(status["observedGeneration"]["type"], "integer");
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
}

#[test]
fn optional_fields_reach_the_pods() {
    let mut parent = sample(1);
    parent.spec.pull_policy = Some(PullPolicy::Always);
    parent.spec.port = Some(8080);
    parent.spec.pod_labels.insert("team".into(), "web".into());
    let resp = testing::reconcile::<__KIND__Plugin>(&RequestBuilder::new(&parent).build()).unwrap();

    let d: Deployment = resp.child("sample").expect("a Deployment");
    let template = d.spec.template;
    let container = &template.spec.unwrap().containers[0];
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 8080);
    let labels = template.metadata.unwrap().labels.unwrap();
    assert_eq!(labels["team"], "web");
    assert_eq!(labels["app.kubernetes.io/instance"], "sample");
}
