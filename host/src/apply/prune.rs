//! Deletes a child the plugin no longer wants.

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Preconditions};

use crate::kinds::ResolvedKind;
use crate::watch::Object;

/// Deletes `obj` in the background, only if it is still the object we saw (UID precondition):
/// a child recreated under the same name meanwhile is left alone. Already gone is success.
pub async fn delete(client: &Client, kind: &ResolvedKind, obj: &Object) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = kind.api(client, obj.namespace());
    let params = DeleteParams::background().preconditions(Preconditions {
        uid: obj.uid().map(str::to_owned),
        resource_version: None,
    });
    let name = obj.name();
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
