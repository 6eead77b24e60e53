//! A real, local Kubernetes control plane for wasmop's tests.
//!
//! `testenv` runs etcd, kube-apiserver, kube-controller-manager (all default controllers,
//! so garbage collection, Deployments and ReplicaSets are real), kube-scheduler and
//! [kwok](https://kwok.sigs.k8s.io/), which fakes a node and turns the pods bound to it
//! Running and Ready without running containers. Each component is its own process on
//! 127.0.0.1 with free ports, so planes run side by side. Kubernetes is
//! [`KUBERNETES_VERSION`], kwok [`KWOK_VERSION`].
//!
//! # Where to start
//!
//! Most tests use the plane shared by their test binary and a namespace of their own:
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::PostParams;
//!
//! #[tokio::test]
//! async fn stores_settings() -> anyhow::Result<()> {
//!     let client = testenv::client().await?; // starts the shared plane on first use
//!     let ns = testenv::namespace(&client, "settings").await?;
//!     let mut cm = ConfigMap::default();
//!     cm.metadata.name = Some("settings".into());
//!     ns.api::<ConfigMap>().create(&PostParams::default(), &cm).await?;
//!     Ok(())
//! }
//! ```
//!
//! - [`shared`] / [`client`]: the plane of this test binary (or, with
//!   `WASMOP_TEST_USE_EXISTING=1`, the cluster at `KUBECONFIG`).
//! - [`TestEnv::start`]: a private plane, for tests that break or measure a cluster.
//! - [`namespace`]: a uniquely named namespace per test.
//! - [`wait_for`], [`wait_until`]: polling with timeouts that say what was awaited and seen.
//! - [`metrics`]: the apiserver's request counters.
//! - Faults, on a private plane: [`TestEnv::kill`], [`TestEnv::stop_part`] and
//!   [`TestEnv::start_part`] take one [`Part`] (etcd, the apiserver, …) down and bring it
//!   back on the same ports; [`TestEnv::compact`] compacts etcd, so old resource versions
//!   get `410 Gone`; a [`Proxy`] in front of the apiserver ([`TestEnv::client_via`],
//!   [`TestEnv::kubeconfig_via`]) black-holes, heals or cuts the connections through it.
//!
//! From a shell, `cargo run -p testenv -- up` starts a plane in the foreground and prints
//! `KUBECONFIG=<path>`; `cargo run -p testenv -- build` only builds the binaries.
//!
//! # Binaries and requirements
//!
//! The components come from one Go binary built from `tests/testenv/go` plus kwok, both
//! built on first use (about 10 minutes on 2 cores; Go 1.26 must be on `PATH`) and cached
//! outside the repository; see [`binaries`]. Linux only: children are tied to the test
//! process with `PR_SET_PDEATHSIG`, so no component outlives a test run, even a killed one.

mod apply;
pub mod binaries;
mod certs;
mod crd;
mod error;
mod http1;
pub mod metrics;
mod namespace;
mod plane;
mod ports;
mod process;
mod proxy;
mod shared;
mod wait;

pub use apply::apply_objects;
pub use binaries::{KUBERNETES_VERSION, KWOK_VERSION};
pub use crd::apply_crd;
pub use error::{Error, Result};
pub use namespace::{TEST_NAMESPACE_LABEL, TestNamespace, namespace};
pub use plane::{NODE_NAME, Part, TestEnv};
pub use process::spawn as spawn_tied;
pub use proxy::Proxy;
pub use shared::{SharedCluster, USE_EXISTING_ENV, client, shared};
pub use wait::{Timeout, wait_for, wait_until};
