//! Compiled components, cached by module digest: in memory (a small bounded map) and, when a
//! directory is configured, on disk.
//!
//! Compiling a plugin takes most of a CPU second (the Memcached plugin: 0.6–0.8 s on two
//! cores); loading a cached artifact takes a few milliseconds.
//! Disk entries live under `<dir>/components/<engine>/<digest>.cwasm`, where `<engine>` is a
//! SHA-256 of wasmtime's [`Engine::precompile_compatibility_hash`] (wasmtime version, target,
//! CPU flags, tunables), so a host upgrade never reads an incompatible artifact. wasmtime does
//! not check an artifact's integrity, so each one has a `.sha256` file beside it, and both are
//! written to a temporary name first and renamed into place. Any cache problem is logged and
//! falls back to compiling: the cache can make loading faster, never fail.
//!
//! Before compiling, the caller may hand in an artifact another replica compiled, checked
//! against its MAC ([`Vouched`], see `shared.rs`); it is loaded and kept on disk like one
//! compiled here.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::compile::{self, Compiler, Compiling};
use super::shared::{Artifact, Vouched};
use crate::disk::{self, temp_name, write_atomic};
use crate::text::hex;

/// Components kept in memory; older ones are dropped first.
const MEMORY_ENTRIES: usize = 32;

/// One compile at a time. Each takes tens of MiB while it runs and wasmtime already spreads
/// one over every core, so ten plugins loading at once would only multiply the peak.
static COMPILING: Mutex<()> = Mutex::new(());

/// Where a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// This process had it.
    Memory,
    /// The disk cache had it.
    Disk,
    /// Another replica compiled it.
    Shared,
    /// Compiled now.
    Compiled,
}

impl Origin {
    /// For logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::Memory => "memory",
            Origin::Disk => "disk cache",
            Origin::Shared => "shared by another replica",
            Origin::Compiled => "compiled",
        }
    }
}

/// A component, where it came from, and (when compiled here) its serialised form to share.
pub(crate) struct Got {
    pub(crate) component: Component,
    pub(crate) origin: Origin,
    pub(crate) serialized: Option<Artifact>,
}

/// A compile's artifact, and the functions the function cache gave and gained, if there is one.
pub(crate) type Precompiled = (Vec<u8>, Option<(u64, u64)>);

/// Where compiled components come from.
pub(crate) struct ArtifactCache {
    /// [`engine_key`] of the engine.
    engine: String,
    compiling: Compiling,
    /// `<dir>/components/<engine>`, or `None` for memory only.
    dir: Option<PathBuf>,
    /// Bytes the disk cache may hold, over every engine's directory; the least recently used
    /// artifacts go first.
    max_disk_bytes: u64,
    memory: Mutex<MemoryCache>,
}

#[derive(Default)]
struct MemoryCache {
    map: HashMap<String, Component>,
    order: VecDeque<String>,
}

impl ArtifactCache {
    pub(crate) fn new(
        engine: &Engine,
        dir: Option<&Path>,
        max_disk_bytes: u64,
        compiling: Compiling,
    ) -> Self {
        let key = engine_key(engine);
        Self {
            dir: dir.map(|d| d.join("components").join(&key)),
            engine: key,
            compiling,
            max_disk_bytes,
            memory: Mutex::default(),
        }
    }

    /// The engine's compatibility key, as artifacts are named by.
    pub(crate) fn engine(&self) -> &str {
        &self.engine
    }

    /// Whether the component for `digest_hex` is here, in memory or on disk, without loading it.
    pub(crate) fn has(&self, digest_hex: &str) -> bool {
        self.lock().map.contains_key(digest_hex)
            || self
                .paths(digest_hex)
                .is_some_and(|(a, c)| a.exists() && c.exists())
    }

