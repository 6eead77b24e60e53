//! Reads a plugin out of its ConfigMap: the module bytes, their digest, settings and limits.
//!
//! A plugin ConfigMap carries the label [`PLUGIN_LABEL`] and exactly one `binaryData` key ending
//! in `.wasm` (raw) or `.wasm.gz` (gzip). Optional keys and annotations:
//! - `settings.yaml` (in `data`): handed to every reconcile as `settings`;
//! - annotations [`DEADLINE_ANNOTATION`], [`MEMORY_ANNOTATION`], [`RESPONSE_ANNOTATION`] and
//!   [`RESYNC_ANNOTATION`] override the host's defaults for this plugin, each within its
//!   range in [`crate::config`] (a value past it would overflow a byte count or a clock);
//! - the rollout annotations of [`super::rollout`], saying how a new version goes live.

use std::collections::BTreeMap;
use std::io::Read;
use std::ops::RangeInclusive;
use std::time::Duration;

use flate2::read::GzDecoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::rollout::{Rollout, RolloutError};
use crate::config;
use crate::sandbox::{Limits, digest_of};

/// The label that marks a ConfigMap as a plugin (any value).
pub const PLUGIN_LABEL: &str = "wasmop.io/plugin";
/// The key of the optional settings document.
pub const SETTINGS_KEY: &str = "settings.yaml";
/// Annotation: CPU deadline of one call, in milliseconds.
pub const DEADLINE_ANNOTATION: &str = "wasmop.io/deadline-ms";
/// Annotation: memory cap of one instance, in MiB.
pub const MEMORY_ANNOTATION: &str = "wasmop.io/memory-mib";
/// Annotation: largest response, in KiB.
pub const RESPONSE_ANNOTATION: &str = "wasmop.io/max-response-kib";
/// Annotation: how often every parent is reconciled even when nothing changed, in seconds.
pub const RESYNC_ANNOTATION: &str = "wasmop.io/resync-seconds";

/// Decompressed modules larger than this are refused before compiling (a gzip bomb guard).
const MAX_MODULE_BYTES: u64 = 64 << 20;

/// Everything the host takes from one plugin ConfigMap.
#[derive(Debug, Clone)]
pub struct PluginSource {
    /// The ConfigMap's name.
    pub configmap: String,
    /// The `binaryData` key the module came from.
    pub key: String,
    /// The module, decompressed; empty once the registry has loaded it (it keeps the
    /// smaller stored form in [`Self::parts`] and inflates it again with [`Parts::wasm`]).
    pub wasm: Vec<u8>,
    /// `sha256:<hex>` of [`Self::wasm`].
    pub digest: String,
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
    /// The module, inflated if it is stored gzipped.
    pub fn wasm(&self) -> Result<Vec<u8>, SourceError> {
        if self.key.ends_with(".gz") {
            inflate(&self.module).map_err(|reason| SourceError::Gzip {
                key: self.key.clone(),
                reason,
            })
        } else {
            Ok(self.module.clone())
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

    /// The parts as a plugin ConfigMap named `name`, which [`read`] reads back.
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

/// The annotations that are part of a revision.
const LIMIT_ANNOTATIONS: [&str; 4] = [
    DEADLINE_ANNOTATION,
    MEMORY_ANNOTATION,
    RESPONSE_ANNOTATION,
    RESYNC_ANNOTATION,
];

impl PluginSource {
    /// True when `other` would load the same plugin with the same settings and limits.
    pub fn same_as(&self, other: &PluginSource) -> bool {
        self.digest == other.digest
            && self.settings == other.settings
            && self.limits == other.limits
            && self.resync == other.resync
            && self.rollout == other.rollout
    }
}

/// Why a ConfigMap does not hold a usable plugin.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// No `binaryData` key ends in `.wasm` or `.wasm.gz`.
    #[error("no binaryData key ending in .wasm or .wasm.gz (found: {0})")]
    NoModule(String),
    /// More than one module key.
    #[error("more than one module key in binaryData: {0}; keep exactly one")]
    ManyModules(String),
    /// The `.wasm.gz` value is not valid gzip, or too large once inflated.
    #[error("binaryData key {key}: {reason}")]
    Gzip {
        /// The key.
        key: String,
        /// What went wrong.
        reason: String,
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

/// Reads a plugin out of `cm`, starting from the host's `defaults`.
pub fn read(cm: &ConfigMap, defaults: &Limits) -> Result<PluginSource, SourceError> {
    let configmap = cm.metadata.name.clone().unwrap_or_default();
    let binary = cm.binary_data.clone().unwrap_or_default();
    let modules: Vec<&String> = binary
        .keys()
        .filter(|k| k.ends_with(".wasm") || k.ends_with(".wasm.gz"))
        .collect();
    let key = match modules.as_slice() {
        [one] => (*one).clone(),
        [] => {
            let mut found: Vec<&String> = binary.keys().collect();
            found.extend(cm.data.iter().flat_map(|d| d.keys()));
            let found = if found.is_empty() {
                "nothing".to_string()
            } else {
                found
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(SourceError::NoModule(found));
        }
        many => {
            let names: Vec<&str> = many.iter().map(|k| k.as_str()).collect();
            return Err(SourceError::ManyModules(names.join(", ")));
        }
    };
    let raw = &binary[&key].0;

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
        module: raw.clone(),
        settings: settings_text,
        annotations: LIMIT_ANNOTATIONS
            .iter()
            .filter_map(|a| Some((a.to_string(), annotations.get(*a)?.clone())))
            .collect(),
    };
    let wasm = parts.wasm()?;

    Ok(PluginSource {
        configmap,
        key,
        digest: digest_of(&wasm),
        wasm,
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

fn inflate(gz: &[u8]) -> Result<Vec<u8>, String> {
    inflate_at_most(gz, MAX_MODULE_BYTES)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;
    use kube::api::ObjectMeta;

    use super::*;

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
            "no binaryData key ending in .wasm or .wasm.gz (found: notes.txt)"
        );
        let many = read(
            &cm(&[("a.wasm", vec![]), ("b.wasm.gz", vec![])], &[], &[]),
            &Limits::default(),
        );
        assert!(matches!(many, Err(SourceError::ManyModules(_))));
        let gz = read(
            &cm(&[("a.wasm.gz", vec![1, 2, 3])], &[], &[]),
            &Limits::default(),
        );
        assert!(
            gz.unwrap_err()
                .to_string()
                .starts_with("binaryData key a.wasm.gz: not valid gzip")
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
