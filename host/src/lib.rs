//! wasmop: a Kubernetes operator host whose reconcile logic runs in sandboxed WebAssembly
//! plugins.
//!
//! Data flows one way through the modules:
//! ConfigMap → [`plugin`] (bytes → compiled component → registry) → [`watch`] and
//! [`controller`] (shared watches → queue → gather inputs) → [`sandbox`] (call) →
//! [`validate`] → [`apply`] (server-side apply → prune) → [`status`].
//!
//! Shared below every stage: [`config`] (every default), [`client`] (timeouts and the
//! leader's write fence), [`shard`] (sharding across replicas: hashes, ranges, the Leases that
//! hold them), [`kinds`], [`watch`], [`telemetry`], [`text`], [`memory`], [`disk`] (the cache directory's files). Start a host with [`Host::new`] and [`Host::run`]; `docs/architecture.md` has
//! the module map. The binary `wasmop` is a thin shell over this library; see [`cli`] for its
//! commands.

pub mod apply;
pub mod cli;
pub mod client;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod disk;
#[cfg(test)]
mod fixtures;
pub mod gather;
mod host;
pub mod kinds;
pub mod memory;
pub mod plugin;
pub mod sandbox;
pub mod shard;
pub mod status;
pub mod telemetry;
pub mod text;
pub mod watch;

pub use host::{Host, HostConfig, LeaderElection};
pub use shard::keeper::Sharding;
/// The plugin contract: wire types, the manifest, and the output rules ([`validate`]).
pub use wasmop_contract as contract;
pub use wasmop_contract::validate;
