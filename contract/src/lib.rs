//! The plugin contract, one home for host and guest alike: the JSON that crosses the boundary
//! ([`wire`]), what a plugin declares about itself ([`Manifest`], [`KindRef`],
//! [`RelatedKind`], [`RelatedSelector`]), and the rules the host applies to a plugin's output
//! before anything reaches the API server ([`validate`]).
//!
//! The host (`wasmop`) and the guest SDK (`wasmop-guest`) both use this crate, so the SDK's
//! native test harness runs exactly the validation the host will. The WIT interface
//! (`guest-sdk/wit/plugin.wit`) carries the same records; each side converts at its edge.

pub mod hash;
pub mod manifest;
pub mod names;
pub mod validate;
pub mod wire;

pub use manifest::{KindRef, Manifest, ManifestError, RelatedKind, RelatedSelector};
pub use validate::{Target, Validated, ValidationError};

/// Whether objects of a kind live in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Objects live in a namespace.
    Namespaced,
    /// Objects are cluster-wide.
    Cluster,
}

impl Scope {
    /// The scope of a parent as an object shows it: namespaced when it has a namespace.
    pub fn of_object(obj: &serde_json::Value) -> Scope {
        match obj
            .pointer("/metadata/namespace")
            .and_then(serde_json::Value::as_str)
        {
            Some(ns) if !ns.is_empty() => Scope::Namespaced,
            _ => Scope::Cluster,
        }
    }
}
