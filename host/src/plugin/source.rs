//! Reads a plugin out of its ConfigMap: the module bytes, their digest, settings and limits.
//!
//! A plugin ConfigMap carries the label [`PLUGIN_LABEL`] and exactly one module: a `binaryData`
//! key ending in `.wasm` (raw) or `.wasm.gz` (gzip), or a script in a key whose extension names
//! its language ([`Language::of_key`]: `.star` for Starlark), in `data` or `binaryData`.
//! Or, for a module kept in an OCI registry, a key ending in [`OCI_SUFFIX`] (`plugin.oci`, or
//! `plugin.star.oci` for a Starlark script) whose value is a reference pinned by digest, `oci://REGISTRY/REPO[:TAG]@sha256:…` (what
//! `wasmop push` prints): the module is fetched when the version loads ([`super::oci`]), and
//! a tag alone is refused, so that what runs changes only when the ConfigMap does.
//! Optional keys and annotations:
//! - `settings.yaml` (in `data`): handed to every reconcile as `settings`;
//! - annotations [`DEADLINE_ANNOTATION`], [`MEMORY_ANNOTATION`], [`RESPONSE_ANNOTATION`] and
//!   [`RESYNC_ANNOTATION`] override the host's defaults for this plugin, each within its
//!   range in [`crate::config`] (a value past it would overflow a byte count or a clock);
//! - the rollout annotations of [`super::rollout`], saying how a new version goes live.
//!
//! A `.wasm.gz` is untrusted input that expands about a thousandfold, so it is checked before
//! it is inflated and never inflated past what it may be: it must start with the gzip magic
//! (`1f 8b`), its gzip trailer must declare at most [`config::MODULE_MAX_MIB`] MiB, and its
//! first four inflated bytes must be the WebAssembly magic (`\0asm`) before anything more is
//! inflated; then it must inflate to exactly the size it declared. A stream of zeros is thus
//! refused after four bytes, and a load can reserve what a module will take before inflating
//! it ([`Parts::size`]). [`read`] inflates the module (the offline commands); the registry
//! uses [`read_stored`], which checks and digests the module as it streams through and keeps
//! only the stored form, to be inflated again ([`Parts::wasm`]) by a load under the host's
//! budget ([`super::load`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::ops::RangeInclusive;
use std::time::Duration;

use flate2::read::GzDecoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::oci::{PULL_SECRET_ANNOTATION, Reference};
use super::rollout::{Rollout, RolloutError};
use crate::config;
use crate::sandbox::{Language, Limits, digest_of};

/// The label that marks a ConfigMap as a plugin (any value).
pub const PLUGIN_LABEL: &str = "wasmop.io/plugin";
/// The end of the key that names a module in a registry instead of holding one.
pub const OCI_SUFFIX: &str = ".oci";
/// The key of the optional settings document.
pub const SETTINGS_KEY: &str = "settings.yaml";
/// Annotation: the deadline of one call (wall time while the guest runs), in milliseconds.
pub const DEADLINE_ANNOTATION: &str = "wasmop.io/deadline-ms";
/// Annotation: memory cap of one instance, in MiB.
pub const MEMORY_ANNOTATION: &str = "wasmop.io/memory-mib";
/// Annotation: largest response, in KiB.
pub const RESPONSE_ANNOTATION: &str = "wasmop.io/max-response-kib";
/// Annotation: how often every parent is reconciled even when nothing changed, in seconds.
pub const RESYNC_ANNOTATION: &str = "wasmop.io/resync-seconds";

/// Decompressed modules larger than this are refused before compiling (a gzip bomb guard).
const MAX_MODULE_BYTES: u64 = config::MODULE_MAX_MIB << 20;
/// Every gzip stream starts with these two bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Every WebAssembly module and component starts with these four: `\0asm`.
const WASM_MAGIC: [u8; 4] = *b"\0asm";
/// The shortest gzip stream: a 10-byte header and an 8-byte trailer.
const GZIP_MIN_LEN: usize = 18;
/// How much is inflated at a time after the magic.
const CHUNK: usize = 64 << 10;

/// Everything the host takes from one plugin ConfigMap.
#[derive(Debug, Clone)]
pub struct PluginSource {
    /// The ConfigMap's name.
    pub configmap: String,
    /// The `binaryData` key the module came from.
    pub key: String,
    /// The module, decompressed by [`read`]; always empty from [`read_stored`] (the registry
    /// keeps only the stored form in [`Self::parts`], which a load inflates with
    /// [`Parts::wasm`]).
    pub wasm: Vec<u8>,
    /// `sha256:<hex>` of the module, decompressed.
    pub digest: String,
    /// `sha256:<hex>` of the module as stored: the same stored bytes seen again are known
    /// without inflating them (see [`read_stored`]).
    pub stored_digest: String,
    /// The parsed `settings.yaml`, `null` when absent.
    pub settings: Value,
    /// Sandbox limits: the host's defaults with this ConfigMap's overrides.
    pub limits: Limits,
    /// Resync period override, if annotated.
    pub resync: Option<Duration>,
    /// What of the ConfigMap makes this version, as stored in its revision.
    pub parts: Parts,
    /// How it goes live.
    pub rollout: Rollout,
}

/// The parts of a plugin ConfigMap that make one version of the plugin: the module as stored,
/// the settings text and the limit annotations. Equal parts are one revision; the rollout
/// annotations are not part of it (they say how a revision goes live, not what it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    /// The `binaryData` key of the module.
    pub key: String,
    /// The module as stored (gzip for a `.wasm.gz` key).
    pub module: Vec<u8>,
    /// The `settings.yaml` text, if any.
    pub settings: Option<String>,
    /// The limit annotations the ConfigMap sets.
    pub annotations: BTreeMap<String, String>,
}

