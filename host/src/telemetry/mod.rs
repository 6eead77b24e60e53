//! What the host tells the people who run it: Kubernetes Events ([`events`]), Prometheus
//! metrics ([`metrics`]), what the host knows of its own health ([`health`]) and the
//! `/healthz`, `/readyz` and `/metrics` endpoints ([`server`]).

pub mod events;
pub mod health;
pub mod metrics;
pub mod server;

pub use metrics::metrics;
