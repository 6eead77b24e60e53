//! Installing a CustomResourceDefinition and waiting until the apiserver serves it.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::{Error, Result};

/// Server-side applies `crd` as `field_manager` (forced, so a rerun against an existing
/// cluster works too) and waits up to `timeout` for its `Established` condition.
pub async fn apply_crd(
    client: &Client,
    crd: &CustomResourceDefinition,
    field_manager: &str,
    timeout: Duration,
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(crd),
    )
    .await
    .map_err(|e| Error::kube(format!("applying CRD {name}"), e))?;
    crate::wait_until(
        &format!("CRD {name} to be Established"),
        timeout,
        || async { api.get(&name).await.map(|c| c.status) },
        |status| {
            status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        },
    )
    .await?;
    Ok(())
}