impl Parts {
    /// The language of a script plugin; `None` for a WebAssembly module.
    pub fn language(&self) -> Option<Language> {
        Language::of_key(self.file())
    }

    /// The plugin's file name, for messages: the key, less [`OCI_SUFFIX`] for one kept in a
    /// registry (`plugin.star.oci` holds `plugin.star`).
    pub fn file(&self) -> &str {
        self.key.strip_suffix(OCI_SUFFIX).unwrap_or(&self.key)
    }

    /// The registry reference of a module kept in one; `None` when the parts hold the module.
    pub fn reference(&self, configmap: &str) -> Option<Result<Reference, SourceError>> {
        self.key.ends_with(OCI_SUFFIX).then(|| {
            let text = std::str::from_utf8(&self.module).map_err(|_| SourceError::Reference {
                configmap: configmap.to_owned(),
                key: self.key.clone(),
                reason: "not UTF-8 text".into(),
            })?;
            let reference: Reference =
                text.trim()
                    .parse()
                    .map_err(|reason: String| SourceError::Reference {
                        configmap: configmap.to_owned(),
                        key: self.key.clone(),
                        reason,
                    })?;
            if reference.digest.is_none() {
                return Err(SourceError::Reference {
                    configmap: configmap.to_owned(),
                    key: self.key.clone(),
                    reason: format!(
                        "{reference} is not pinned by digest: name it as `wasmop push` prints it, \
                         …@sha256:<hex>, so that what runs changes only when this ConfigMap does"
                    ),
                });
            }
            Ok(reference)
        })
    }

    /// The module of ConfigMap `configmap` (a script's text, for a script), inflated if it is
    /// stored gzipped (after the checks
    /// of [`check_gzip`], and never past the size it declares).
    pub fn wasm(&self, configmap: &str) -> Result<Vec<u8>, SourceError> {
        if let Some(reference) = self.reference(configmap) {
            return Err(SourceError::Reference {
                configmap: configmap.to_owned(),
                key: self.key.clone(),
                reason: format!("{} is fetched when the host loads it", reference?),
            });
        }
        if !self.gzipped() {
            return Ok(self.module.clone());
        }
        let size = self.size(configmap)?;
        // Exactly what it declared: never a doubling past it.
        let mut out = Vec::with_capacity(size as usize);
        inflate_module(&self.module, MAX_MODULE_BYTES, |chunk| {
            out.extend_from_slice(chunk)
        })
        .map_err(|fault| self.fault(configmap, fault))?;
        Ok(out)
    }

    /// How many bytes the module takes once inflated: a `.wasm.gz`'s as its gzip trailer
    /// declares it (what [`Parts::wasm`] allows it, checked before anything is inflated), a
    /// raw module's length.
    pub fn size(&self, configmap: &str) -> Result<u64, SourceError> {
        if !self.gzipped() {
            return Ok(self.module.len() as u64);
        }
        check_gzip(&self.module, MAX_MODULE_BYTES).map_err(|fault| self.fault(configmap, fault))
    }

    /// `sha256:<hex>` of the inflated module, inflated a chunk at a time and never held whole.
    pub fn digest(&self, configmap: &str) -> Result<String, SourceError> {
        // The manifest's, for a module in a registry: fetched only when it loads.
        if let Some(reference) = self.reference(configmap) {
            return Ok(reference?.digest.expect("pinned").to_string());
        }
        if !self.gzipped() {
            return Ok(digest_of(&self.module));
        }
        let mut h = Sha256::new();
        inflate_module(&self.module, MAX_MODULE_BYTES, |chunk| h.update(chunk))
            .map_err(|fault| self.fault(configmap, fault))?;
        Ok(format!("sha256:{}", crate::text::hex(&h.finalize())))
    }

    fn gzipped(&self) -> bool {
        self.key.ends_with(".gz")
    }

    fn fault(&self, configmap: &str, fault: ModuleFault) -> SourceError {
        SourceError::Module {
            configmap: configmap.to_owned(),
            key: self.key.clone(),
            fault,
        }
    }

    /// A short hash of the parts, naming the revision that holds them.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        for field in [self.key.as_bytes(), &self.module] {
            h.update((field.len() as u64).to_be_bytes());
            h.update(field);
        }
        match &self.settings {
            Some(s) => {
                h.update([1]);
                h.update((s.len() as u64).to_be_bytes());
                h.update(s.as_bytes());
            }
            None => h.update([0]),
        }
        for (k, v) in &self.annotations {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u64).to_be_bytes());
            h.update(v.as_bytes());
        }
        crate::text::hex(&h.finalize()[..5])
    }

    /// The parts as a plugin ConfigMap named `name`, which [`read`] reads back. The module is
    /// in `binaryData` even when it is a script: a revision holds this ConfigMap in its
    /// `data`, which the API server compares byte for byte after a JSON round trip that
    /// escapes `<`, `>` and `&`, so a script as text would make every later patch of the
    /// revision fail as a change to an immutable field.
    pub fn to_configmap(&self, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(
                self.key.clone(),
                ByteString(self.module.clone()),
            )])),
            data: self
                .settings
                .as_ref()
                .map(|s| BTreeMap::from([(SETTINGS_KEY.to_owned(), s.clone())])),
            ..Default::default()
        }
    }
}

