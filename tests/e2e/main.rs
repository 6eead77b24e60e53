//! End-to-end tests: the `wasmop` binary as a real process against the local control plane
//! (`tests/testenv`), with plugins loaded from ConfigMaps.
//!
//! Each test has its own namespace and its own host, restricted to that namespace with
//! `--watch-namespace`, so the tests run side by side on one plane. Only `deploy` also uses
//! `wasmop-system`, where `kubectl apply -k deploy/` installs the host.

mod artifacts;
mod crds;
mod deploy;
mod failures;
mod finalizers;
mod hostile;
mod identity;
mod image;
mod in_process;
mod leader;
mod memcached;
mod quiet;
mod reads;
mod registry;
mod rollout;
mod scripts;
mod sources;
mod swap;
