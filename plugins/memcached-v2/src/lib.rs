//! The Memcached plugin, second build: everything the first build does, plus a headless Service
//! per `Memcached` so clients can find each memcached pod by DNS.
//!
//! The manifest keeps the name `memcached` and bumps the version, so loading this module
//! replaces the first build in a running host (hot swap) instead of adding a second plugin.
//! Build with `cargo build --release --target wasm32-wasip2 -p memcached-v2`
//! (`memcached_v2.wasm`).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use memcached_core::{self as memcached, Memcached, MemcachedPlugin};
use wasmop_guest::{Error, Manifest, Plugin, RelatedSelector, Request, Response};

/// The Memcached plugin with a headless Service.
pub struct MemcachedV2;

impl Plugin for MemcachedV2 {
    type Parent = Memcached;

    fn manifest() -> Manifest {
        MemcachedPlugin::manifest()
            .version(env!("CARGO_PKG_VERSION"))
            .child::<Service>()
    }

    fn related(parent: &Memcached) -> Result<Vec<RelatedSelector>, Error> {
        MemcachedPlugin::related(parent)
    }

    fn reconcile(req: &Request<Memcached>) -> Result<Response, Error> {
        let mut response = MemcachedPlugin::reconcile(req)?;
        let name = req.name();
        if !req.has_child::<Service>(name) {
            response = response.normal("Created", format!("Created headless Service {name}"));
        }
        Ok(response.child(headless_service(&req.parent().metadata)))
    }
}

wasmop_guest::export!(MemcachedV2);

/// A headless Service (`clusterIP: None`) named after the parent, selecting its memcached pods
/// on port 11211.
pub fn headless_service(parent: &ObjectMeta) -> Service {
    let name = parent.name.as_deref().unwrap_or_default();
    let labels = memcached::labels(name).into_iter();
    let labels = labels.map(|(k, v)| (k.into(), v.into()));
    let meta = ObjectMeta {
        name: parent.name.clone(),
        namespace: parent.namespace.clone(),
        labels: Some(labels.collect()),
        ..ObjectMeta::default()
    };
    Service {
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: meta.labels.clone(),
            ports: Some(vec![ServicePort {
                name: Some("memcached".to_owned()),
                port: memcached::PORT,
                target_port: Some(IntOrString::String("memcached".to_owned())),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        metadata: meta,
        ..Service::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;
    use wasmop_guest::KindRef;
    use wasmop_guest::testing::{self, RequestBuilder};
    use wasmop_guest::wire::WireResponse;

    use super::*;

    fn parent() -> serde_json::Value {
        json!({
            "apiVersion": "cache.example.com/v1alpha1",
            "kind": "Memcached",
            "metadata": {"name": "memcached-sample", "namespace": "default", "generation": 2},
            "spec": {"size": 3},
        })
    }

    fn run(req: RequestBuilder) -> WireResponse {
        testing::reconcile::<MemcachedV2>(&req.build()).expect("reconcile succeeds")
    }

    fn kinds(resp: &WireResponse) -> Vec<&str> {
        resp.children
            .iter()
            .map(|c| c["kind"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn manifest_is_the_same_plugin_at_a_new_version() {
        let (v1, v2) = (MemcachedPlugin::manifest(), MemcachedV2::manifest());
        assert_eq!(v2.name, v1.name);
        assert_eq!(v2.version, "0.2.0");
        assert_ne!(v2.version, v1.version);
        assert_eq!(v2.parent, v1.parent);
        assert_eq!(
            v2.children,
            vec![KindRef::of::<Deployment>(), KindRef::of::<Service>()]
        );
        assert_eq!(v2.related, v1.related);
    }

    #[test]
    fn emits_the_deployment_and_a_headless_service() {
        let resp = run(RequestBuilder::new(&parent()));
        assert_eq!(kinds(&resp), ["Deployment", "Service"]);

        let svc: Service = serde_json::from_value(resp.children[1].clone()).unwrap();
        assert_eq!(resp.children[1]["apiVersion"], "v1");
        assert_eq!(svc.metadata.name.as_deref(), Some("memcached-sample"));
        assert_eq!(svc.metadata.namespace.as_deref(), Some("default"));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        let labels = memcached::labels("memcached-sample").into_iter();
        let labels = labels.map(|(k, v)| (k.into(), v.into())).collect();
        assert_eq!(spec.selector, Some(labels));
        let port = &spec.ports.unwrap()[0];
        assert_eq!(port.port, 11211);
        assert_eq!(
            port.target_port,
            Some(IntOrString::String("memcached".into()))
        );
    }

    #[test]
    fn keeps_the_first_build_behaviour() {
        let resp = run(RequestBuilder::new(&parent()));
        let d: Deployment = serde_json::from_value(resp.children[0].clone()).unwrap();
        assert_eq!(d.spec.replicas, Some(3));
        let cond = &resp.status.as_ref().unwrap()["conditions"][0];
        assert_eq!(cond["reason"], "Creating");
        let reasons: Vec<_> = resp.events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "Created Deployment memcached-sample with 3 replicas",
                "Created headless Service memcached-sample"
            ]
        );
    }

    #[test]
    fn an_existing_service_records_no_event() {
        let m: Memcached = serde_json::from_value(parent()).unwrap();
        let svc = headless_service(&m.metadata);
        let desired = memcached::deployment(m.name(), Some("default"), 3, None);
        let mut deploy: Deployment = serde_json::from_value(desired).unwrap();
        deploy.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
            available_replicas: Some(3),
            ..Default::default()
        });
        let resp = run(RequestBuilder::new(&parent()).child(&svc).child(&deploy));
        assert!(resp.events.is_empty(), "{:?}", resp.events);
        assert_eq!(kinds(&resp), ["Deployment", "Service"]);
    }

    #[test]
    fn bad_size_is_still_an_error() {
        let mut p = parent();
        p["spec"]["size"] = json!(-1);
        let err = testing::reconcile::<MemcachedV2>(&RequestBuilder::new(&p).build()).unwrap_err();
        assert_eq!(err, "spec.size must be ≥ 0, got -1");
    }
}
