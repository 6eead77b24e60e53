//! The host's HTTP endpoints: `/healthz` (the host can make progress: see [`super::health`]),
//! `/readyz` (plugins loaded and caches synced, or standing by for leadership) and `/metrics`
//! (Prometheus text format).

use anyhow::Context;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::health::Health;

/// Serves the probes on `probes`, and metrics on `metrics` (or, when that is `None`, on
/// `probes` too) until the process exits. `ready` says whether `/readyz` answers 200, `health`
/// whether `/healthz` does.
pub async fn serve(
    probes: TcpListener,
    metrics: Option<TcpListener>,
    ready: watch::Receiver<bool>,
    health: Health,
) -> anyhow::Result<()> {
    let probe_routes = Router::new()
        .route(
            "/healthz",
            get(move || {
                let checked = health.check();
                async move {
                    match checked {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(problems) => (StatusCode::INTERNAL_SERVER_ERROR, problems),
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = *ready.borrow();
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "plugins loading or caches syncing",
                        )
                    }
                }
            }),
        );
    let metric_routes = Router::new().route("/metrics", get(metrics_text));
    match metrics {
        None => listen(probes, probe_routes.merge(metric_routes)).await,
        Some(metrics) => {
            tokio::try_join!(listen(probes, probe_routes), listen(metrics, metric_routes))?;
            Ok(())
        }
    }
}

async fn listen(listener: TcpListener, routes: Router) -> anyhow::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving HTTP");
    }
    axum::serve(listener, routes).await.context("HTTP server")
}

async fn metrics_text() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        super::metrics().encode(),
    )
}
