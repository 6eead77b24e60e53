//! Server-side apply of one child, owned by its parent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;

use crate::kinds::ResolvedKind;
use crate::watch::Object;

/// The controller owner reference the host puts on every child: garbage collection removes
/// children with their parent, and `blockOwnerDeletion` keeps a foreground delete of the parent
/// waiting for them.
pub fn owner_reference(parent: &Object, api_version: &str, kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: parent.name().to_owned(),
        uid: parent.uid().unwrap_or_default().to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Sets `owner` as the child's only owner reference (validation refused any from the plugin).
pub fn set_owner(child: &mut Value, owner: &OwnerReference) {
    child["metadata"]["ownerReferences"] =
        serde_json::json!([serde_json::to_value(owner).expect("owner reference serialises")]);
}

/// A resource version no stored object has: an apply that carries it creates the object or,
/// if one exists, fails with a conflict instead of taking it over.
const NO_OBJECT_YET: &str = "18446744073709551615";

/// Applies `child` with `field_manager`, taking over fields other managers hold. With
/// `create`, only creates it: an object of that name that appeared since the cache was read
/// gives a 409 conflict and is left as it is.
pub async fn apply(
    client: &Client,
    kind: &ResolvedKind,
    namespace: Option<&str>,
    name: &str,
    child: &Value,
    field_manager: &str,
    create: bool,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = kind.api(client, namespace);
    let params = PatchParams::apply(field_manager).force();
    if create {
        let mut child = child.clone();
        child["metadata"]["resourceVersion"] = Value::from(NO_OBJECT_YET);
        return api
            .patch(name, &params, &Patch::Apply(&child))
            .await
            .map(|_| ());
    }
    api.patch(name, &params, &Patch::Apply(child))
        .await
        .map(|_| ())
}
