//! Compiled functions, kept beside the artifact cache so that a module made of functions
//! compiled before compiles in a fraction of the time (Cranelift's incremental cache, keyed by
//! a hash of each function's code and the target).
//!
//! Modules built with the same SDK share many functions (serde, the standard library), and
//! versions of one plugin more: a function compiled once, in any module, is not compiled
//! again.
//!
//! The entries live in one file, `<dir>/functions.pack`, read whole when a compile first asks
//! and written whole, through a temporary name and a rename, when it ends with new entries
//! ([`FunctionCache::finish`]); between compiles nothing is held in memory. A file per entry
//! cost more in file system work than it saved. The file is bounded: the entries the last
//! compile used go first, then the others until the bound. A key already names the target,
//! and Cranelift checks its own version when it reads an entry, so one file serves any engine;
//! an entry that fails to decode is compiled again, and a file that is not a pack is ignored.
//! The cache can make compiling faster, never fail. As for the artifacts, the directory is the
//! host's own.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::disk::temp_name;

/// The first bytes of a pack.
const MAGIC: &[u8] = b"wasmop functions 1\n";

/// Compiled functions in one file, as wasmtime's [`wasmtime::CacheStore`].
#[derive(Debug)]
pub(crate) struct FunctionCache {
    dir: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The pack, once read; `None` between compiles.
    entries: Option<HashMap<Vec<u8>, Vec<u8>>>,
    /// Keys read or written since the last [`FunctionCache::finish`].
    used: HashSet<Vec<u8>>,
    hits: u64,
    added: u64,
}

impl FunctionCache {
    /// The cache in `<dir>/functions.pack`, bounded to `max_bytes`.
    pub(crate) fn new(dir: &Path, max_bytes: u64) -> Self {
        Self {
            dir: dir.to_owned(),
            max_bytes,
            state: Mutex::default(),
        }
    }

    /// The directory that [`FunctionCache::new`] was given, for a child compiler.
    pub(crate) fn root(&self) -> &Path {
        &self.dir
    }

    /// The bound it was given.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn path(&self) -> PathBuf {
        self.dir.join("functions.pack")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends a compile: writes the pack if it gained entries, and lets go of it. Says how many
    /// functions were found and how many added.
    pub(crate) fn finish(&self) -> (u64, u64) {
        let mut state = self.lock();
        let counts = (state.hits, state.added);
        let used = std::mem::take(&mut state.used);
        let entries = state.entries.take();
        state.hits = 0;
        state.added = 0;
        drop(state);
        if let Some(entries) = entries
            && counts.1 > 0
        {
            let bytes = encode(&entries, &used, self.max_bytes);
            let path = self.path();
            let tmp = temp_name(&path);
            let written = std::fs::create_dir_all(&self.dir)
                .and_then(|()| std::fs::write(&tmp, &bytes))
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(e) = written {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(path = %path.display(), error = %e, "cannot keep compiled functions");
            }
        }
        counts
    }

    /// The pack's entries, read on first use.
    fn entries<'s>(&self, state: &'s mut State) -> &'s mut HashMap<Vec<u8>, Vec<u8>> {
        state.entries.get_or_insert_with(|| {
            std::fs::read(self.path())
                .ok()
                .filter(|bytes| bytes.len() as u64 <= self.max_bytes.saturating_mul(2))
                .and_then(|bytes| decode(&bytes))
                .unwrap_or_default()
        })
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let mut state = self.lock();
        let value = self.entries(&mut state).get(key)?.clone();
        state.hits += 1;
        state.used.insert(key.to_vec());
        Some(Cow::Owned(value))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let mut state = self.lock();
        self.entries(&mut state).insert(key.to_vec(), value);
        state.added += 1;
        state.used.insert(key.to_vec());
        true
    }
}

/// The pack: [`MAGIC`], then `key length, key, value length, value` for each entry (lengths
/// as u32, little-endian), the `used` ones first, the rest while the whole stays under
/// `max_bytes`.
fn encode(entries: &HashMap<Vec<u8>, Vec<u8>>, used: &HashSet<Vec<u8>>, max_bytes: u64) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let first = entries.iter().filter(|(k, _)| used.contains(*k));
    let rest = entries.iter().filter(|(k, _)| !used.contains(*k));
    for (key, value) in first.chain(rest) {
        let size = 8 + key.len() + value.len();
        if (out.len() + size) as u64 > max_bytes {
            continue;
        }
        for part in [key, value] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

/// The entries of a pack; `None` when `bytes` is not one, or is cut short.
fn decode(bytes: &[u8]) -> Option<HashMap<Vec<u8>, Vec<u8>>> {
    let mut rest = bytes.strip_prefix(MAGIC)?;
    let mut take = || -> Option<Vec<u8>> {
        let (len, after) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let part = after.get(..len)?.to_vec();
        rest = &after[len..];
        Some(part)
    };
    let mut entries = HashMap::new();
    while let Some(key) = take() {
        entries.insert(key, take()?);
    }
    rest.is_empty().then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::CacheStore;

    #[test]
    fn entries_outlive_a_compile_and_the_last_ones_used_stay_within_the_bound() {
        let root = std::env::temp_dir().join(format!("wasmop-functions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let entry = MAGIC.len() as u64 + 8 + 1 + 100;
        let cache = FunctionCache::new(&root, 2 * entry);
        assert!(cache.get(b"a").is_none(), "empty");
        assert!(cache.insert(b"a", vec![1; 100]));
        assert!(cache.insert(b"b", vec![2; 100]));
        assert_eq!(cache.finish(), (0, 2));
        assert!(
            cache.lock().entries.is_none(),
            "nothing held between compiles"
        );

        // The next compile uses b and adds c: a, used last time only, is what goes.
        assert_eq!(cache.get(b"b").as_deref(), Some(&[2u8; 100][..]));
        assert!(cache.insert(b"c", vec![3; 100]));
        assert_eq!(cache.finish(), (1, 1));
        assert!(cache.get(b"a").is_none(), "past the bound");
        assert!(cache.get(b"b").is_some() && cache.get(b"c").is_some());
        assert_eq!(cache.finish(), (2, 0), "nothing new: nothing written");
        let files: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(files.len(), 1, "one file, no temporary left");

        // A pack cut short, or no pack at all, is no cache and no error.
        let bytes = std::fs::read(cache.path()).unwrap();
        assert!(decode(&bytes).is_some());
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(decode(b"something else").is_none());
        std::fs::write(cache.path(), &bytes[..bytes.len() - 1]).unwrap();
        assert!(cache.get(b"b").is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
