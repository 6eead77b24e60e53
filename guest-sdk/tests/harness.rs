//! The SDK through its public surface: a small plugin driven by `testing`, as a plugin author's
//! tests would.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};
use wasmop_guest::log::{self, Level};
use wasmop_guest::testing::{self, RequestBuilder};
use wasmop_guest::{Error, Manifest, Plugin, RelatedSelector, Request, Response};

#[derive(Deserialize)]
struct Parent {
    spec: Spec,
}

#[derive(Deserialize)]
struct Spec {
    mode: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Settings {
    prefix: String,
}

/// Reports what it observed in its status; `spec.mode` picks a misbehaviour.
struct Probe;

impl Plugin for Probe {
    type Parent = Parent;

    fn manifest() -> Manifest {
        Manifest::new("probe", "1.0.0")
            .parent_raw("example.com/v1", "Probe")
            .child::<ConfigMap>()
            .related_meta::<Pod>()
            .finalizer(true)
    }

    fn related(parent: &Parent) -> Result<Vec<RelatedSelector>, Error> {
        Ok(vec![RelatedSelector::labels::<Pod>([(
            "mode",
            parent.spec.mode.as_str(),
        )])])
    }

    fn reconcile(req: &Request<Parent>) -> Result<Response, Error> {
        let settings: Settings = req.settings()?;
        log::info!("mode {}", req.parent().spec.mode);
        let cm = |name: &str| ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("{}{name}", settings.prefix)),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let observed: Vec<String> = req
            .children::<ConfigMap>()?
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        let pods: Vec<String> = req
            .related_meta::<Pod>()?
            .into_iter()
            .filter_map(|m| m.name)
            .collect();
        let status = json!({
            "name": req.name(),
            "namespace": req.namespace(),
            "generation": req.generation(),
            "uid": req.parent_meta()?.uid,
            "observed": observed,
            "hasA": req.has_child::<ConfigMap>("a"),
            "pods": pods,
            "finalizing": req.finalizing(),
        });
        let resp = Response::new().status(status);
        match req.parent().spec.mode.as_str() {
            "fail" => Err(Error::msg("asked to fail")),
            "undeclared" => Ok(resp.child(Deployment::default())),
            "duplicate" => Ok(resp.child(cm("a")).child(cm("a"))),
            "finalize" => Ok(resp.finalized()),
            _ => Ok(resp.child(cm("a")).warning("Odd", "a warning")),
        }
    }
}

fn parent(mode: &str) -> Value {
    json!({
        "apiVersion": "example.com/v1",
        "kind": "Probe",
        "metadata": {"name": "p", "namespace": "ns", "generation": 7, "uid": "u-1"},
        "spec": {"mode": mode},
    })
}

fn named<T: Default>(name: &str, set: impl FnOnce(&mut T, ObjectMeta)) -> T {
    let mut obj = T::default();
    set(
        &mut obj,
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
    );
    obj
}

fn pod(name: &str) -> Pod {
    named(name, |p: &mut Pod, m| p.metadata = m)
}

fn config_map(name: &str) -> ConfigMap {
    named(name, |c: &mut ConfigMap, m| c.metadata = m)
}

#[test]
fn typed_views_of_the_request() {
    let req = RequestBuilder::new(&parent("ok"))
        .child(&config_map("a"))
        .child(&config_map("b"))
        .related_meta(&pod("p-2"))
        .related_meta(&pod("p-1"))
        .build();
    assert_eq!(req.related["Pod.v1"]["p-1"].as_object().unwrap().len(), 3);

    let resp = testing::reconcile::<Probe>(&req).unwrap();
    let status = resp.status.unwrap();
    assert_eq!(
        status,
        json!({
            "name": "p", "namespace": "ns", "generation": 7, "uid": "u-1",
            "observed": ["a", "b"], "hasA": true, "pods": ["p-1", "p-2"], "finalizing": false,
        })
    );
    assert_eq!(resp.children[0]["kind"], "ConfigMap");
    assert_eq!(resp.events[0].reason, "Odd");
    assert_eq!(
        testing::take_logs(),
        vec![(Level::Info, "mode ok".to_owned())]
    );
}

