//! CRDs written by the SDK (`Crd::of`) are accepted by the API server for every field type the
//! plugin guide recommends, and the Memcached CRD's scale subresource works as `kubectl scale`
//! uses it.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::json;
use wasmop_guest::Crd;
use wasmop_guest::schemars::{self, JsonSchema};

use support::{Env, TIMEOUT};

/// A spec with every field type the guide recommends.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EverythingSpec {
    /// A plain number.
    pub size: i32,
    /// Absent, null or a number.
    pub replicas: Option<u32>,
    /// Absent, null or a struct.
    pub tls: Option<Tls>,
    /// A map.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A list of structs, defaulted in the plugin.
    #[serde(default)]
    pub ports: Vec<Port>,
    /// A unit enum whose variants carry docs.
    pub tier: Tier,
    /// Absent, null or an enum.
    pub mode: Option<Tier>,
    /// Defaulted in the plugin, not by the API server.
    #[serde(default = "ten")]
    pub timeout: u64,
}

fn ten() -> u64 {
    10
}

/// A nested struct.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Tls {
    /// A Secret's name.
    pub secret: String,
    /// Absent or a port.
    pub port: Option<u16>,
}

/// An item of a list.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Port {
    /// Its name.
    pub name: String,
    /// Its number.
    pub port: u16,
}

/// A unit enum.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub enum Tier {
    /// Small.
    Small,
    /// Large.
    Large,
    Huge,
}

/// The status a plugin might write.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct EverythingStatus {
    /// Absent or a count.
    pub ready: Option<i64>,
}

wasmop_guest::custom_resource! {
    /// A kind with every recommended field type.
    pub struct Everything("sdk.wasmop.io", "v1", "everythings", EverythingSpec, EverythingStatus);
}

#[tokio::test(flavor = "multi_thread")]
async fn sdk_crds_are_accepted_for_every_recommended_field_type() {
    let env = Env::new("e2e-crds").await;
    let crd: CustomResourceDefinition =
        serde_json::from_value(Crd::of::<Everything>().to_json()).expect("a CRD");
    testenv::apply_crd(&env.client, &crd, "e2e", TIMEOUT)
        .await
        .expect("the API server accepts the CRD and serves it");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("sdk.wasmop.io", "v1", "Everything"),
        "everythings",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), env.name(), &resource);
    // Every optional field as null, and every field set, round trip.
    let nulls = json!({
        "apiVersion": "sdk.wasmop.io/v1", "kind": "Everything",
        "metadata": {"name": "nulls"},
        "spec": {"size": 1, "replicas": null, "tls": null, "tier": "Small", "mode": null},
    });
    let full = json!({
        "apiVersion": "sdk.wasmop.io/v1", "kind": "Everything",
        "metadata": {"name": "full"},
        "spec": {
            "size": 2, "replicas": 3, "tls": {"secret": "s", "port": 443},
            "labels": {"a": "b"}, "ports": [{"name": "http", "port": 80}],
            "tier": "Huge", "mode": "Large", "timeout": 30,
        },
    });
    for obj in [nulls, full] {
        let obj: DynamicObject = serde_json::from_value(obj).unwrap();
        let name = obj.metadata.name.clone().unwrap();
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        let back = api.get(&name).await.unwrap();
        let spec: EverythingSpec = serde_json::from_value(back.data["spec"].clone())
            .unwrap_or_else(|e| panic!("{name} reads back as the plugin's type: {e}"));
        assert_eq!(spec.timeout, if name == "full" { 30 } else { 10 });
    }
    // The schema is enforced: an unknown variant is refused.
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "sdk.wasmop.io/v1", "kind": "Everything",
        "metadata": {"name": "bad"}, "spec": {"size": 1, "tier": "Tiny"},
    }))
    .unwrap();
    let err = api.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(err.to_string().contains("Tiny"), "{err}");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let _ = crds
        .delete("everythings.sdk.wasmop.io", &Default::default())
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_scale_resizes_a_memcached() {
    let (env, host) = Env::with_memcached("e2e-scale").await;
    env.memcached_ready("cache", 1).await;
    // What `kubectl scale memcached/cache --replicas 3` sends.
    let scale = json!({"spec": {"replicas": 3}});
    let memcacheds = env.memcacheds();
    memcacheds
        .patch_scale("cache", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .expect("the scale subresource");
    env.wait_replicas("cache", 3).await;
    env.wait_nodes("cache", 3).await;
    let reported = testenv::wait_until(
        "the scale subresource to report 3 replicas",
        TIMEOUT,
        || memcacheds.get_scale("cache"),
        |s| s.status.as_ref().is_some_and(|s| s.replicas == 3),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nhost log:\n{}", host.logs()));
    assert_eq!(reported.spec.and_then(|s| s.replicas), Some(3));
}
