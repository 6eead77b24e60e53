//! The host's replicas share compiled plugins through the cluster: a new pod takes what another
//! compiled instead of spending most of a CPU second per plugin compiling it again.
//!
//! - **The key**: the Secret [`KEY_SECRET`] in the host's namespace, 32 random bytes, made by
//!   the first replica that finds none (a create that loses the race reads the winner's). Only
//!   the host's ServiceAccount is granted it; whoever can read it can make the host run native
//!   code (`docs/security.md`).
//! - **An artifact**: an immutable ConfigMap `wasmop-artifact-<engine>-<module>` (the first 16
//!   hex digits of each) in the same namespace, labelled [`ARTIFACT_LABEL`], holding the
//!   compiled component gzipped and, in annotations, the engine key, the module's digest and
//!   the MAC the sandbox checks before loading it (`sandbox::shared`). It is owned by the
//!   plugin revisions (ControllerRevisions) of that module, so it is garbage-collected with
//!   the last of them; a module with no revision (a version that never loaded) is not shared.
//!
//! Every failure here is logged and means a compile, never a failed load.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;

use super::revision::{DIGEST_ANNOTATION, DIGEST_LABEL, short_digest};
use super::source::inflate_at_most;
use crate::sandbox::{ArtifactName, ArtifactStore, SealKey, Sealed};
use crate::text::hex;

/// The Secret holding the key artifacts are sealed with.
pub const KEY_SECRET: &str = "wasmop-artifact-key";
/// Label on every artifact ConfigMap.
pub const ARTIFACT_LABEL: &str = "wasmop.io/artifact";
/// Annotation: the MAC, hex.
pub const MAC_ANNOTATION: &str = "wasmop.io/artifact-mac";
/// Annotation: the engine key the artifact was compiled for.
pub const ENGINE_ANNOTATION: &str = "wasmop.io/artifact-engine";
/// The `binaryData` key of the gzipped artifact.
const DATA_KEY: &str = "component.cwasm.gz";
/// A ConfigMap holds at most 1 MiB; leave room for the rest of it.
const MAX_STORED: usize = 1000 << 10;
/// A stored artifact is refused past this size once inflated (a gzip bomb guard).
const MAX_INFLATED: u64 = 256 << 20;
/// How long a publication waits for the revision that will own the artifact: the registry
/// records it right after the load.
const OWNER_WAIT: Duration = Duration::from_secs(60);
/// How long a failed key lookup is trusted before asking again.
const KEY_RETRY: Duration = Duration::from_secs(30);

/// Compiled artifacts in ConfigMaps of the host's namespace.
pub struct ClusterArtifacts {
    client: Client,
    namespace: String,
    key: Mutex<KeyState>,
}

#[derive(Default)]
enum KeyState {
    #[default]
    Unknown,
    Known(SealKey),
    Failed(tokio::time::Instant),
}

