//! The parent kinds: `cache.example.com/v1alpha1 Memcached` for the single-operator runs, and
//! `bench.wasmop.io/v1alpha1 Memcached000..` for the many-operators runs, each with a CRD made
//! from `deploy/crds/memcached.yaml`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ApiResource;
use kube::core::GroupVersionKind;

/// A namespaced Memcached-shaped kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind, UpperCamelCase.
    pub kind: String,
    /// Resource name.
    pub plural: String,
}

impl Kind {
    /// The kind of `deploy/crds/memcached.yaml`, which the memcached plugin reconciles.
    pub fn memcached() -> Kind {
        Kind {
            group: "cache.example.com".into(),
            version: "v1alpha1".into(),
            kind: "Memcached".into(),
            plural: "memcacheds".into(),
        }
    }

    /// `bench.wasmop.io/v1alpha1 Memcached<i>`, `i` in three digits (at most 1000 kinds), so
    /// that every kind's flag has the same length (the bench plugin is built once and its kind
    /// patched in: see `artifacts`).
    pub fn bench(i: usize) -> Kind {
        assert!(i < 1000, "at most 1000 bench kinds");
        Kind {
            group: "bench.wasmop.io".into(),
            version: "v1alpha1".into(),
            kind: format!("Memcached{i:03}"),
            plural: format!("memcached{i:03}s"),
        }
    }

    /// `group/version/Kind`, the form every contestant's `--kind` takes.
    pub fn flag(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.kind)
    }

    /// The name the bench plugin takes for this kind (see `tests/bench/plugin`).
    pub fn plugin_name(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// For dynamic clients.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&self.group, &self.version, &self.kind),
            &self.plural,
        )
    }

    /// `template` (the Memcached CRD) renamed to this kind.
    pub fn crd(&self, template: &CustomResourceDefinition) -> CustomResourceDefinition {
        let mut crd = template.clone();
        crd.metadata.name = Some(format!("{}.{}", self.plural, self.group));
        crd.spec.group = self.group.clone();
        let names = &mut crd.spec.names;
        names.kind = self.kind.clone();
        names.list_kind = Some(format!("{}List", self.kind));
        names.plural = self.plural.clone();
        names.singular = Some(self.kind.to_ascii_lowercase());
        crd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_kinds_are_distinct_and_valid_names() {
        let k = Kind::bench(3);
        assert_eq!(k.flag(), "bench.wasmop.io/v1alpha1/Memcached003");
        assert_eq!(k.plugin_name(), "memcached003");
        assert_eq!(k.plural, "memcached003s");
        assert_eq!(Kind::bench(999).flag().len(), k.flag().len());
        assert_eq!(Kind::memcached().api_resource().plural, "memcacheds");
    }
}