    /// The compiled component for `wasm`, whose SHA-256 in hex is `digest_hex`: from memory,
    /// from disk, from `shared` (an artifact another replica compiled, its MAC checked), or
    /// compiled now. The module is borrowed, never copied: it may be 64 MiB.
    pub(crate) fn get_or_compile(
        &self,
        engine: &Engine,
        digest_hex: &str,
        wasm: &[u8],
        shared: Option<Vouched>,
    ) -> wasmtime::Result<Got> {
        if let Some(component) = self.lock().map.get(digest_hex) {
            return Ok(Got {
                component: component.clone(),
                origin: Origin::Memory,
                serialized: None,
            });
        }
        let got = match self.read_disk(engine, digest_hex) {
            Some(component) => Got {
                component,
                origin: Origin::Disk,
                serialized: None,
            },
            None => match shared.and_then(|v| self.load_shared(engine, digest_hex, v)) {
                Some(component) => Got {
                    component,
                    origin: Origin::Shared,
                    serialized: None,
                },
                None => {
                    let (component, serialized) = self.compile(engine, digest_hex, wasm)?;
                    Got {
                        component,
                        origin: Origin::Compiled,
                        serialized: Some(serialized),
                    }
                }
            },
        };
        let component = &got.component;
        let mut memory = self.lock();
        if memory
            .map
            .insert(digest_hex.to_owned(), component.clone())
            .is_none()
        {
            memory.order.push_back(digest_hex.to_owned());
            while memory.order.len() > MEMORY_ENTRIES {
                if let Some(old) = memory.order.pop_front() {
                    memory.map.remove(&old);
                }
            }
        }
        Ok(got)
    }

    /// Compiles `wasm` in this process, through the function cache; with the functions the
    /// cache gave and those it gained, when there is one.
    fn precompile(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Precompiled> {
        let bytes = engine.precompile_component(wasm);
        let counts = self.compiling.functions.as_ref().map(|f| f.finish());
        if let Some((found, compiled)) = counts {
            tracing::debug!(found, compiled, "functions from the function cache");
        }
        Ok((bytes?, counts))
    }

    /// Compiles `wasm`, here or in a child, and loads it. A child writes the artifact
    /// straight into the disk cache when there is one, so that it never passes through this
    /// process's heap.
    fn compile(
        &self,
        engine: &Engine,
        digest_hex: &str,
        wasm: &[u8],
    ) -> wasmtime::Result<(Component, Artifact)> {
        let _one = COMPILING.lock().unwrap_or_else(PoisonError::into_inner);
        let c = &self.compiling;
        let program = match &c.compiler {
            Compiler::InProcess => {
                let (bytes, _) = self.precompile(engine, wasm)?;
                let component = self.load_bytes(engine, digest_hex, &bytes)?;
                return Ok((component, Artifact::Bytes(bytes)));
            }
            Compiler::Subprocess(program) => program,
        };
        if let Some(tmp) = self.temp_path(digest_hex) {
            let compiled = compile::in_child(c, program, wasm, Some(&tmp));
            if let Err(e) = compiled {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            match self.adopt(digest_hex, &tmp) {
                Ok(path) => return Ok((map_file(engine, &path)?, Artifact::File(path))),
                Err(e) => {
                    tracing::warn!(path = %tmp.display(), error = %e, "cannot keep the artifact in the disk cache");
                    let bytes = std::fs::read(&tmp);
                    let _ = std::fs::remove_file(&tmp);
                    let bytes = bytes?;
                    let component = self.load_bytes(engine, digest_hex, &bytes)?;
                    return Ok((component, Artifact::Bytes(bytes)));
                }
            }
        }
        let bytes = compile::in_child(c, program, wasm, None)?;
        let component = self.load_bytes(engine, digest_hex, &bytes)?;
        Ok((component, Artifact::Bytes(bytes)))
    }

    /// A fresh temporary name beside where the artifact `digest_hex` goes, its directory
    /// made; `None` without a disk cache.
    fn temp_path(&self, digest_hex: &str) -> Option<PathBuf> {
        let (artifact, _) = self.paths(digest_hex)?;
        std::fs::create_dir_all(artifact.parent()?).ok()?;
        Some(temp_name(&artifact))
    }

    /// Moves the artifact a child wrote at `tmp` into place, with its checksum; where.
    fn adopt(&self, digest_hex: &str, tmp: &Path) -> std::io::Result<PathBuf> {
        let (artifact, checksum) = self
            .paths(digest_hex)
            .ok_or_else(|| std::io::Error::other("no disk cache"))?;
        let mut file = std::fs::File::open(tmp)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher)?;
        file.sync_all()?;
        std::fs::rename(tmp, &artifact)?;
        write_atomic(&checksum, hex(&hasher.finalize()).as_bytes())?;
        self.evict_for(&artifact);
        Ok(artifact)
    }

    /// Loads an artifact this host or a replica produced: kept on disk and mapped from there
    /// when there is a disk cache (its code is then paged in as it runs, and shared with the
    /// page cache), else copied into memory.
    fn load_bytes(
        &self,
        engine: &Engine,
        digest_hex: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<Component> {
        if let Some(path) = self.write_disk(digest_hex, bytes) {
            match map_file(engine, &path) {
                Ok(component) => return Ok(component),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "mapping the artifact written just now failed; loading it from memory");
                }
            }
        }
        #[allow(unsafe_code)]
        // SAFETY: wasmtime requires the bytes to come from `Component::serialize` (or
        // `Engine::precompile_component`) of a compatible engine. Either this program produced
        // them (in this process, or in a child running `compile-plugin`, which builds its
        // engine with the same settings), or a replica did and the caller checked their MAC
        // (`Vouched`). wasmtime itself still rejects another version or configuration.
        unsafe {
            Component::deserialize(engine, bytes)
        }
    }

