//! A plugin module as the ConfigMap the host loads it from: the inverse of
//! [`super::source::read`]. It is stored gzipped (`<name>.wasm.gz`) when that is smaller, raw
//! (`<name>.wasm`) otherwise, and refused when it cannot fit a ConfigMap even so. A script
//! ([`package_script`]) is stored as text under its own file name, as `kubectl create
//! configmap --from-file` stores it.
//!
//! The API server limits a ConfigMap to 1 MiB ([`CONFIGMAP_LIMIT`]): the sum of its `data` and
//! `binaryData` values, counted as raw bytes. `binaryData` travels base64-encoded in JSON and
//! YAML, but neither validation nor etcd (which stores protobuf) counts that overhead: a
//! ConfigMap holding exactly 1 MiB of binary data is accepted, one byte more is not.

use std::collections::BTreeMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use wasmop_contract::names::is_dns1123_subdomain;

use super::PLUGIN_LABEL;
use super::oci::{PULL_SECRET_ANNOTATION, Reference};
use super::source::{OCI_SUFFIX, SETTINGS_KEY};
use crate::sandbox::Language;

/// Largest total of a ConfigMap's values the API server accepts.
pub const CONFIGMAP_LIMIT: usize = 1 << 20;

/// Why a module cannot be packaged.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// Not a valid ConfigMap name.
    #[error("{0:?} is not a valid ConfigMap name (lowercase letters, digits, '-' and '.')")]
    Name(String),
    /// A registry reference without a digest: what runs would follow the tag.
    #[error("{0}: not pinned by digest")]
    Unpinned(String),
    /// Too large even gzipped.
    #[error(
        "the module does not fit a ConfigMap: {raw} bytes, {gzipped} gzipped{settings}, and a \
         ConfigMap holds at most {CONFIGMAP_LIMIT} bytes; make it smaller (build with \
         opt-level \"s\", strip debug info, drop dependencies) or keep it in a registry \
         (`wasmop push`, then `wasmop package oci://…`)"
    )]
    TooLarge {
        /// The module's size.
        raw: usize,
        /// Its size gzipped.
        gzipped: usize,
        /// `", plus N bytes of settings"`, or empty.
        settings: String,
    },
    /// A script too large for a ConfigMap.
    #[error(
        "the script does not fit a ConfigMap: {size} bytes plus {settings} bytes of settings, \
         and a ConfigMap holds at most {CONFIGMAP_LIMIT} bytes"
    )]
    ScriptTooLarge {
        /// The script's size.
        size: usize,
        /// The settings' size.
        settings: usize,
    },
}

/// A packaged plugin.
#[derive(Debug)]
pub struct Packaged {
    /// The ConfigMap.
    pub configmap: ConfigMap,
    /// The module key: `<name>.wasm` or `<name>.wasm.gz`.
    pub key: String,
    /// Bytes stored under [`Self::key`].
    pub stored: usize,
}

/// Builds the ConfigMap named `name` in `namespace` for `wasm`, gzipped when that is smaller.
pub fn package(
    wasm: &[u8],
    name: &str,
    namespace: &str,
    settings: Option<String>,
) -> Result<Packaged, PackageError> {
    if !is_dns1123_subdomain(name) {
        return Err(PackageError::Name(name.to_string()));
    }
    let gzipped = gzip(wasm);
    let (key, bytes) = if gzipped.len() < wasm.len() {
        (format!("{name}.wasm.gz"), gzipped.clone())
    } else {
        (format!("{name}.wasm"), wasm.to_vec())
    };
    let settings_len = settings.as_ref().map_or(0, String::len);
    if bytes.len() + settings_len > CONFIGMAP_LIMIT {
        return Err(PackageError::TooLarge {
            raw: wasm.len(),
            gzipped: gzipped.len(),
            settings: if settings_len > 0 {
                format!(", plus {settings_len} bytes of settings")
            } else {
                String::new()
            },
        });
    }
    let stored = bytes.len();
    let mut configmap = labelled(name, namespace, settings);
    configmap.binary_data = Some(BTreeMap::from([(key.clone(), ByteString(bytes))]));
    Ok(Packaged {
        configmap,
        key,
        stored,
    })
}

/// Builds the ConfigMap named `name` in `namespace` for the script `source`, held under
/// `file` (its file name, whose extension names its language) as text.
pub fn package_script(
    file: &str,
    source: &str,
    name: &str,
    namespace: &str,
    settings: Option<String>,
) -> Result<Packaged, PackageError> {
    if !is_dns1123_subdomain(name) {
        return Err(PackageError::Name(name.to_string()));
    }
    let settings_len = settings.as_ref().map_or(0, String::len);
    if source.len() + settings_len > CONFIGMAP_LIMIT {
        return Err(PackageError::ScriptTooLarge {
            size: source.len(),
            settings: settings_len,
        });
    }
    let mut configmap = labelled(name, namespace, settings);
    configmap
        .data
        .get_or_insert_with(BTreeMap::new)
        .insert(file.to_owned(), source.to_owned());
    Ok(Packaged {
        configmap,
        key: file.to_owned(),
        stored: source.len(),
    })
}

