//! Server-side apply of objects given as JSON, whatever their kind: RBAC printed by
//! `wasmop rbac`, for instance.

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use crate::{Error, Result};

/// Applies each of `objects` as `field_manager` (forced), resolving its kind by discovery.
pub async fn apply_objects(
    client: &Client,
    objects: Vec<Value>,
    field_manager: &str,
) -> Result<()> {
    for object in objects {
        let obj: DynamicObject =
            serde_json::from_value(object).map_err(|e| Error::NotAnObject(e.to_string()))?;
        let types = obj.types.clone().unwrap_or_default();
        let gvk = GroupVersionKind::try_from(&types)
            .map_err(|e| Error::NotAnObject(format!("{types:?}: {e}")))?;
        let what = format!(
            "{} {}/{}",
            types.kind,
            obj.metadata.namespace.as_deref().unwrap_or(""),
            obj.metadata.name.as_deref().unwrap_or("")
        );
        let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| Error::kube(format!("discovering {what}"), e))?;
        let api: Api<DynamicObject> = match obj.metadata.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&obj),
        )
        .await
        .map_err(|e| Error::kube(format!("applying {what}"), e))?;
    }
    Ok(())
}