    /// Loads an artifact another replica compiled.
    fn load_shared(
        &self,
        engine: &Engine,
        digest_hex: &str,
        vouched: Vouched,
    ) -> Option<Component> {
        match self.load_bytes(engine, digest_hex, vouched.bytes()) {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(error = %e, "shared artifact refused; compiling");
                if let Some((artifact, checksum)) = self.paths(digest_hex) {
                    let _ = std::fs::remove_file(artifact);
                    let _ = std::fs::remove_file(checksum);
                }
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryCache> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn paths(&self, digest_hex: &str) -> Option<(PathBuf, PathBuf)> {
        let dir = self.dir.as_ref()?;
        Some((
            dir.join(format!("{digest_hex}.cwasm")),
            dir.join(format!("{digest_hex}.cwasm.sha256")),
        ))
    }

    fn read_disk(&self, engine: &Engine, digest_hex: &str) -> Option<Component> {
        let (artifact, checksum) = self.paths(digest_hex)?;
        let expected = std::fs::read_to_string(&checksum).ok()?;
        let bytes = std::fs::read(&artifact).ok()?;
        if hex(&Sha256::digest(&bytes)) != expected.trim() {
            tracing::warn!(path = %artifact.display(), "cached artifact fails its checksum; recompiling");
            return None;
        }
        drop(bytes);
        disk::touch(&artifact);
        match map_file(engine, &artifact) {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(path = %artifact.display(), error = %e, "cached artifact refused; recompiling");
                None
            }
        }
    }

    /// Writes an artifact and its checksum; where, if it could.
    fn write_disk(&self, digest_hex: &str, bytes: &[u8]) -> Option<PathBuf> {
        let (artifact, checksum) = self.paths(digest_hex)?;
        let result = (|| {
            let dir = artifact.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            write_atomic(&artifact, bytes)?;
            write_atomic(&checksum, hex(&Sha256::digest(bytes)).as_bytes())
        })();
        if let Err(e) = &result {
            tracing::warn!(path = %artifact.display(), error = %e, "cannot write the artifact cache");
        }
        self.evict_for(&artifact);
        result.ok().map(|()| artifact)
    }

    /// Keeps the disk cache within its bound, never evicting `artifact`, just written.
    fn evict_for(&self, artifact: &Path) {
        // `<dir>/components`: older engines' artifacts count too.
        if let Some(root) = artifact.parent().and_then(Path::parent) {
            let removed = disk::evict(
                root,
                self.max_disk_bytes,
                artifact,
                "cwasm",
                Some(".sha256"),
            );
            if removed > 0 {
                tracing::info!(
                    removed,
                    limit = self.max_disk_bytes,
                    "evicted least recently used compiled artifacts"
                );
            }
        }
    }
}

/// Maps a cached artifact: its pages are read in as they are used, and the page cache shares
/// them.
fn map_file(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    #[allow(unsafe_code)]
    // SAFETY: wasmtime requires the file to hold what `Component::serialize` of a compatible
    // engine produced, unchanged while it is mapped. This cache writes each artifact whole to a
    // temporary name and renames it into place, in a directory keyed by the engine's
    // compatibility hash, only after it was compiled by this program or its MAC checked; files
    // are replaced and deleted, never written in place, so a mapped file never changes. The
    // directory is the host's own (the pod's `emptyDir`): whoever can write into it can already
    // run code in the pod. wasmtime itself still rejects another version or configuration.
    unsafe {
        Component::deserialize_file(engine, path)
    }
}

/// A stable name for the engine's compatibility: SHA-256 over the bytes its `Hash` feeds in.
/// (`DefaultHasher`'s algorithm may change between Rust releases; this may not.)
fn engine_key(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex(&hasher.0.finalize()[..16])
}

struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
