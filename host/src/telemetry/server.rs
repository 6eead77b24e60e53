//! The host's HTTP endpoints: `/healthz` (the process serves), `/readyz` (plugins loaded and
//! caches synced, or standing by for leadership) and `/metrics` (Prometheus text format).

use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

/// Serves the probes (and metrics, when `metrics` is the same address) until the process
/// exits. `ready` says whether `/readyz` answers 200.
pub async fn serve(
    probes: SocketAddr,
    metrics: SocketAddr,
    ready: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let probe_routes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
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
    if probes == metrics {
        return listen(probes, probe_routes.merge(metric_routes)).await;
    }
    tokio::try_join!(listen(probes, probe_routes), listen(metrics, metric_routes))?;
    Ok(())
}

async fn listen(addr: SocketAddr, routes: Router) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let addr = listener.local_addr().unwrap_or(addr);
    tracing::info!(%addr, "serving HTTP");
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
