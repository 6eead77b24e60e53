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
    /// The module's SHA-256, hex.
    pub digest: String,
}

/// An artifact and the MAC that vouches for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// What `Component::serialize` produced.
    pub artifact: Vec<u8>,
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

    fn mac(&self, name: &ArtifactName, artifact: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any size");
        for part in [DOMAIN, name.engine.as_bytes(), name.digest.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.update(&Sha256::digest(artifact));
        mac
    }

    /// Seals an artifact this host compiled.
    pub fn seal(&self, name: &ArtifactName, artifact: Vec<u8>) -> Sealed {
        let mac = self.mac(name, &artifact).finalize().into_bytes().to_vec();
        Sealed { artifact, mac }
    }

    /// The artifact, if its MAC is right for `name` (compared in constant time).
    pub fn open(&self, name: &ArtifactName, sealed: Sealed) -> Option<Vouched> {
        self.mac(name, &sealed.artifact)
            .verify_slice(&sealed.mac)
            .ok()
            .map(|()| Vouched(sealed.artifact))
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
        }
    }

    #[test]
    fn only_the_key_and_the_name_it_was_sealed_for_open_an_artifact() {
        let key = SealKey::new(vec![7; 32]).unwrap();
        let sealed = key.seal(&name("aa"), b"native code".to_vec());
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
        tampered.artifact[0] ^= 1;
        assert!(key.open(&name("aa"), tampered).is_none());
        let mut no_mac = sealed;
        no_mac.mac.clear();
        assert!(key.open(&name("aa"), no_mac).is_none());
        // Lengths are framed: moving a byte between engine and digest changes the MAC.
        let moved = ArtifactName {
            engine: "e1a".into(),
            digest: "a".into(),
        };
        assert!(key.open(&moved, key.seal(&name("aa"), vec![1])).is_none());
    }

    #[test]
    fn a_short_key_is_refused() {
        assert_eq!(
            SealKey::new(vec![0; 16]).unwrap_err().to_string(),
            "an artifact key needs at least 32 bytes, this one has 16"
        );
    }
}