#[test]
fn declared_kinds_are_present_even_when_empty() {
    let resp = testing::reconcile::<Probe>(&RequestBuilder::new(&parent("ok")).build()).unwrap();
    assert_eq!(resp.status.unwrap()["observed"], json!([]));
}

#[test]
fn settings_are_read_with_defaults() {
    let req = RequestBuilder::new(&parent("ok")).settings(json!({"prefix": "x-"}));
    let resp = testing::reconcile::<Probe>(&req.build()).unwrap();
    assert_eq!(resp.children[0]["metadata"]["name"], "x-a");
}

#[test]
fn one_setting_by_key_names_the_key_when_it_does_not_fit() {
    let build = |settings: Value| {
        let wire = RequestBuilder::new(&parent("ok"))
            .settings(settings)
            .build();
        Request::<Value>::from_wire(wire).unwrap()
    };
    let req = build(json!({"image": "memcached:1.6", "replicas": "three"}));
    assert_eq!(
        req.setting::<String>("image").unwrap().as_deref(),
        Some("memcached:1.6")
    );
    assert_eq!(req.setting::<String>("absent").unwrap(), None);
    let err = req.setting::<i32>("replicas").unwrap_err();
    assert!(err.message().starts_with("settings.replicas: "), "{err}");
    assert_eq!(build(Value::Null).setting::<String>("image").unwrap(), None);
}

#[test]
fn finalizing_round_trip() {
    let req = RequestBuilder::new(&parent("finalize")).finalizing(true);
    let resp = testing::reconcile::<Probe>(&req.build()).unwrap();
    assert!(resp.finalized);
    assert_eq!(resp.status.unwrap()["finalizing"], true);
    assert!(Probe::manifest().finalizer);
}

#[test]
fn errors_and_host_refusals_surface_as_messages() {
    let run = |mode| testing::reconcile::<Probe>(&RequestBuilder::new(&parent(mode)).build());
    assert_eq!(run("fail").unwrap_err(), "asked to fail");
    // The host's own rules and messages (wasmop_contract::validate), every violation listed.
    assert_eq!(
        run("undeclared").unwrap_err(),
        "the plugin's response breaks 2 rules: \
         child #0 (apps/v1 Deployment ?): apps/v1 Deployment is not a child kind of plugin probe (declared: v1 ConfigMap); \
         child #0 (apps/v1 Deployment ?): metadata.name is required (generateName does not work with server-side apply)"
    );
    assert_eq!(
        run("duplicate").unwrap_err(),
        "the plugin's response breaks 1 rule: \
         child #1 (v1 ConfigMap a): duplicates child #0 (same group, kind, namespace and name)"
    );

    let bad_parent = json!({"metadata": {"name": "p"}, "spec": {}});
    let err = testing::reconcile::<Probe>(&RequestBuilder::new(&bad_parent).build()).unwrap_err();
    assert_eq!(err, "parent: missing field `mode`");
}

#[test]
fn related_selectors() {
    let selectors = testing::related::<Probe>(&parent("ok")).unwrap();
    assert_eq!(selectors.len(), 1);
    assert_eq!(selectors[0].kind.api_version, "v1");
    assert_eq!(
        selectors[0].label_selector_json(),
        r#"{"matchLabels":{"mode":"ok"}}"#
    );
}

#[test]
fn a_child_that_does_not_fit_its_type_names_itself() {
    let mut bad = serde_json::to_value(config_map("a")).unwrap();
    bad["data"] = json!(42);
    let mut req = RequestBuilder::new(&parent("ok")).build();
    req.children
        .entry("ConfigMap.v1".into())
        .or_default()
        .insert("a".into(), bad);
    let err = testing::reconcile::<Probe>(&req).unwrap_err();
    assert!(
        err.starts_with(r#"child ConfigMap.v1 "a": invalid type"#),
        "{err}"
    );
}
