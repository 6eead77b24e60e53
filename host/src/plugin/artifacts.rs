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
//! - **A large artifact** (the Starlark interpreter: 5 MB gzipped) is cut into parts of at most
//!   [`MAX_STORED`] bytes: the first ConfigMap says how many in [`PARTS_ANNOTATION`], and the
//!   others are named `<first>-1`, `<first>-2`, …, owned and labelled alike. The parts are
//!   created before the first, so whoever finds the first finds them all; the MAC covers the
//!   whole, so a part swapped for another fails it. At most [`MAX_PARTS`] parts are read.
//!
//! Every failure here is logged and means a compile, never a failed load.

use std::collections::BTreeMap;
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
/// Annotation on an artifact's first ConfigMap: how many ConfigMaps hold it (absent: one).
pub const PARTS_ANNOTATION: &str = "wasmop.io/artifact-parts";
/// The `binaryData` key of the gzipped artifact (or of one part of it).
const DATA_KEY: &str = "component.cwasm.gz";
/// A ConfigMap holds at most 1 MiB; leave room for the rest of it.
const MAX_STORED: usize = 1000 << 10;
/// Parts read at most: a 24 MB gzipped artifact, past the Starlark interpreter's 5.
const MAX_PARTS: usize = 24;
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
            let api = self.configmaps();
            let read = |e: kube::Error| {
                tracing::warn!(error = %crate::text::api_error(&e), "cannot read shared compiled plugins");
            };
            let head = api
                .get_opt(&configmap_name(name))
                .await
                .map_err(read)
                .ok()??;
            let parts = match parts(&head) {
                Ok(parts) => parts,
                Err(error) => {
                    tracing::warn!(configmap = %head.name_any(), %error, "shared compiled plugin ignored");
                    return None;
                }
            };
            let mut rest = Vec::with_capacity(parts - 1);
            for i in 1..parts {
                match api.get_opt(&part_name(&head.name_any(), i)).await {
                    Ok(Some(part)) => rest.push(part),
                    Ok(None) => {
                        tracing::warn!(configmap = %head.name_any(), part = i, "a part of a shared compiled plugin is missing");
                        return None;
                    }
                    Err(e) => {
                        read(e);
                        return None;
                    }
                }
            }
            match unpack(&head, &rest, name) {
                Ok(sealed) => Some(sealed),
                Err(error) => {
                    tracing::warn!(configmap = %head.name_any(), %error, "shared compiled plugin ignored");
                    None
                }
            }
        })
    }

    fn publish(&self, name: ArtifactName, sealed: Sealed) -> BoxFuture<'static, ()> {
        let this = ClusterArtifacts::new(self.client.clone(), &self.namespace);
        Box::pin(async move {
            let configmap = configmap_name(&name);
            let source = format!("sha256:{}", name.source);
            let deadline = tokio::time::Instant::now() + OWNER_WAIT;
            let owners = loop {
                match this.owners(&source).await {
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
            // Gzipped on a blocking thread: the interpreter streams 16 MB from its file.
            let packed = tokio::task::spawn_blocking(move || pack(&name, &sealed, owners)).await;
            let packed = match packed {
                Ok(Ok(packed)) => packed,
                Ok(Err(error)) => {
                    tracing::info!(%configmap, %error, "compiled plugin not shared");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%configmap, error = %e, "packing a compiled plugin");
                    return;
                }
            };
            // The first part last: whoever finds it finds the others.
            for i in (0..packed.parts()).rev() {
                let part = packed.part(&configmap, i);
                match this
                    .configmaps()
                    .create(&PostParams::default(), &part)
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        tracing::warn!(%configmap, part = i, error = %crate::text::api_error(&e), "cannot share a compiled plugin");
                        return;
                    }
                }
            }
            tracing::info!(%configmap, parts = packed.parts(), "shared the compiled plugin with other replicas");
        })
    }
}

/// The ConfigMap of part `i` (from 1) of the artifact whose first ConfigMap is `head`.
fn part_name(head: &str, i: usize) -> String {
    format!("{head}-{i}")
}