/// The annotations that are part of a revision: the limits, and the pull Secret a module in
/// a registry is fetched with (an undo fetches it again).
const LIMIT_ANNOTATIONS: [&str; 5] = [
    DEADLINE_ANNOTATION,
    MEMORY_ANNOTATION,
    RESPONSE_ANNOTATION,
    RESYNC_ANNOTATION,
    PULL_SECRET_ANNOTATION,
];

impl PluginSource {
    /// The module, inflated: [`Self::wasm`] when it holds it, else inflated from the stored
    /// form.
    pub fn module(&self) -> Result<Vec<u8>, SourceError> {
        if self.wasm.is_empty() {
            self.parts.wasm(&self.configmap)
        } else {
            Ok(self.wasm.clone())
        }
    }

    /// Drops the module, inflated and stored, keeping everything that says which version this
    /// was (digests, key, settings, limits): what a version that failed for good leaves.
    pub fn release(&mut self) {
        self.wasm = Vec::new();
        self.parts.module = Vec::new();
    }

    /// True when `other` would load the same plugin with the same settings and limits: the
    /// same bytes read the same way (a module, a script in the same language, or a registry
    /// reference of either, pulled with the same Secret).
    pub fn same_as(&self, other: &PluginSource) -> bool {
        fn read_as(s: &PluginSource) -> (Option<Language>, bool, Option<&String>) {
            (
                s.parts.language(),
                s.parts.key.ends_with(OCI_SUFFIX),
                s.parts.annotations.get(PULL_SECRET_ANNOTATION),
            )
        }
        self.digest == other.digest
            && read_as(self) == read_as(other)
            && self.settings == other.settings
            && self.limits == other.limits
            && self.resync == other.resync
            && self.rollout == other.rollout
    }
}

/// Why a ConfigMap does not hold a usable plugin.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// No `binaryData` key ends in `.wasm` or `.wasm.gz`, and no key names a script or a
    /// registry reference.
    #[error(
        "no binaryData key ending in .wasm or .wasm.gz, no script key ending in .star and no registry reference key ending in .oci (found: {0})"
    )]
    NoModule(String),
    /// A registry reference that does not parse or is not pinned.
    #[error("ConfigMap {configmap}, key {key}: {reason}")]
    Reference {
        /// The ConfigMap's name.
        configmap: String,
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// More than one module or script key.
    #[error("more than one module key: {0}; keep exactly one")]
    ManyModules(String),
    /// The module's bytes are not what its key says (see [`ModuleFault`]).
    #[error("ConfigMap {configmap}, binaryData key {key}: {fault}")]
    Module {
        /// The ConfigMap's name.
        configmap: String,
        /// The key.
        key: String,
        /// What was found.
        fault: ModuleFault,
    },
    /// `settings.yaml` does not parse.
    #[error("{SETTINGS_KEY}: {0}")]
    Settings(String),
    /// An annotation is not an integer in its range.
    #[error("annotation {name}={value:?}: expected an integer from {} to {}", .range.start(), .range.end())]
    Annotation {
        /// The annotation.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it may be.
        range: RangeInclusive<u64>,
    },
    /// A rollout annotation is not what it must be.
    #[error(transparent)]
    Rollout(#[from] RolloutError),
}

impl SourceError {
    /// The error as a message that names ConfigMap `namespace/name` once.
    pub fn in_configmap(&self, namespace: &str, name: &str) -> String {
        match self {
            // It names the ConfigMap and its key already.
            Self::Module { .. } | Self::Reference { .. } => {
                format!("{self} (namespace {namespace})")
            }
            // Two install paths mixed (`create configmap --from-file` and `wasmop package`):
            // say how to keep the packaged one (a script beside a module is no such mix-up).
            Self::ManyModules(keys) => {
                let script = keys.split(", ").any(|k| Language::of_key(k).is_some());
                let remove: Vec<String> = keys
                    .split(", ")
                    .filter(|k| !k.ends_with(".wasm.gz"))
                    .map(|k| format!("{{\"op\":\"remove\",\"path\":\"/binaryData/{k}\"}}"))
                    .collect();
                let fix = if script || remove.is_empty() || remove.len() == keys.split(", ").count()
                {
                    String::new()
                } else {
                    format!(
                        "; to keep the packaged one: kubectl -n {namespace} patch configmap {name} --type=json -p '[{}]'",
                        remove.join(",")
                    )
                };
                format!("ConfigMap {namespace}/{name}: {self}{fix}")
            }
            _ => format!("ConfigMap {namespace}/{name}: {self}"),
        }
    }
}

/// What is wrong with the bytes of a `.wasm.gz` key, found before or while inflating it.
#[derive(Debug, thiserror::Error)]
pub enum ModuleFault {
    /// It does not start with the gzip magic.
    #[error("not gzip: it starts with {found}, where gzip starts with 1f 8b")]
    NotGzip {
        /// Its first bytes, in hex.
        found: String,
    },
    /// Too short to be gzip at all.
    #[error("not gzip: {len} bytes, fewer than the {GZIP_MIN_LEN} of the shortest gzip stream")]
    Truncated {
        /// Its length.
        len: usize,
    },
    /// Its gzip trailer declares more than a module may be.
    #[error(
        "its gzip trailer declares {declared} bytes once inflated, more than the {} MiB a module may be; nothing was inflated",
        .max >> 20
    )]
    TooLarge {
        /// What it declares.
        declared: u64,
        /// What a module may be.
        max: u64,
    },
    /// The first inflated bytes are not the WebAssembly magic.
    #[error(
        "inflates to {found} first, not WebAssembly (which starts 00 61 73 6d, \\0asm); nothing more was inflated"
    )]
    NotWasm {
        /// The first inflated bytes, in hex.
        found: String,
    },
    /// It goes on past the size its trailer declares.
    #[error(
        "inflates past the {declared} bytes its gzip trailer declares; refused there (trailing data, or a bomb)"
    )]
    Longer {
        /// What it declares.
        declared: u64,
    },
    /// It ends before the size its trailer declares.
    #[error("inflates to {got} bytes, not the {declared} its gzip trailer declares")]
    Shorter {
        /// What it inflated to.
        got: u64,
        /// What it declares.
        declared: u64,
    },
    /// The deflate stream or its checksum is broken.
    #[error("not valid gzip: {0}")]
    Gzip(std::io::Error),
}

