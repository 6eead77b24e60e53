//! Modules pulled from registries, kept in the host's cache directory by their manifest's
//! digest: a host that restarts loads a pinned plugin without pulling it again, even while the
//! registry is down, and a large module is downloaded once per pod, not once per start.
//!
//! An entry is `<dir>/modules/sha256/<manifest hex>.wasm`, the module (or a script plugin's
//! script), and the same name with `.json` appended: the layer's digest, size and media type,
//! the fingerprints of the keys whose signatures of that manifest were verified, and who the
//! registry let pull it ([`access`]: the registry and repository, and which login, or none).
//!
//! A digest names one manifest wherever it is stored, and a signature of it stays valid, so an
//! entry serves a reference pinned to that digest when the policy trusts one of those keys
//! (if it asks for a signature) and the reference's registry, repository and login are among
//! those that pulled it. Otherwise the host asks the registry again: a module another
//! ConfigMap's Secret pulled is not run for a ConfigMap without it, and a key removed from the
//! policy is not trusted from the cache. The module is checked against the layer's digest
//! every time it is read, and both files are written whole ([`crate::disk`]). Entries are
//! bounded like compiled artifacts: the least recently used go first past
//! [`crate::config::MODULE_CACHE_MIB`].
//!
//! Any problem here is logged and means a pull, never a failed load.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Credentials, Digest, Requirement};
use crate::disk;

/// What is kept beside a module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The module layer's digest.
    pub layer: String,
    /// Its size.
    pub size: u64,
    /// Its media type: a module's, or a script's naming its language.
    pub media_type: String,
    /// Fingerprints of the keys a signature of the manifest was verified with.
    #[serde(default)]
    pub verified_by: Vec<String>,
    /// Who the registry let pull it ([`access`]).
    #[serde(default)]
    pub pulled_by: Vec<String>,
}

impl Entry {
    /// An entry for the layer `layer` (of `media_type` and `size`), pulled as `access`, its
    /// manifest's signature verified by `verified_by` if given.
    pub fn new(
        layer: &Digest,
        media_type: &str,
        size: u64,
        access: String,
        verified_by: Option<String>,
    ) -> Entry {
        Entry {
            layer: layer.to_string(),
            size,
            media_type: media_type.to_string(),
            verified_by: verified_by.into_iter().collect(),
            pulled_by: vec![access],
        }
    }

    /// Whether the policy's requirement is met by what was verified when it was pulled, and
    /// the registry let `access` (when given) pull it.
    fn serves(&self, requirement: &Requirement, access: Option<&str>) -> bool {
        let verified = match requirement {
            Requirement::None => true,
            Requirement::Signed(keys) => keys
                .iter()
                .any(|k| self.verified_by.contains(&k.fingerprint())),
            Requirement::Refused => false,
        };
        verified && access.is_none_or(|a| self.pulled_by.iter().any(|p| p == a))
    }

    /// This entry with what `other` adds (the same layer's), or `None` when it adds nothing.
    fn merged(&self, other: &Entry) -> Option<Entry> {
        let mut merged = self.clone();
        for (mine, theirs) in [
            (&mut merged.verified_by, &other.verified_by),
            (&mut merged.pulled_by, &other.pulled_by),
        ] {
            for item in theirs {
                if !mine.contains(item) {
                    mine.push(item.clone());
                }
            }
        }
        (merged != *self).then_some(merged)
    }
}

/// Who pulls `repository` of `registry`: `anonymous`, or a digest of the credentials, so that
/// a module pulled with one Secret's login is not handed to a ConfigMap that names another
/// Secret, or none (as kubelet checks a pull Secret before it runs a cached private image).
pub fn access(registry: &str, repository: &str, credentials: Option<&Credentials>) -> String {
    let who = match credentials {
        None => "anonymous".to_string(),
        Some(c) => {
            let digest =
                Digest::of(format!("wasmop pull\0{}\0{}", c.username, c.password).as_bytes());
            format!("login {}", &digest.hex()[..16])
        }
    };
    format!("{registry}/{repository} {who}")
}

/// The disk cache of pulled modules; without a directory it keeps nothing.
#[derive(Debug, Clone, Default)]
pub struct ModuleCache {
    /// `<cache>/modules/sha256`, or `None`.
    dir: Option<PathBuf>,
    max_bytes: u64,
}

