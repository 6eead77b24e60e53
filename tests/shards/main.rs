//! Sharding across host replicas (`wasmop run --shards`): real `wasmop` processes against a
//! plane with the API server's sharded lists and watches (`ShardedListAndWatch`) and, for
//! the client-side fallback, against the shared plane without them.
//!
//! The replicas reconcile in every namespace, so this binary has planes of its own.

mod cluster;
mod failover;
mod filter;
mod finalizers;
mod rollout;
mod world;