/// How many ConfigMaps hold the artifact whose first is `head`.
fn parts(head: &ConfigMap) -> Result<usize, String> {
    let Some(value) = head
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PARTS_ANNOTATION))
    else {
        return Ok(1);
    };
    match value.parse::<usize>() {
        Ok(n @ 1..=MAX_PARTS) => Ok(n),
        _ => Err(format!(
            "{PARTS_ANNOTATION} is {value:?}, not a count from 1 to {MAX_PARTS}"
        )),
    }
}

/// An artifact gzipped, with what every ConfigMap holding a part of it carries.
struct Packed {
    gz: Vec<u8>,
    annotations: BTreeMap<String, String>,
    owners: Vec<OwnerReference>,
}

impl Packed {
    fn parts(&self) -> usize {
        self.gz.len().div_ceil(MAX_STORED).max(1)
    }

    /// The ConfigMap holding part `i`: the first (`head`) when `i` is 0.
    fn part(&self, head: &str, i: usize) -> ConfigMap {
        let mut annotations = self.annotations.clone();
        let name = if i == 0 {
            if self.parts() > 1 {
                annotations.insert(PARTS_ANNOTATION.into(), self.parts().to_string());
            }
            head.to_owned()
        } else {
            part_name(head, i)
        };
        let bytes = self
            .gz
            .chunks(MAX_STORED)
            .nth(i)
            .unwrap_or_default()
            .to_vec();
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(BTreeMap::from([(ARTIFACT_LABEL.into(), String::new())])),
                annotations: Some(annotations),
                owner_references: Some(self.owners.clone()),
                ..Default::default()
            },
            immutable: Some(true),
            binary_data: Some(BTreeMap::from([(DATA_KEY.into(), ByteString(bytes))])),
            ..Default::default()
        }
    }
}

fn pack(
    name: &ArtifactName,
    sealed: &Sealed,
    owners: Vec<OwnerReference>,
) -> Result<Packed, String> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    let gz = sealed
        .artifact
        .reader()
        .and_then(|mut artifact| std::io::copy(&mut artifact, &mut gz))
        .and_then(|_| gz.finish())
        .map_err(|e| e.to_string())?;
    if gz.len() > MAX_STORED * MAX_PARTS {
        return Err(format!(
            "{} KiB gzipped, more than {MAX_PARTS} ConfigMaps hold",
            gz.len() >> 10
        ));
    }
    Ok(Packed {
        gz,
        annotations: BTreeMap::from([
            (MAC_ANNOTATION.into(), hex(&sealed.mac)),
            (ENGINE_ANNOTATION.into(), name.engine.clone()),
            (DIGEST_ANNOTATION.into(), format!("sha256:{}", name.digest)),
        ]),
        owners,
    })
}

