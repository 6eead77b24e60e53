//! Files the host keeps across restarts in its cache directory (compiled plugins, modules
//! pulled from registries): each written whole or not at all, and the lot bounded by dropping
//! the least recently used.
//!
//! A reader sees the old file or the whole new one, never a part: [`write_atomic`] writes to
//! a name no other writer uses ([`temp_name`]) and renames it into place. A reader that uses
//! an entry touches its modification time, which [`evict`] reads as its last use.
//!
//! ```
//! let dir = std::env::temp_dir().join(format!("wasmop-disk-doc-{}", std::process::id()));
//! let shelf = dir.join("shelf");
//! std::fs::create_dir_all(&shelf).unwrap();
//! let old = shelf.join("old.bin");
//! let new = shelf.join("new.bin");
//! wasmop::disk::write_atomic(&old, &[0; 100]).unwrap();
//! wasmop::disk::write_atomic(&new, &[0; 100]).unwrap();
//! // 150 bytes allowed: one goes, never the one just written.
//! assert_eq!(wasmop::disk::evict(&dir, 150, &new, "bin", None), 1);
//! assert!(new.exists() && !old.exists());
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// Writes `path` through a uniquely named temporary file and a rename, so readers see the old
/// file or the whole new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_name(path);
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// A name beside `path` that no other writer in any process uses.
pub fn temp_name(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    path.with_extension(format!(
        "tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Marks `path` as used now, for [`evict`].
pub fn touch(path: &Path) {
    let _ = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
}

/// Deletes the least recently used files ending in `.{extension}` under `root/*/` (and, for
/// each, the file of the same name with `companion` appended, if given) until they take at
/// most `max_bytes`, never `keep`. Returns how many went.
pub fn evict(
    root: &Path,
    max_bytes: u64,
    keep: &Path,
    extension: &str,
    companion: Option<&str>,
) -> usize {
    let mut entries: Vec<(SystemTime, u64, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|shelf| {
            std::fs::read_dir(shelf.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|f| f.path().extension().is_some_and(|e| e == extension))
        .filter_map(|f| {
            let meta = f.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), f.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
    entries.sort();
    let mut removed = 0;
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        if path == keep {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            if let Some(companion) = companion {
                let mut beside = path.into_os_string();
                beside.push(companion);
                let _ = std::fs::remove_file(beside);
            }
            total -= len;
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_drops_the_least_recently_used_first_and_never_the_new_one() {
        let root = std::env::temp_dir().join(format!("wasmop-evict-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (old_engine, engine) = (root.join("old"), root.join("new"));
        std::fs::create_dir_all(&old_engine).unwrap();
        std::fs::create_dir_all(&engine).unwrap();
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let put = |dir: &Path, name: &str, age: u64| {
            let path = dir.join(format!("{name}.cwasm"));
            std::fs::write(&path, vec![0u8; 100]).unwrap();
            std::fs::write(path.with_extension("cwasm.sha256"), b"x").unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t0 + std::time::Duration::from_secs(age))
                .unwrap();
            path
        };
        let oldest = put(&old_engine, "a", 0);
        let middle = put(&engine, "b", 10);
        let newest = put(&engine, "c", 20);
        // The one just written is the oldest by its clock: still kept.
        let just_written = put(&engine, "d", 5);
        let evict = |keep: &Path| evict(&root, 250, keep, "cwasm", Some(".sha256"));
        assert_eq!(evict(&just_written), 2);
        assert!(!oldest.exists() && !oldest.with_extension("cwasm.sha256").exists());
        assert!(!middle.exists());
        assert!(newest.exists() && just_written.exists());
        assert!(newest.with_extension("cwasm.sha256").exists());
        assert_eq!(evict(&just_written), 0, "within the limit now");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = std::env::temp_dir().join(format!("wasmop-disk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.bin");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