/// Whether `key` holds a plugin's module: `.wasm`, `.wasm.gz`, a script's extension, or a
/// registry reference's.
pub fn is_module_key(key: &str) -> bool {
    key.ends_with(".wasm")
        || key.ends_with(".wasm.gz")
        || key.ends_with(OCI_SUFFIX)
        || Language::of_key(key).is_some()
}

/// Reads a plugin out of `cm`, starting from the host's `defaults`, with its module inflated.
pub fn read(cm: &ConfigMap, defaults: &Limits) -> Result<PluginSource, SourceError> {
    let mut source = read_stored(cm, defaults, None)?;
    source.wasm = source.parts.wasm(&source.configmap)?;
    Ok(source)
}

/// Reads a plugin out of `cm` as [`read`] does, but leaves the module in its stored form: a
/// `.wasm.gz` is checked and digested a chunk at a time and never held inflated. When `known`
/// holds the same stored bytes under the same key, its digest is taken and nothing is
/// inflated (a relist, or a change of an annotation).
pub fn read_stored(
    cm: &ConfigMap,
    defaults: &Limits,
    known: Option<&PluginSource>,
) -> Result<PluginSource, SourceError> {
    let configmap = cm.metadata.name.clone().unwrap_or_default();
    let binary = cm.binary_data.clone().unwrap_or_default();
    let text = cm.data.clone().unwrap_or_default();
    let modules: Vec<&String> = binary
        .keys()
        .filter(|k| is_module_key(k))
        .chain(
            text.keys()
                .filter(|k| Language::of_key(k).is_some() || k.ends_with(OCI_SUFFIX)),
        )
        .collect();
    let key = match modules.as_slice() {
        [one] => (*one).clone(),
        [] => {
            let list = |keys: Vec<&String>| match keys.as_slice() {
                [] => "none".to_string(),
                keys => keys
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let data: Vec<&String> = cm.data.iter().flat_map(|d| d.keys()).collect();
            let found = format!(
                "binaryData: {}; data: {}",
                list(binary.keys().collect()),
                list(data)
            );
            return Err(SourceError::NoModule(found));
        }
        many => {
            let names: Vec<&str> = many.iter().map(|k| k.as_str()).collect();
            return Err(SourceError::ManyModules(names.join(", ")));
        }
    };
    let raw = match binary.get(&key) {
        Some(bytes) => bytes.0.clone(),
        None => text[&key].clone().into_bytes(),
    };

    let settings_text = cm.data.as_ref().and_then(|d| d.get(SETTINGS_KEY)).cloned();
    let settings = match &settings_text {
        Some(text) => {
            serde_yaml::from_str::<Value>(text).map_err(|e| SourceError::Settings(e.to_string()))?
        }
        None => Value::Null,
    };

    let annotations = cm.metadata.annotations.clone().unwrap_or_default();
    // Bounded: a value past its range would overflow a byte count or a deadline later.
    let number =
        |name: &'static str, range: RangeInclusive<u64>| -> Result<Option<u64>, SourceError> {
            match annotations.get(name) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if range.contains(&n) => Ok(Some(n)),
                    _ => Err(SourceError::Annotation {
                        name,
                        value: v.clone(),
                        range,
                    }),
                },
            }
        };
    let mut limits = *defaults;
    if let Some(ms) = number(DEADLINE_ANNOTATION, config::DEADLINE_MS_RANGE)? {
        limits.deadline = Duration::from_millis(ms);
    }
    if let Some(mib) = number(MEMORY_ANNOTATION, config::MEMORY_MIB_RANGE)? {
        limits.memory_bytes = mib << 20;
    }
    if let Some(kib) = number(RESPONSE_ANNOTATION, config::MAX_RESPONSE_KIB_RANGE)? {
        limits.response_bytes = kib << 10;
    }
    let resync = number(RESYNC_ANNOTATION, config::RESYNC_SECONDS_RANGE)?.map(Duration::from_secs);
    let rollout = Rollout::from_annotations(&annotations)?;
    let parts = Parts {
        key: key.clone(),
        module: raw,
        settings: settings_text,
        annotations: LIMIT_ANNOTATIONS
            .iter()
            .filter_map(|a| Some((a.to_string(), annotations.get(*a)?.clone())))
            .collect(),
    };
    let stored_digest = digest_of(&parts.module);
    let digest = match known {
        Some(k) if k.parts.key == parts.key && k.stored_digest == stored_digest => k.digest.clone(),
        _ => parts.digest(&configmap)?,
    };

    Ok(PluginSource {
        configmap,
        key,
        digest,
        stored_digest,
        wasm: Vec::new(),
        settings,
        limits,
        resync,
        parts,
        rollout,
    })
}