impl ClusterArtifacts {
    /// A store in `namespace`, read and written through `client`.
    pub fn new(client: Client, namespace: &str) -> Self {
        ClusterArtifacts {
            client,
            namespace: namespace.to_owned(),
            key: Mutex::new(KeyState::Unknown),
        }
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Reads the key, making it first if nobody has.
    async fn read_or_make_key(&self) -> Result<SealKey, String> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let read = |s: Secret| -> Result<SealKey, String> {
            let bytes = s
                .data
                .and_then(|mut d| d.remove("key"))
                .ok_or_else(|| format!("Secret {KEY_SECRET} has no data key `key`"))?;
            SealKey::new(bytes.0).map_err(|e| format!("Secret {KEY_SECRET}: {e}"))
        };
        let error = |e: kube::Error| crate::text::api_error(&e);
        if let Some(secret) = api.get_opt(KEY_SECRET).await.map_err(error)? {
            return read(secret);
        }
        let mut key = vec![0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("no randomness for a key: {e}"))?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(KEY_SECRET.into()),
                labels: Some(BTreeMap::from([(ARTIFACT_LABEL.into(), String::new())])),
                ..Default::default()
            },
            immutable: Some(true),
            data: Some(BTreeMap::from([("key".into(), ByteString(key))])),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(created) => {
                tracing::info!(
                    secret = KEY_SECRET,
                    "made the key that seals shared compiled plugins"
                );
                read(created)
            }
            // Another replica made it first.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                read(api.get(KEY_SECRET).await.map_err(error)?)
            }
            Err(e) => Err(error(e)),
        }
    }

    /// The revisions of the module `digest` (`sha256:<hex>`), as owner references.
    async fn owners(&self, digest: &str) -> Result<Vec<OwnerReference>, kube::Error> {
        let api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &self.namespace);
        let selector = format!("{DIGEST_LABEL}={}", short_digest(digest));
        let revisions = api.list(&ListParams::default().labels(&selector)).await?;
        Ok(revisions
            .items
            .iter()
            .filter(|r| r.annotations().get(DIGEST_ANNOTATION).map(String::as_str) == Some(digest))
            .map(|r| OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ControllerRevision".into(),
                name: r.name_any(),
                uid: r.uid().unwrap_or_default(),
                ..Default::default()
            })
            .collect())
    }
}

/// The ConfigMap an artifact is stored in.
pub fn configmap_name(name: &ArtifactName) -> String {
    let cut = |s: &str| s.chars().take(16).collect::<String>();
    format!(
        "wasmop-artifact-{}-{}",
        cut(&name.engine),
        cut(&name.digest)
    )
}

impl ArtifactStore for ClusterArtifacts {
    fn key(&self) -> BoxFuture<'_, Option<SealKey>> {
        Box::pin(async move {
            let mut state = self.key.lock().await;
            match &*state {
                KeyState::Known(key) => return Some(key.clone()),
                KeyState::Failed(at) if at.elapsed() < KEY_RETRY => return None,
                _ => {}
            }
            match self.read_or_make_key().await {
                Ok(key) => {
                    *state = KeyState::Known(key.clone());
                    Some(key)
                }
                Err(error) => {
                    tracing::warn!(%error, secret = KEY_SECRET, "compiled plugins are not shared between replicas");
                    *state = KeyState::Failed(tokio::time::Instant::now());
                    None
                }
            }
        })
    }

    fn fetch<'a>(&'a self, name: &'a ArtifactName) -> BoxFuture<'a, Option<Sealed>> {
        Box::pin(async move {
            let cm = match self.configmaps().get_opt(&configmap_name(name)).await {
                Ok(cm) => cm?,
                Err(e) => {
                    tracing::warn!(error = %crate::text::api_error(&e), "cannot read shared compiled plugins");
                    return None;
                }
            };
            match unpack(&cm, name) {
                Ok(sealed) => Some(sealed),
                Err(error) => {
                    tracing::warn!(configmap = %cm.name_any(), %error, "shared compiled plugin ignored");
                    None
                }
            }
        })
    }

    fn publish(&self, name: ArtifactName, sealed: Sealed) -> BoxFuture<'static, ()> {
        let this = ClusterArtifacts::new(self.client.clone(), &self.namespace);
        Box::pin(async move {
            let configmap = configmap_name(&name);
            let digest = format!("sha256:{}", name.digest);
            let deadline = tokio::time::Instant::now() + OWNER_WAIT;
            let owners = loop {
                match this.owners(&digest).await {
                    Ok(o) if !o.is_empty() => break o,
                    Ok(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_secs(2)).await
                    }
                    Ok(_) => {
                        tracing::debug!(%configmap, "no revision of this module; its compiled form is not shared");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(%configmap, error = %crate::text::api_error(&e), "cannot share a compiled plugin");
                        return;
                    }
                }
            };
            let cm = match pack(&name, &sealed, &configmap, owners) {
                Ok(cm) => cm,
                Err(error) => {
                    tracing::info!(%configmap, %error, "compiled plugin not shared");
                    return;
                }
            };
            match this.configmaps().create(&PostParams::default(), &cm).await {
                Ok(_) => {
                    tracing::info!(%configmap, "shared the compiled plugin with other replicas")
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(%configmap, error = %crate::text::api_error(&e), "cannot share a compiled plugin")
                }
            }
        })
    }
}

