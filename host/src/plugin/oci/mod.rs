//! Plugins kept in an OCI registry: a reference parsed and checked ([`Reference`]), a module
//! pulled by digest and pushed ([`OciClient`]), every answer bounded and hashed, its cosign
//! signature checked against the admin's [`Policy`], and fetched for a plugin ConfigMap that
//! names one ([`Fetcher`]; see [`super::source`]) and kept on disk by digest ([`ModuleCache`]).
//!
//! The layout is the CNCF wasm artifact's: an image manifest whose config is
//! `application/vnd.wasm.config.v0+json` and whose one layer is `application/wasm`. On pull,
//! Kubewarden's media types are taken too, so policies' tooling can publish plugins. A script
//! plugin is the same artifact with its script as the layer, of a media type naming its
//! language ([`STARLARK_LAYER_MEDIA_TYPE`]).
//!
//! ```
//! use wasmop::plugin::oci::Reference;
//!
//! let r: Reference = "oci://registry.example:5000/team/memcached:0.2.0".parse().unwrap();
//! assert_eq!(r.repository, "team/memcached");
//! assert_eq!(r.manifest_ref(), "0.2.0");
//! assert!("oci://registry.example/Team/x".parse::<Reference>().is_err());
//! ```

mod cache;
mod client;
mod fetch;
mod reference;
mod signature;

use std::time::Duration;

use crate::sandbox::Language;

pub use cache::{Entry, ModuleCache, access};
pub use client::{Credentials, Descriptor, Limits, Manifest, OciClient, Pulled};
pub use fetch::{FetchError, Fetcher, Found, PULL_SECRET_ANNOTATION, Remote};
pub use reference::{Digest, Reference, SCHEME};
pub use signature::{
    PAYLOAD_MEDIA_TYPE, Policy, PublicKey, Requirement, Rule, SIGNATURE_ANNOTATION, SignatureError,
    SigningKey, Unmatched, payload, signature_tag,
};

/// Manifest media types: what is pushed first, then what else is taken.
pub const MANIFEST_MEDIA_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// Config media types: the CNCF wasm config (pushed), then Kubewarden's.
pub const CONFIG_MEDIA_TYPES: &[&str] = &[
    "application/vnd.wasm.config.v0+json",
    "application/vnd.wasm.config.v1+json",
];
/// The config of an ordinary OCI image (a signature manifest's, the host's own image's).
pub const IMAGE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// Module layer media types: the CNCF wasm layer (pushed), then Kubewarden's.
pub const LAYER_MEDIA_TYPES: &[&str] = &[
    "application/wasm",
    "application/vnd.wasm.content.layer.v1+wasm",
];
/// The layer media type of a Starlark script plugin (a ConfigMap names one under a key ending
/// in `.star.oci`).
pub const STARLARK_LAYER_MEDIA_TYPE: &str = "application/vnd.wasmop.script.starlark";
/// The largest script a registry may hold for a plugin: what a ConfigMap could.
pub const SCRIPT_MAX_BYTES: u64 = 1 << 20;

/// What a plugin layer of `media_type` holds: `Some(None)` a module, `Some(Some(language))` a
/// script; `None` when it is no plugin's.
pub fn layer_language(media_type: &str) -> Option<Option<Language>> {
    if LAYER_MEDIA_TYPES.contains(&media_type) {
        Some(None)
    } else if media_type == STARLARK_LAYER_MEDIA_TYPE {
        Some(Some(Language::Starlark))
    } else {
        None
    }
}

/// The layer media type a plugin in `language` (a module for `None`) is pushed as.
pub fn layer_media_type(language: Option<Language>) -> &'static str {
    match language {
        None => LAYER_MEDIA_TYPES[0],
        Some(Language::Starlark) => STARLARK_LAYER_MEDIA_TYPE,
    }
}

/// What a plugin of `language` is called in messages.
pub fn plugin_kind(language: Option<Language>) -> &'static str {
    match language {
        None => "a WebAssembly module",
        Some(Language::Starlark) => "a Starlark script",
    }
}

/// Why a registry exchange failed, naming the URL or reference it was about.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The connection failed.
    #[error("{url}: {source}")]
    Http {
        /// What was asked.
        url: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No answer in time.
    #[error("{url}: no answer within {after:?}")]
    Timeout {
        /// What was asked.
        url: String,
        /// The limit.
        after: Duration,
    },
    /// An answer other than the one the protocol wants.
    #[error("{url}: HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status {
        /// What was asked.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// Something larger than its limit.
    #[error("{what} is larger than the limit of {limit} bytes{}", size.map(|s| format!(" ({s} bytes)")).unwrap_or_default())]
    TooLarge {
        /// What it was.
        what: String,
        /// The limit.
        limit: u64,
        /// Its size, when declared.
        size: Option<u64>,
    },
    /// Content that does not hash to the digest it was asked by.
    #[error("{what}: digest {got}, expected {expected}")]
    DigestMismatch {
        /// What it was.
        what: String,
        /// The digest asked for.
        expected: String,
        /// The digest of what came.
        got: String,
    },
    /// A manifest that is not a plugin's.
    #[error("{reference}: {reason}")]
    Manifest {
        /// The reference.
        reference: String,
        /// What is wrong.
        reason: String,
    },
    /// A redirect out of the registry's origin.
    #[error("{from}: redirected to {to}, outside the registry")]
    Redirect {
        /// What was asked.
        from: String,
        /// Where the registry sent it.
        to: String,
    },
    /// The registry wants credentials that were not given or were refused.
    #[error("{url}: {reason}")]
    Auth {
        /// What was asked.
        url: String,
        /// Why.
        reason: String,
    },
    /// An answer that breaks the distribution protocol.
    #[error("{url}: {reason}")]
    Protocol {
        /// What was asked.
        url: String,
        /// What is wrong.
        reason: String,
    },
}