/// Inflates gzip, refusing anything larger than `max` bytes once inflated (a gzip bomb).
pub(crate) fn inflate_at_most(gz: &[u8], max: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    GzDecoder::new(gz)
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not valid gzip: {e}"))?;
    if out.len() as u64 > max {
        return Err(format!("inflates to more than {} MiB", max >> 20));
    }
    Ok(out)
}

/// Checks what a `.wasm.gz` can be checked for without inflating it: the gzip magic, a length
/// gzip can have, and the size its trailer declares (the last four bytes, the size modulo
/// 2^32: one past `max` is past it whatever the stream holds). Returns that size.
pub(crate) fn check_gzip(gz: &[u8], max: u64) -> Result<u64, ModuleFault> {
    if !gz.starts_with(&GZIP_MAGIC) {
        return Err(ModuleFault::NotGzip {
            found: first_bytes(gz),
        });
    }
    if gz.len() < GZIP_MIN_LEN {
        return Err(ModuleFault::Truncated { len: gz.len() });
    }
    let trailer: [u8; 4] = gz[gz.len() - 4..].try_into().expect("four bytes");
    let declared = u64::from(u32::from_le_bytes(trailer));
    if declared > max {
        return Err(ModuleFault::TooLarge { declared, max });
    }
    Ok(declared)
}

/// Inflates a `.wasm.gz` into `sink` a chunk at a time, after [`check_gzip`]: first its first
/// four bytes, which must be the WebAssembly magic, then the rest, never past the size its
/// trailer declares; it must come to exactly that size. Returns the size.
fn inflate_module(gz: &[u8], max: u64, mut sink: impl FnMut(&[u8])) -> Result<u64, ModuleFault> {
    let declared = check_gzip(gz, max)?;
    let mut decoder = GzDecoder::new(gz);
    // Four bytes out: the decoder inflates little more than it is asked for (its window of
    // 32 KiB at most), so a stream that is not a module costs that, not 64 MiB.
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < magic.len() {
        match decoder.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ModuleFault::Gzip(e)),
        }
    }
    if magic[..got] != WASM_MAGIC {
        return Err(ModuleFault::NotWasm {
            found: if got == 0 {
                "nothing".to_owned()
            } else {
                hex_bytes(&magic[..got])
            },
        });
    }
    let mut total = magic.len() as u64;
    if total > declared {
        return Err(ModuleFault::Longer { declared });
    }
    sink(&magic);
    // One past the declared size at most: enough to tell it goes on.
    let mut rest = decoder.take(declared + 1 - total);
    let mut buf = vec![0u8; CHUNK];
    loop {
        match rest.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                if total > declared {
                    return Err(ModuleFault::Longer { declared });
                }
                sink(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ModuleFault::Gzip(e)),
        }
    }
    if total != declared {
        return Err(ModuleFault::Shorter {
            got: total,
            declared,
        });
    }
    Ok(total)
}

/// Up to the first eight of `bytes`, in hex, for an error saying what was found.
fn first_bytes(bytes: &[u8]) -> String {
    match bytes.len() {
        0 => "nothing (it is empty)".to_owned(),
        n if n <= 8 => hex_bytes(bytes),
        _ => format!("{} ...", hex_bytes(&bytes[..8])),
    }
}

