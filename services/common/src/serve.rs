//! Serving an axum router until SIGTERM or Ctrl-C, and the liveness endpoint.

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;

/// Binds `addr` (port 0 picks a free one) and reports the bound address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(event = "listening", addr = %listener.local_addr()?);
    Ok(listener)
}

/// Serves until SIGTERM/SIGINT, then lets in-flight requests finish.
pub async fn run(listener: TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    tracing::info!(event = "stopped");
    Ok(())
}

pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!(event = "shutdown_requested");
}

/// `/healthz`: the process is up and serving.
pub async fn healthz() -> &'static str {
    "ok"
}