/// Builds the ConfigMap named `name` in `namespace` that names the registry plugin
/// `reference`, which must be pinned by digest, under `plugin.oci` (a module) or
/// `plugin.star.oci` (a script in `language`), with `pull_secret` (a Secret in the host's
/// namespace) as its pull Secret when given.
pub fn package_reference(
    reference: &Reference,
    language: Option<Language>,
    name: &str,
    namespace: &str,
    settings: Option<String>,
    pull_secret: Option<&str>,
) -> Result<Packaged, PackageError> {
    if !is_dns1123_subdomain(name) {
        return Err(PackageError::Name(name.to_string()));
    }
    if reference.digest.is_none() {
        return Err(PackageError::Unpinned(reference.to_string()));
    }
    let key = match language {
        Some(language) => format!("plugin.{}{OCI_SUFFIX}", language.extension()),
        None => format!("plugin{OCI_SUFFIX}"),
    };
    let text = reference.to_string();
    let mut configmap = labelled(name, namespace, settings);
    configmap
        .data
        .get_or_insert_with(BTreeMap::new)
        .insert(key.clone(), text.clone());
    if let Some(secret) = pull_secret {
        configmap.metadata.annotations = Some(BTreeMap::from([(
            PULL_SECRET_ANNOTATION.to_string(),
            secret.to_string(),
        )]));
    }
    Ok(Packaged {
        configmap,
        key,
        stored: text.len(),
    })
}

/// A plugin ConfigMap with its label and settings, and no module yet.
fn labelled(name: &str, namespace: &str, settings: Option<String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(PLUGIN_LABEL.to_string(), String::new())])),
            ..Default::default()
        },
        data: settings.map(|s| BTreeMap::from([(SETTINGS_KEY.to_string(), s)])),
        ..Default::default()
    }
}

/// `gzip -9`, deterministic (no timestamp, no file name), so a package is reproducible.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .expect("writing to memory does not fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::noise;
    use crate::plugin::source;

    #[test]
    fn a_registry_module_is_named_pinned_or_not_at_all() {
        let tag: Reference = "oci://reg.example/team/memcached:1".parse().unwrap();
        assert!(matches!(
            package_reference(&tag, None, "memcached", "ns", None, None),
            Err(PackageError::Unpinned(_))
        ));
        let pinned = tag.pinned(super::super::oci::Digest::of(b"manifest"));
        let p = package_reference(&pinned, None, "memcached", "ns", None, Some("pull")).unwrap();
        assert_eq!(p.key, "plugin.oci");
        assert_eq!(p.configmap.data.unwrap()["plugin.oci"], pinned.to_string());
        assert_eq!(
            p.configmap.metadata.annotations.unwrap()[PULL_SECRET_ANNOTATION],
            "pull"
        );
        // A script: its language in the key, read back as a registry reference of a script.
        let p =
            package_reference(&pinned, Some(Language::Starlark), "m", "ns", None, None).unwrap();
        assert_eq!(p.key, "plugin.star.oci");
        let src = source::read_stored(&p.configmap, &Default::default(), None).unwrap();
        assert_eq!(src.parts.language(), Some(Language::Starlark));
        assert_eq!(src.parts.file(), "plugin.star");
        assert_eq!(
            src.parts.reference("m").unwrap().unwrap().to_string(),
            pinned.to_string()
        );
    }

    #[test]
    fn a_script_is_stored_as_text_under_its_file_name_and_read_back() {
        let p = package_script("plugin.star", "x = 1\n", "demo", "ops", None).unwrap();
        assert_eq!((p.key.as_str(), p.stored), ("plugin.star", 6));
        assert!(p.configmap.binary_data.is_none());
        let src = source::read(&p.configmap, &Default::default()).unwrap();
        assert_eq!(src.wasm, b"x = 1\n");
        let huge = "#".repeat(CONFIGMAP_LIMIT + 1);
        let err = package_script("plugin.star", &huge, "demo", "ops", None).unwrap_err();
        assert!(matches!(err, PackageError::ScriptTooLarge { .. }), "{err}");
    }

    #[test]
    fn compressible_modules_are_gzipped_and_read_back() {
        let wasm = [b"\0asm".as_slice(), &[7u8; 50_000]].concat();
        let p = package(&wasm, "demo", "ops", Some("replicas: 2\n".into())).unwrap();
        assert_eq!(p.key, "demo.wasm.gz");
        assert!(p.stored < 1_000, "{}", p.stored);
        let cm = &p.configmap;
        assert_eq!(cm.metadata.namespace.as_deref(), Some("ops"));
        assert!(
            cm.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(PLUGIN_LABEL)
        );
        // The host reads back exactly the module and the settings.
        let source = source::read(cm, &crate::sandbox::Limits::default()).unwrap();
        assert_eq!(source.wasm, wasm);
        assert_eq!(source.settings["replicas"], 2);
    }

    #[test]
    fn incompressible_modules_stay_raw() {
        let wasm = noise(10_000);
        let p = package(&wasm, "demo", "wasmop-system", None).unwrap();
        assert_eq!(p.key, "demo.wasm");
        assert_eq!(p.stored, wasm.len());
        assert!(p.configmap.data.is_none());
        assert_eq!(
            source::read(&p.configmap, &crate::sandbox::Limits::default())
                .unwrap()
                .wasm,
            wasm
        );
    }

    #[test]
    fn the_limit_is_one_mebibyte_of_raw_values() {
        let fits = noise(CONFIGMAP_LIMIT - 100);
        package(&fits, "big", "x", None).unwrap();
        let err = package(&fits, "big", "x", Some("a".repeat(200)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("plus 200 bytes of settings"), "{err}");
        let err = package(&noise(CONFIGMAP_LIMIT + 1), "big", "x", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not fit a ConfigMap"), "{err}");
        assert!(
            err.contains(&format!("at most {CONFIGMAP_LIMIT} bytes")),
            "{err}"
        );
    }

    #[test]
    fn names_must_be_configmap_names() {
        let err = package(b"\0asm", "Not_Valid", "x", None).unwrap_err();
        assert!(matches!(err, PackageError::Name(_)));
    }
}
