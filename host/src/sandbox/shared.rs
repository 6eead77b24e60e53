//! Compiled artifacts shared between the host's replicas, so a new pod (failover, rollout,
//! scale-up) loads a plugin in milliseconds instead of compiling it again.
//!
//! A compiled artifact is native code, and wasmtime does not check it: loading one is running
//! it in the host. So the sandbox loads a shared artifact only when a MAC under a key that only
//! the host's replicas hold ([`SealKey`]) vouches for it: HMAC-SHA256 over the engine's
//! compatibility key, the module's digest and the artifact's SHA-256. Whoever can write where
//! artifacts are stored (for the cluster store, ConfigMaps in the host's namespace) but cannot
//! read the key can at worst make the host compile again; an artifact moved to another module
//! or engine fails its MAC. Where the artifacts and the key live is the [`ArtifactStore`]'s
//! business (`plugin::artifacts` keeps them in the cluster); the check stays here, beside the
//! one `unsafe` load.

use std::io::Read;
use std::path::PathBuf;

use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The MAC's domain, so no other use of the key yields a valid artifact MAC.
const DOMAIN: &[u8] = b"wasmop compiled artifact v1";

/// Which artifact: the engine it was compiled for and the module it was compiled from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactName {
    /// A stable hash of the engine's compatibility (wasmtime version, target, CPU flags,
    /// tunables), hex.
    pub engine: String,
    /// The module's SHA-256, hex; for a script, its interpreter's.
    pub digest: String,
    /// The SHA-256, hex, that the plugin's revisions record: the module's, or the script's.
    /// Not under the MAC: it says only who owns the stored artifact.
    pub source: String,
}

/// A compiled artifact's bytes: in memory, or in the file of the disk cache that holds them
/// (the Starlark interpreter compiles to 16 MB, which need not be read into memory to be shared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Artifact {
    /// The bytes.
    Bytes(Vec<u8>),
    /// A file holding them, never written in place.
    File(PathBuf),
}

impl Artifact {
    /// The bytes, as a stream.
    pub fn reader(&self) -> std::io::Result<Box<dyn Read + '_>> {
        Ok(match self {
            Artifact::Bytes(bytes) => Box::new(bytes.as_slice()),
            Artifact::File(path) => Box::new(std::fs::File::open(path)?),
        })
    }

    /// The bytes, read from the file if they are there.
    pub fn into_bytes(self) -> std::io::Result<Vec<u8>> {
        match self {
            Artifact::Bytes(bytes) => Ok(bytes),
            Artifact::File(path) => std::fs::read(path),
        }
    }
}

impl From<Vec<u8>> for Artifact {
    fn from(bytes: Vec<u8>) -> Self {
        Artifact::Bytes(bytes)
    }
}

/// An artifact and the MAC that vouches for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// What `Component::serialize` produced.
    pub artifact: Artifact,
    /// HMAC-SHA256 over the name and the artifact's SHA-256.
    pub mac: Vec<u8>,
}

/// The key artifacts are sealed with: 32 bytes or more that only the host's replicas can read.
#[derive(Clone)]
pub struct SealKey(Vec<u8>);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// A key too short to be one.
#[derive(Debug, thiserror::Error)]
#[error("an artifact key needs at least 32 bytes, this one has {0}")]
pub struct ShortKey(usize);

impl SealKey {
    /// A key from its bytes.
    pub fn new(bytes: Vec<u8>) -> Result<SealKey, ShortKey> {
        if bytes.len() < 32 {
            return Err(ShortKey(bytes.len()));
        }
        Ok(SealKey(bytes))
    }