fn pack(
    name: &ArtifactName,
    sealed: &Sealed,
    configmap: &str,
    owners: Vec<OwnerReference>,
) -> Result<ConfigMap, String> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&sealed.artifact)
        .and_then(|()| gz.finish())
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            if bytes.len() > MAX_STORED {
                return Err(format!(
                    "{} KiB gzipped, more than a ConfigMap holds",
                    bytes.len() >> 10
                ));
            }
            Ok(ConfigMap {
                metadata: ObjectMeta {
                    name: Some(configmap.to_owned()),
                    labels: Some(BTreeMap::from([(ARTIFACT_LABEL.into(), String::new())])),
                    annotations: Some(BTreeMap::from([
                        (MAC_ANNOTATION.into(), hex(&sealed.mac)),
                        (ENGINE_ANNOTATION.into(), name.engine.clone()),
                        (DIGEST_ANNOTATION.into(), format!("sha256:{}", name.digest)),
                    ])),
                    owner_references: Some(owners),
                    ..Default::default()
                },
                immutable: Some(true),
                binary_data: Some(BTreeMap::from([(DATA_KEY.into(), ByteString(bytes))])),
                ..Default::default()
            })
        })
}

fn unpack(cm: &ConfigMap, name: &ArtifactName) -> Result<Sealed, String> {
    let annotation = |key: &str| {
        cm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .ok_or_else(|| format!("no annotation {key}"))
    };
    // The MAC covers both; these only give a clearer message than a failed MAC.
    if annotation(ENGINE_ANNOTATION)? != &name.engine {
        return Err("compiled for another engine".into());
    }
    if annotation(DIGEST_ANNOTATION)? != &format!("sha256:{}", name.digest) {
        return Err("compiled from another module".into());
    }
    let mac = unhex(annotation(MAC_ANNOTATION)?).ok_or("the MAC is not hex")?;
    let gz = cm
        .binary_data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or_else(|| format!("no binaryData key {DATA_KEY}"))?;
    let artifact = inflate_at_most(&gz.0, MAX_INFLATED)?;
    Ok(Sealed { artifact, mac })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ArtifactName {
        ArtifactName {
            engine: "0123456789abcdef0123".into(),
            digest: "fedcba9876543210fedc".into(),
        }
    }

    #[test]
    fn an_artifact_round_trips_through_its_configmap() {
        let key = SealKey::new(vec![1; 32]).unwrap();
        let sealed = key.seal(&name(), vec![42; 10_000]);
        let cm = pack(&name(), &sealed, &configmap_name(&name()), Vec::new()).unwrap();
        assert_eq!(
            cm.metadata.name.as_deref(),
            Some("wasmop-artifact-0123456789abcdef-fedcba9876543210")
        );
        assert_eq!(cm.immutable, Some(true));
        assert_eq!(unpack(&cm, &name()).unwrap(), sealed);
    }

    #[test]
    fn a_planted_artifact_says_what_is_wrong() {
        let key = SealKey::new(vec![1; 32]).unwrap();
        let sealed = key.seal(&name(), vec![42; 100]);
        let cm = pack(&name(), &sealed, "x", Vec::new()).unwrap();
        let other = ArtifactName {
            digest: "00".into(),
            ..name()
        };
        assert_eq!(
            unpack(&cm, &other).unwrap_err(),
            "compiled from another module"
        );
        let mut bad_mac = cm;
        bad_mac
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(MAC_ANNOTATION.into(), "zz".into());
        assert_eq!(unpack(&bad_mac, &name()).unwrap_err(), "the MAC is not hex");
        assert_eq!(unhex("0aff"), Some(vec![10, 255]));
        assert_eq!(unhex("0af"), None);
    }
}
