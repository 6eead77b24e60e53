//! What the host tells the people who run it: Kubernetes Events ([`events`]), Prometheus
//! metrics ([`metrics`]) and the `/healthz`, `/readyz` and `/metrics` endpoints ([`server`]).

pub mod events;
pub mod metrics;
pub mod server;

pub use metrics::metrics;