impl ModuleCache {
    /// A cache under `root` (the host's cache directory) of at most `max_bytes` of modules.
    pub fn new(root: Option<&Path>, max_bytes: u64) -> ModuleCache {
        ModuleCache {
            dir: root.map(|r| r.join("modules").join("sha256")),
            max_bytes,
        }
    }

    fn paths(&self, manifest: &Digest) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        let module = dir.join(format!("{}.wasm", manifest.hex()));
        let mut entry = module.clone().into_os_string();
        entry.push(".json");
        Some((module, entry.into()))
    }

    /// The entry for `manifest`, if there is one that `requirement` accepts and that `access`
    /// (when given) pulled.
    pub fn entry(
        &self,
        manifest: &Digest,
        requirement: &Requirement,
        access: Option<&str>,
    ) -> Option<Entry> {
        let (module, entry) = self.paths(manifest)?;
        let entry: Entry = serde_json::from_slice(&std::fs::read(entry).ok()?).ok()?;
        (module.exists() && entry.serves(requirement, access)).then_some(entry)
    }

    /// The module of `manifest` as `entry` describes it; `None` (and the entry removed) when
    /// it is missing or is not what the entry says.
    pub fn read(&self, manifest: &Digest, entry: &Entry) -> Option<Vec<u8>> {
        let (path, beside) = self.paths(manifest)?;
        // Not read at all when its size is not the entry's.
        let bytes = std::fs::metadata(&path)
            .ok()
            .filter(|m| m.len() == entry.size)
            .and_then(|_| std::fs::read(&path).ok());
        let bytes = bytes.filter(|b| Digest::of(b).as_str() == entry.layer);
        let Some(bytes) = bytes else {
            tracing::warn!(path = %path.display(), "a cached module is not the layer its entry names; pulling it again");
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&beside);
            return None;
        };
        disk::touch(&path);
        Some(bytes)
    }

    /// Adds to the entry of `manifest` what `update` says besides (keys, who pulled it).
    pub fn record(&self, manifest: &Digest, update: &Entry) {
        let Some((path, beside)) = self.paths(manifest) else {
            return;
        };
        let Some(old) = self.entry(manifest, &Requirement::None, None) else {
            return;
        };
        if old.layer != update.layer || old.media_type != update.media_type {
            return;
        }
        if let Some(merged) = old.merged(update)
            && let Err(e) = serde_json::to_vec(&merged)
                .map_err(std::io::Error::other)
                .and_then(|json| disk::write_atomic(&beside, &json))
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot update a pulled module's entry");
        }
    }

    /// Keeps `module`, of `manifest`, as `entry` describes it (with what an entry kept
    /// before for the same layer said).
    pub fn store(&self, manifest: &Digest, module: &[u8], entry: Entry) {
        let Some((path, beside)) = self.paths(manifest) else {
            return;
        };
        let entry = match self.entry(manifest, &Requirement::None, None) {
            Some(old) if old.layer == entry.layer && old.media_type == entry.media_type => {
                old.merged(&entry).unwrap_or(old)
            }
            _ => entry,
        };
        let written = (|| {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
            // The module first: an entry never names a module that is not there yet.
            disk::write_atomic(&path, module)?;
            let json = serde_json::to_vec(&entry).map_err(std::io::Error::other)?;
            disk::write_atomic(&beside, &json)
        })();
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep the pulled module");
            return;
        }
        if let Some(root) = path.parent().and_then(Path::parent) {
            let removed = disk::evict(root, self.max_bytes, &path, "wasm", Some(".json"));
            if removed > 0 {
                tracing::info!(
                    removed,
                    limit = self.max_bytes,
                    "evicted least recently used pulled modules"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::SigningKey;
    use super::*;

    const WASM: &str = "application/wasm";
    const ANYONE: &str = "registry.example/team/memcached anonymous";

    fn cache(name: &str, max_bytes: u64) -> (ModuleCache, PathBuf) {
        let root =
            std::env::temp_dir().join(format!("wasmop-module-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        (ModuleCache::new(Some(&root), max_bytes), root)
    }

    fn entry(module: &[u8], access: &str, key: Option<String>) -> Entry {
        Entry::new(
            &Digest::of(module),
            WASM,
            module.len() as u64,
            access.into(),
            key,
        )
    }

    #[test]
    fn a_module_is_kept_by_its_manifest_and_checked_when_read() {
        let (cache, root) = cache("read", 1 << 20);
        let manifest = Digest::of(b"a manifest");
        let module = b"\0asm a module".to_vec();
        assert!(cache.entry(&manifest, &Requirement::None, None).is_none());
        cache.store(&manifest, &module, entry(&module, ANYONE, None));
        let kept = cache
            .entry(&manifest, &Requirement::None, Some(ANYONE))
            .expect("kept");
        assert_eq!(kept.layer, Digest::of(&module).to_string());
        assert_eq!(cache.read(&manifest, &kept), Some(module.clone()));

        // Changed on disk: refused, and the entry goes.
        let (path, _) = cache.paths(&manifest).unwrap();
        std::fs::write(&path, b"\0asm another!").unwrap();
        assert_eq!(cache.read(&manifest, &kept), None);
        assert!(cache.entry(&manifest, &Requirement::None, None).is_none());

        // Without a directory nothing is kept.
        let none = ModuleCache::new(None, 1 << 20);
        none.store(&manifest, &module, entry(&module, ANYONE, None));
        assert!(none.entry(&manifest, &Requirement::None, None).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_entry_serves_only_who_pulled_it_and_keys_that_verified_it() {
        let (cache, root) = cache("keys", 1 << 20);
        let (team, _) = SigningKey::generate();
        let (other, _) = SigningKey::generate();
        let (team, other) = (team.public_key(), other.public_key());
        let manifest = Digest::of(b"a signed manifest");
        let module = b"\0asm signed".to_vec();
        let login = |password: &str| Credentials {
            username: "team".into(),
            password: password.into(),
        };
        let pulled = access("registry.example", "team/memcached", Some(&login("s3cret")));
        assert_ne!(
            pulled,
            access("registry.example", "team/memcached", Some(&login("other")))
        );
        assert_eq!(access("registry.example", "team/memcached", None), ANYONE);
        assert!(!pulled.contains("s3cret"));

        cache.store(&manifest, &module, entry(&module, &pulled, None));
        let by_team = [team.clone()];
        let signed = Requirement::Signed(&by_team);
        assert!(
            cache.entry(&manifest, &signed, Some(&pulled)).is_none(),
            "pulled with no signature checked"
        );
        assert!(
            cache
                .entry(&manifest, &Requirement::None, Some(ANYONE))
                .is_none(),
            "pulled with a login: not for a ConfigMap without one"
        );
        cache.record(
            &manifest,
            &entry(&module, &pulled, Some(team.fingerprint())),
        );
        assert!(cache.entry(&manifest, &signed, Some(&pulled)).is_some());
        let by_other = [other.clone()];
        assert!(
            cache
                .entry(&manifest, &Requirement::Signed(&by_other), Some(&pulled))
                .is_none(),
            "another key's rule pulls and verifies again"
        );
        cache.store(
            &manifest,
            &module,
            entry(&module, ANYONE, Some(other.fingerprint())),
        );
        let kept = cache.entry(&manifest, &signed, Some(ANYONE)).unwrap();
        assert_eq!(kept.verified_by, [team.fingerprint(), other.fingerprint()]);
        assert_eq!(kept.pulled_by, [pulled, ANYONE.to_string()]);
        assert!(
            cache
                .entry(&manifest, &Requirement::Refused, None)
                .is_none()
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn modules_past_the_bound_go_least_recently_used_first() {
        let (cache, root) = cache("evict", 250);
        let put = |name: &[u8]| {
            let manifest = Digest::of(name);
            let module = vec![name[0]; 100];
            cache.store(&manifest, &module, entry(&module, ANYONE, None));
            manifest
        };
        let first = put(b"1");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = put(b"2");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let third = put(b"3");
        assert!(
            cache.entry(&first, &Requirement::None, None).is_none(),
            "evicted"
        );
        let (path, beside) = cache.paths(&first).unwrap();
        assert!(!path.exists() && !beside.exists());
        assert!(cache.entry(&second, &Requirement::None, None).is_some());
        assert!(cache.entry(&third, &Requirement::None, None).is_some());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