    fn mac(&self, name: &ArtifactName, artifact_sha256: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any size");
        for part in [DOMAIN, name.engine.as_bytes(), name.digest.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(artifact_sha256);
        mac
    }

    /// Seals an artifact this host compiled; fails only when its file cannot be read.
    pub fn seal(
        &self,
        name: &ArtifactName,
        artifact: impl Into<Artifact>,
    ) -> std::io::Result<Sealed> {
        let artifact = artifact.into();
        let mut hasher = Sha256::new();
        std::io::copy(&mut artifact.reader()?, &mut hasher)?;
        let mac = self.mac(name, &hasher.finalize());
        Ok(Sealed {
            artifact,
            mac: mac.finalize().into_bytes().to_vec(),
        })
    }

    /// The artifact, if its MAC is right for `name` (compared in constant time).
    pub fn open(&self, name: &ArtifactName, sealed: Sealed) -> Option<Vouched> {
        let bytes = sealed.artifact.into_bytes().ok()?;
        self.mac(name, &Sha256::digest(&bytes))
            .verify_slice(&sealed.mac)
            .ok()
            .map(|()| Vouched(bytes))
    }
}

/// An artifact whose MAC [`SealKey::open`] checked: the only way to get one, so whatever
/// deserialises it knows it was checked.
#[derive(Debug)]
pub struct Vouched(Vec<u8>);

impl Vouched {
    /// The artifact's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Where replicas share compiled artifacts. Every method is best effort: a store that cannot
/// answer makes the host compile, never fail.
pub trait ArtifactStore: Send + Sync {
    /// The key artifacts are sealed with, or `None` when sharing is unavailable now (the store
    /// says why in its log).
    fn key(&self) -> BoxFuture<'_, Option<SealKey>>;
    /// The sealed artifact stored under `name`, if any.
    fn fetch<'a>(&'a self, name: &'a ArtifactName) -> BoxFuture<'a, Option<Sealed>>;
    /// Stores a sealed artifact for the other replicas.
    fn publish(&self, name: ArtifactName, sealed: Sealed) -> BoxFuture<'static, ()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(digest: &str) -> ArtifactName {
        ArtifactName {
            engine: "e1".into(),
            digest: digest.into(),
            source: digest.into(),
        }
    }

    #[test]
    fn only_the_key_and_the_name_it_was_sealed_for_open_an_artifact() {
        let key = SealKey::new(vec![7; 32]).unwrap();
        let sealed = key.seal(&name("aa"), b"native code".to_vec()).unwrap();
        assert_eq!(
            key.open(&name("aa"), sealed.clone()).unwrap().bytes(),
            b"native code"
        );
        // Another module's name, another engine, another key, a changed byte: refused.
        assert!(key.open(&name("ab"), sealed.clone()).is_none());
        let other_engine = ArtifactName {
            engine: "e2".into(),
            ..name("aa")
        };
        assert!(key.open(&other_engine, sealed.clone()).is_none());
        assert!(
            SealKey::new(vec![8; 32])
                .unwrap()
                .open(&name("aa"), sealed.clone())
                .is_none()
        );
        let mut tampered = sealed.clone();
        if let Artifact::Bytes(bytes) = &mut tampered.artifact {
            bytes[0] ^= 1;
        }
        assert!(key.open(&name("aa"), tampered).is_none());
        let mut no_mac = sealed.clone();
        no_mac.mac.clear();
        assert!(key.open(&name("aa"), no_mac).is_none());
        // Lengths are framed: moving a byte between engine and digest changes the MAC.
        let moved = ArtifactName {
            engine: "e1a".into(),
            digest: "a".into(),
            source: "a".into(),
        };
        assert!(
            key.open(&moved, key.seal(&name("aa"), vec![1]).unwrap())
                .is_none()
        );
        // Sealed from the file it lies in, as the interpreter is: the same MAC.
        let file = std::env::temp_dir().join(format!("wasmop-seal-{}", std::process::id()));
        std::fs::write(&file, b"native code").unwrap();
        let from_file = key.seal(&name("aa"), Artifact::File(file.clone())).unwrap();
        assert_eq!(from_file.mac, sealed.mac);
        assert_eq!(
            key.open(&name("aa"), from_file).unwrap().bytes(),
            b"native code"
        );
        std::fs::remove_file(file).unwrap();
    }

    #[test]
    fn a_short_key_is_refused() {
        assert_eq!(
            SealKey::new(vec![0; 16]).unwrap_err().to_string(),
            "an artifact key needs at least 32 bytes, this one has 16"
        );
    }
}