fn hex_bytes(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;
    use kube::api::ObjectMeta;

    use super::*;

    #[test]
    fn the_same_reference_read_another_way_is_another_version() {
        let pin = format!(
            "oci://registry.example/team/memcached@sha256:{}",
            "a".repeat(64)
        );
        let read = |key: &str, ann: &[(&str, &str)]| {
            read_stored(&cm(&[], &[(key, &pin)], ann), &Limits::default(), None).unwrap()
        };
        let module = read("plugin.oci", &[]);
        assert!(
            module.same_as(&read("other.oci", &[])),
            "only the key's name"
        );
        let script = read("plugin.star.oci", &[]);
        assert_eq!(script.digest, module.digest);
        assert!(!script.same_as(&module), "a script, not a module");
        let secret = read("plugin.oci", &[(PULL_SECRET_ANNOTATION, "team")]);
        assert!(!secret.same_as(&module), "pulled with another Secret");
    }

    #[test]
    fn a_registry_reference_must_be_pinned_and_stands_for_its_manifest() {
        let pin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let reference = format!("oci://registry.example/team/memcached:0.2.0@{pin}");
        let secret = [(PULL_SECRET_ANNOTATION, "registry-pull")];
        let source = read_stored(
            &cm(&[], &[("plugin.oci", &format!("{reference}\n"))], &secret),
            &Limits::default(),
            None,
        )
        .unwrap();
        assert_eq!(source.digest, pin);
        assert_eq!(
            source
                .parts
                .reference("memcached")
                .unwrap()
                .unwrap()
                .to_string(),
            reference
        );
        // The pull Secret is part of the revision: an undo fetches with it again.
        assert_eq!(
            source
                .parts
                .annotations
                .get(PULL_SECRET_ANNOTATION)
                .map(String::as_str),
            Some("registry-pull")
        );
        // Its revision's ConfigMap (binaryData) reads back as the same reference.
        let back = read_stored(
            &source.parts.to_configmap("memcached"),
            &Limits::default(),
            None,
        )
        .unwrap();
        assert_eq!(back.digest, pin);
        // Nothing to inflate: the module is fetched at load.
        assert!(matches!(
            source.parts.wasm("memcached"),
            Err(SourceError::Reference { .. })
        ));

        let tag_only = read_stored(
            &cm(
                &[],
                &[("plugin.oci", "oci://registry.example/team/memcached:0.2.0")],
                &[],
            ),
            &Limits::default(),
            None,
        )
        .unwrap_err();
        assert!(
            tag_only.to_string().contains("not pinned by digest"),
            "{tag_only}"
        );
        let garbage = read_stored(
            &cm(&[], &[("plugin.oci", "https://registry.example/x")], &[]),
            &Limits::default(),
            None,
        )
        .unwrap_err();
        assert!(
            garbage
                .to_string()
                .contains("ConfigMap memcached, key plugin.oci"),
            "{garbage}"
        );
    }

    fn cm(binary: &[(&str, Vec<u8>)], data: &[(&str, &str)], ann: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("memcached".into()),
                annotations: Some(
                    ann.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            binary_data: Some(
                binary
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.clone())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn raw_module_settings_and_overrides() {
        let src = read(
            &cm(
                &[("memcached.wasm", b"\0asm".to_vec())],
                &[(SETTINGS_KEY, "image: memcached:1.6\n")],
                &[(DEADLINE_ANNOTATION, "250"), (RESYNC_ANNOTATION, "30")],
            ),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(src.wasm, b"\0asm");
        assert_eq!(src.key, "memcached.wasm");
        assert_eq!(src.digest, digest_of(b"\0asm"));
        assert!(src.digest.starts_with("sha256:") && src.digest.len() == 71);
        assert_eq!(src.settings["image"], "memcached:1.6");
        assert_eq!(src.limits.deadline, Duration::from_millis(250));
        assert_eq!(src.limits.memory_bytes, Limits::default().memory_bytes);
        assert_eq!(src.resync, Some(Duration::from_secs(30)));
    }

    #[test]
    fn gzip_module_is_inflated() {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(b"\0asm-module").unwrap();
        let gz = enc.finish().unwrap();
        let src = read(&cm(&[("p.wasm.gz", gz)], &[], &[]), &Limits::default()).unwrap();
        assert_eq!(src.wasm, b"\0asm-module");
        assert_eq!(src.settings, Value::Null);
    }

    #[test]
    fn a_script_key_names_its_language_and_reads_back() {
        let script = "MANIFEST = {}\n";
        let configmap = cm(
            &[],
            &[("plugin.star", script), (SETTINGS_KEY, "a: 1\n")],
            &[],
        );
        let src = read(&configmap, &Limits::default()).unwrap();
        assert_eq!(src.key, "plugin.star");
        assert_eq!(src.parts.language(), Some(Language::Starlark));
        assert_eq!(src.wasm, script.as_bytes());
        assert_eq!(src.digest, digest_of(script.as_bytes()));
        assert_eq!(src.settings["a"], 1);
        // A revision stores it as bytes, and reads it back the same.
        let back = src.parts.to_configmap("memcached");
        assert_eq!(
            back.binary_data.as_ref().unwrap()["plugin.star"].0,
            script.as_bytes()
        );
        assert_eq!(read(&back, &Limits::default()).unwrap().parts, src.parts);
        // A module is not a script.
        let module = cm(&[("m.wasm", b"\0asm".to_vec())], &[], &[]);
        assert_eq!(
            read(&module, &Limits::default()).unwrap().parts.language(),
            None
        );
    }

    #[test]
    fn a_script_beside_a_module_is_one_too_many_with_no_patch_to_guess() {
        let both = cm(
            &[("m.wasm.gz", vec![0x1f, 0x8b])],
            &[("plugin.star", "x = 1\n")],
            &[],
        );
        let err = read_stored(&both, &Limits::default(), None).unwrap_err();
        assert!(matches!(err, SourceError::ManyModules(_)), "{err}");
        let message = err.in_configmap("ops", "memcached");
        assert!(message.contains("m.wasm.gz, plugin.star"), "{message}");
        assert!(!message.contains("kubectl"), "{message}");
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    /// The error reading a ConfigMap `memcached` whose only module key is `m.wasm.gz`.
    fn refused(gz: Vec<u8>) -> String {
        read_stored(
            &cm(&[("m.wasm.gz", gz)], &[], &[]),
            &Limits::default(),
            None,
        )
        .unwrap_err()
        .to_string()
    }

    /// Overwrites a stretch in the middle of a gzip stream's deflate data: inflating past it
    /// fails (bad codes, a wrong length or checksum), inflating before it does not.
    fn corrupt_middle(mut gz: Vec<u8>) -> Vec<u8> {
        let mid = gz.len() / 2;
        gz[mid..mid + 16].fill(0xa5);
        gz
    }

    #[test]
    fn stored_reads_digest_the_module_without_holding_it() {
        let module = [b"\0asm\x0d\0\x01\0".as_slice(), &[7u8; 100_000]].concat();
        let gz = gzip(&module);
        let configmap = cm(&[("p.wasm.gz", gz.clone())], &[], &[]);
        let stored = read_stored(&configmap, &Limits::default(), None).unwrap();
        assert!(stored.wasm.is_empty(), "the inflated module is not held");
        assert_eq!(stored.digest, digest_of(&module));
        assert_eq!(stored.stored_digest, digest_of(&gz));
        assert_eq!(stored.parts.module, gz);
        // Its size is known from the trailer, before anything is inflated.
        assert_eq!(stored.parts.size("p").unwrap(), module.len() as u64);
        assert_eq!(stored.module().unwrap(), module);
        let whole = read(&configmap, &Limits::default()).unwrap();
        assert_eq!(whole.wasm, module);
        assert_eq!(whole.digest, stored.digest);

        // The same stored bytes again take the digest they had: nothing is inflated (the
        // digest below is made up, so only taking it gives it back).
        let mut known = stored.clone();
        known.digest = "sha256:known".into();
        let again = read_stored(&configmap, &Limits::default(), Some(&known)).unwrap();
        assert_eq!(again.digest, "sha256:known");
        // Other bytes are digested.
        let other = cm(&[("p.wasm.gz", gzip(b"\0asm-other"))], &[], &[]);
        let other = read_stored(&other, &Limits::default(), Some(&known)).unwrap();
        assert_eq!(other.digest, digest_of(b"\0asm-other"));

        // A version that failed for good keeps what says which it was, not its bytes.
        let mut failed = stored.clone();
        failed.release();
        assert!(failed.wasm.is_empty() && failed.parts.module.is_empty());
        assert!(failed.same_as(&stored));
        let after = read_stored(&configmap, &Limits::default(), Some(&failed)).unwrap();
        assert!(
            after.same_as(&failed),
            "the same bytes are not loaded again"
        );
    }

    #[test]
    fn a_gz_key_must_start_with_the_gzip_magic() {
        // A raw module under a .gz key: named by what it starts with.
        let err = refused([b"\0asm\x0d\0\x01\0".as_slice(), &[0; 64]].concat());
        assert_eq!(
            err,
            "ConfigMap memcached, binaryData key m.wasm.gz: not gzip: it starts with 00 61 73 6d 0d 00 01 00 ..., where gzip starts with 1f 8b"
        );
        assert_eq!(
            refused(Vec::new()),
            "ConfigMap memcached, binaryData key m.wasm.gz: not gzip: it starts with nothing (it is empty), where gzip starts with 1f 8b"
        );
        assert_eq!(
            refused(vec![0x1f, 0x8b, 8, 0]),
            "ConfigMap memcached, binaryData key m.wasm.gz: not gzip: 4 bytes, fewer than the 18 of the shortest gzip stream"
        );
    }

    #[test]
    fn a_trailer_declaring_more_than_a_module_may_be_is_refused_before_inflating() {
        let mut gz = gzip(b"\0asm-small");
        let n = gz.len();
        gz[n - 4..].copy_from_slice(&((64u32 << 20) + 1).to_le_bytes());
        assert_eq!(
            refused(gz),
            "ConfigMap memcached, binaryData key m.wasm.gz: its gzip trailer declares 67108865 bytes once inflated, more than the 64 MiB a module may be; nothing was inflated"
        );
    }

    #[test]
    fn a_stream_of_zeros_is_refused_after_its_first_bytes() {
        let zeros = gzip(&vec![0u8; 4 << 20]);
        assert_eq!(
            refused(zeros.clone()),
            "ConfigMap memcached, binaryData key m.wasm.gz: inflates to 00 00 00 00 first, not WebAssembly (which starts 00 61 73 6d, \\0asm); nothing more was inflated"
        );
        // Broken halfway, it is refused for the same reason: nothing past the first bytes was
        // inflated. The same break after a good magic is found, since that is inflated on.
        let err = refused(corrupt_middle(zeros));
        assert!(err.contains("inflates to 00 00 00 00 first"), "{err}");
        let module = [b"\0asm".as_slice(), &vec![0u8; 4 << 20]].concat();
        let err = refused(corrupt_middle(gzip(&module)));
        assert!(!err.contains("first, not WebAssembly"), "{err}");
        assert!(
            err.starts_with("ConfigMap memcached, binaryData key m.wasm.gz: "),
            "{err}"
        );
        // Fewer than four bytes in all.
        assert_eq!(
            refused(gzip(b"\0a")),
            "ConfigMap memcached, binaryData key m.wasm.gz: inflates to 00 61 first, not WebAssembly (which starts 00 61 73 6d, \\0asm); nothing more was inflated"
        );
    }

    #[test]
    fn a_stream_is_inflated_only_to_the_size_its_trailer_declares() {
        let module = [b"\0asm".as_slice(), &[9u8; 10_000]].concat();
        // Declaring less than it holds: refused once past it, before its own end.
        let mut gz = gzip(&module);
        let n = gz.len();
        gz[n - 4..].copy_from_slice(&100u32.to_le_bytes());
        assert_eq!(
            refused(gz),
            "ConfigMap memcached, binaryData key m.wasm.gz: inflates past the 100 bytes its gzip trailer declares; refused there (trailing data, or a bomb)"
        );
        // A second stream after the first: the trailer read is the second's.
        let two = [gzip(b"\0asm-first"), gzip(&[1u8; 5000])].concat();
        let err = refused(two);
        assert!(
            err.starts_with("ConfigMap memcached, binaryData key m.wasm.gz: ")
                && err.contains("its gzip trailer declares"),
            "{err}"
        );
        // The digest and the inflated bytes agree, at exactly the declared size.
        let parts = read_stored(
            &cm(&[("m.wasm.gz", gzip(&module))], &[], &[]),
            &Limits::default(),
            None,
        )
        .unwrap()
        .parts;
        assert_eq!(parts.size("memcached").unwrap(), module.len() as u64);
        let inflated = parts.wasm("memcached").unwrap();
        assert_eq!(inflated, module);
        assert_eq!(
            inflated.capacity(),
            module.len(),
            "no growth past the declared size"
        );
    }

    #[test]
    fn errors_name_the_configmap_once() {
        let module = SourceError::Module {
            configmap: "bomb".into(),
            key: "bomb.wasm.gz".into(),
            fault: ModuleFault::Truncated { len: 3 },
        };
        assert_eq!(
            module.in_configmap("wasmop-system", "bomb"),
            "ConfigMap bomb, binaryData key bomb.wasm.gz: not gzip: 3 bytes, fewer than the 18 of the shortest gzip stream (namespace wasmop-system)"
        );
        let settings = SourceError::Settings("bad".into());
        assert_eq!(
            settings.in_configmap("wasmop-system", "bomb"),
            "ConfigMap wasmop-system/bomb: settings.yaml: bad"
        );
    }

    #[test]
    fn an_alias_bomb_in_the_settings_is_refused() {
        // 702 bytes that would expand to 10^12 elements.
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            let row = vec![format!("*a{p}"); 10].join(", ");
            doc.push_str(&format!("a{i}: &a{i} [{row}]\n"));
        }
        let err = read(
            &cm(&[("a.wasm", vec![])], &[(SETTINGS_KEY, doc.as_str())], &[]),
            &Limits::default(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(err, "settings.yaml: repetition limit exceeded");
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let none = read(&cm(&[("notes.txt", vec![1])], &[], &[]), &Limits::default());
        assert_eq!(
            none.unwrap_err().to_string(),
            "no binaryData key ending in .wasm or .wasm.gz, no script key ending in .star and no registry reference key ending in .oci (found: binaryData: notes.txt; data: none)"
        );
        // A module given as text lands in data: say so apart.
        let text = read(&cm(&[], &[("x.wasm", "garbled")], &[]), &Limits::default());
        assert_eq!(
            text.unwrap_err().to_string(),
            "no binaryData key ending in .wasm or .wasm.gz, no script key ending in .star and no registry reference key ending in .oci (found: binaryData: none; data: x.wasm)"
        );
        let many = read(
            &cm(&[("a.wasm", vec![]), ("b.wasm.gz", vec![])], &[], &[]),
            &Limits::default(),
        );
        let many = many.unwrap_err();
        assert!(matches!(many, SourceError::ManyModules(_)));
        // Mixed install paths: the message says how to keep the packaged module.
        let said = many.in_configmap("ops", "demo");
        assert!(
            said.ends_with(
                "kubectl -n ops patch configmap demo --type=json -p '[{\"op\":\"remove\",\"path\":\"/binaryData/a.wasm\"}]'"
            ),
            "{said}"
        );
        let gz = read(
            &cm(&[("a.wasm.gz", vec![1, 2, 3])], &[], &[]),
            &Limits::default(),
        );
        assert_eq!(
            gz.unwrap_err().to_string(),
            "ConfigMap memcached, binaryData key a.wasm.gz: not gzip: it starts with 01 02 03, where gzip starts with 1f 8b"
        );
        let ann = read(
            &cm(&[("a.wasm", vec![])], &[], &[(MEMORY_ANNOTATION, "lots")]),
            &Limits::default(),
        );
        assert_eq!(
            ann.unwrap_err().to_string(),
            "annotation wasmop.io/memory-mib=\"lots\": expected an integer from 1 to 1024"
        );
        // Past its range, a value is refused here rather than overflowing later.
        for (name, value) in [
            (RESYNC_ANNOTATION, "9223372036854775808"),
            (RESYNC_ANNOTATION, "0"),
            (DEADLINE_ANNOTATION, "60001"),
            (MEMORY_ANNOTATION, "1025"),
            (RESPONSE_ANNOTATION, "18446744073709551615"),
        ] {
            let err = read(
                &cm(&[("a.wasm", vec![])], &[], &[(name, value)]),
                &Limits::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.starts_with(&format!(
                    "annotation {name}={value:?}: expected an integer from 1 to "
                )),
                "{err}"
            );
        }
        let top = read(
            &cm(
                &[("a.wasm", vec![])],
                &[],
                &[(RESYNC_ANNOTATION, "2592000"), (MEMORY_ANNOTATION, "1024")],
            ),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(top.resync, Some(Duration::from_secs(2_592_000)));
        assert_eq!(top.limits.memory_bytes, 1 << 30);
        let settings = read(
            &cm(&[("a.wasm", vec![])], &[(SETTINGS_KEY, "a: [")], &[]),
            &Limits::default(),
        );
        assert!(
            settings
                .unwrap_err()
                .to_string()
                .starts_with("settings.yaml: ")
        );
    }

    #[test]
    fn parts_name_a_revision_and_read_back() {
        let with = |settings: &str, ann: &[(&str, &str)]| {
            read(
                &cm(
                    &[("m.wasm", b"\0asm".to_vec())],
                    &[(SETTINGS_KEY, settings)],
                    ann,
                ),
                &Limits::default(),
            )
            .unwrap()
        };
        let one = with("image: a\n", &[(DEADLINE_ANNOTATION, "250")]);
        // Rollout annotations say how a version goes live, not what it is.
        let staged = with(
            "image: a\n",
            &[
                (DEADLINE_ANNOTATION, "250"),
                (super::super::rollout::STRATEGY_ANNOTATION, "canary"),
            ],
        );
        assert_eq!(one.parts, staged.parts);
        assert!(!one.same_as(&staged));
        assert_ne!(one.parts.hash(), with("image: b\n", &[]).parts.hash());
        assert_ne!(one.parts.hash(), with("image: a\n", &[]).parts.hash());
        assert_eq!(one.parts.hash().len(), 10);
        let back = read(&one.parts.to_configmap("memcached"), &Limits::default()).unwrap();
        assert_eq!(back.parts, one.parts);
        assert!(back.same_as(&one));
    }
}