/// The artifact in `head` and the `rest` of its parts, in order.
fn unpack(head: &ConfigMap, rest: &[ConfigMap], name: &ArtifactName) -> Result<Sealed, String> {
    let annotation = |cm: &ConfigMap, key: &str| {
        cm.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .ok_or_else(|| format!("no annotation {key}"))
    };
    // The MAC covers both; these only give a clearer message than a failed MAC.
    if annotation(head, ENGINE_ANNOTATION)? != name.engine {
        return Err("compiled for another engine".into());
    }
    if annotation(head, DIGEST_ANNOTATION)? != format!("sha256:{}", name.digest) {
        return Err("compiled from another module".into());
    }
    let mac_hex = annotation(head, MAC_ANNOTATION)?;
    let mac = unhex(&mac_hex).ok_or("the MAC is not hex")?;
    let mut gz = Vec::new();
    for (i, cm) in std::iter::once(head).chain(rest).enumerate() {
        if i > 0 && annotation(cm, MAC_ANNOTATION)? != mac_hex {
            return Err(format!("part {i} belongs to another artifact"));
        }
        let data = cm
            .binary_data
            .as_ref()
            .and_then(|d| d.get(DATA_KEY))
            .ok_or_else(|| format!("part {i} has no binaryData key {DATA_KEY}"))?;
        gz.extend_from_slice(&data.0);
    }
    let artifact = inflate_at_most(&gz, MAX_INFLATED)?;
    Ok(Sealed {
        artifact: artifact.into(),
        mac,
    })
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
    use crate::fixtures::noise;

    fn name() -> ArtifactName {
        ArtifactName {
            engine: "0123456789abcdef0123".into(),
            digest: "fedcba9876543210fedc".into(),
            source: "fedcba9876543210fedc".into(),
        }
    }

    #[test]
    fn an_artifact_round_trips_through_its_configmap() {
        let key = SealKey::new(vec![1; 32]).unwrap();
        let sealed = key.seal(&name(), vec![42; 10_000]).unwrap();
        let packed = pack(&name(), &sealed, Vec::new()).unwrap();
        assert_eq!(packed.parts(), 1);
        let cm = packed.part(&configmap_name(&name()), 0);
        assert_eq!(
            cm.metadata.name.as_deref(),
            Some("wasmop-artifact-0123456789abcdef-fedcba9876543210")
        );
        assert_eq!(cm.immutable, Some(true));
        assert_eq!(parts(&cm), Ok(1), "one part says nothing of parts");
        assert_eq!(unpack(&cm, &[], &name()).unwrap(), sealed);
    }

    #[test]
    fn a_large_artifact_is_cut_into_parts_and_put_together() {
        let key = SealKey::new(vec![1; 32]).unwrap();
        let sealed = key.seal(&name(), noise(2_500_000)).unwrap();
        let packed = pack(&name(), &sealed, Vec::new()).unwrap();
        assert_eq!(packed.parts(), 3);
        let head = packed.part("a", 0);
        let rest: Vec<ConfigMap> = (1..3).map(|i| packed.part("a", i)).collect();
        assert_eq!(parts(&head), Ok(3));
        assert_eq!(rest[1].metadata.name.as_deref(), Some("a-2"));
        for cm in std::iter::once(&head).chain(&rest) {
            let data = &cm.binary_data.as_ref().unwrap()[DATA_KEY].0;
            assert!(data.len() <= MAX_STORED, "{}", data.len());
        }
        assert_eq!(unpack(&head, &rest, &name()).unwrap(), sealed);
        // Parts out of order: the gzip stream breaks or the MAC fails; never a silent load.
        let swapped = [rest[1].clone(), rest[0].clone()];
        if let Ok(wrong) = unpack(&head, &swapped, &name()) {
            assert!(key.open(&name(), wrong).is_none());
        }
        // A part of another artifact is named as such.
        let other = key.seal(&name(), noise(10)).unwrap();
        let stranger = pack(&name(), &other, Vec::new()).unwrap().part("b", 0);
        assert_eq!(
            unpack(&head, &[rest[0].clone(), stranger], &name()).unwrap_err(),
            "part 2 belongs to another artifact"
        );
    }

    #[test]
    fn a_planted_artifact_says_what_is_wrong() {
        let key = SealKey::new(vec![1; 32]).unwrap();
        let sealed = key.seal(&name(), vec![42; 100]).unwrap();
        let cm = pack(&name(), &sealed, Vec::new()).unwrap().part("x", 0);
        let other = ArtifactName {
            digest: "00".into(),
            ..name()
        };
        assert_eq!(
            unpack(&cm, &[], &other).unwrap_err(),
            "compiled from another module"
        );
        let mut bad_mac = cm.clone();
        bad_mac
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(MAC_ANNOTATION.into(), "zz".into());
        assert_eq!(
            unpack(&bad_mac, &[], &name()).unwrap_err(),
            "the MAC is not hex"
        );
        let mut many = cm;
        many.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(PARTS_ANNOTATION.into(), "1000".into());
        assert_eq!(
            parts(&many).unwrap_err(),
            "wasmop.io/artifact-parts is \"1000\", not a count from 1 to 24"
        );
        assert_eq!(unhex("0aff"), Some(vec![10, 255]));
        assert_eq!(unhex("0af"), None);
    }
}
