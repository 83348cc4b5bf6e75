//! The server kit. [`main`] is the whole life of every service binary, one shape for all: logging,
//! configuration (invalid: exit 2, nothing started), the SIGTERM/SIGINT handlers registered before
//! start-up is announced, start, wait, graceful drain, and the [`exit`] codes. Below it: serving an
//! axum router until a signal ([`run_until`]) or in the background of this process with a shutdown
//! handle ([`spawn_background`]); the liveness endpoint.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The exit codes of every dlock binary.
pub mod exit {
    /// Done, or stopped by SIGTERM/SIGINT after a graceful drain.
    pub const OK: u8 = 0;
    /// Started (or tried to) and failed: the database URL, the port, the drain, or — for the
    /// executor — payouts that could not be driven.
    pub const FAILURE: u8 = 1;
    /// Bad configuration: nothing was started. (clap's own usage errors exit 2 as well.)
    pub const CONFIG: u8 = 2;
}

/// A server a service's `spawn` returned: what [`main`] needs to know of it.
pub trait Server: Send {
    /// Why the drain failed.
    type StopError: Display;
    /// Stops accepting, lets in-flight requests finish, closes what the server opened.
    fn stop(self) -> impl Future<Output = Result<(), Self::StopError>> + Send;
}

/// Whether a start-up error means bad configuration (exit 2) or a failure to start (exit 1).
pub trait StartFailure: Display {
    fn is_config(&self) -> bool;
}

/// The whole life of a service binary: `config` (already parsed by clap, checked here), then
/// `spawn`, serving until SIGTERM/SIGINT, then the drain. Logs `config_invalid`, `start_failed`,
/// `shutdown_requested`, `serve_failed` as JSON events (the service's own events come from `spawn`).
pub async fn main<C, E, S, SE, F, Fut>(service: &'static str, config: Result<C, E>, spawn: F) -> ExitCode
where
    E: Display,
    S: Server,
    SE: StartFailure,
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = Result<S, SE>>,
{
    crate::telemetry::init(service);
    let config = match config {
        Ok(c) => c,
        Err(e) => return config_invalid(service, &e),
    };
    // Before the server announces itself (see shutdown_signal).
    let signal = shutdown_signal();
    let server = match spawn(config).await {
        Ok(s) => s,
        Err(e) if e.is_config() => return config_invalid(service, &e),
        Err(e) => {
            tracing::error!(event = "start_failed", error = %e, "{service} cannot start");
            eprintln!("{service}: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    signal.await;
    // The server logs `stopped` itself once in-flight requests are done.
    match server.stop().await {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => {
            tracing::error!(event = "serve_failed", error = %e);
            ExitCode::from(exit::FAILURE)
        }
    }
}

fn config_invalid(service: &str, e: &dyn Display) -> ExitCode {
    tracing::error!(event = "config_invalid", error = %e, "{service} cannot start");
    eprintln!("{service}: {e}");
    ExitCode::from(exit::CONFIG)
}

/// Binds `addr` (port 0 picks a free one) and reports the bound address.
pub async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(event = "listening", addr = %listener.local_addr()?);
    Ok(listener)
}

/// Serves until `shutdown` completes, then lets in-flight requests finish.
pub async fn run_until(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    // TCP_NODELAY on every accepted connection, as the clients (reqwest), sqlx and tonic set it on
    // theirs: a response must not wait for the peer's delayed ACK of the previous segment.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(event = "nodelay_failed", error = %e);
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    tracing::info!(event = "stopped");
    Ok(())
}

/// Starts serving `app` on `listener` in a task of its own; it stops when `shutdown` is cancelled.
/// Passing the token in (rather than making one) lets a service hand clones to its own tasks first,
/// so they end at shutdown too. Must be called inside a Tokio runtime.
pub fn spawn_background(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> io::Result<Background> {
    let addr = listener.local_addr()?;
    let task = tokio::spawn(run_until(listener, app, shutdown.clone().cancelled_owned()));
    Ok(Background { addr, shutdown, task })
}

/// A server running in the background of this process (tests, the demo, binaries that also wait
/// for other things). Dropping it stops it without waiting; [`shutdown`](Self::shutdown) stops it
/// and waits for in-flight requests.
#[derive(Debug)]
pub struct Background {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<io::Result<()>>,
}

impl Background {
    /// The bound address (the real port when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets in-flight requests finish, and reports how serving ended.
    pub async fn shutdown(mut self) -> io::Result<()> {
        self.shutdown.cancel();
        (&mut self.task).await.map_err(io::Error::other)?
    }
}

impl Server for Background {
    type StopError = io::Error;
    async fn stop(self) -> io::Result<()> {
        self.shutdown().await
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Resolves on SIGTERM or SIGINT (a pod's stop, or Ctrl-C).
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    // The handlers are registered here, when this is called, not when the future is first polled:
    // a SIGTERM that arrives right after start-up is announced must start a graceful shutdown, not
    // kill the process with the default action. Callers take the future before they start serving.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! { _ = wait(int) => {}, _ = wait(term) => {} }
        tracing::info!(event = "shutdown_requested");
    }
}

/// `/healthz`: the process is up and serving.
pub async fn healthz() -> &'static str {
    "ok"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_until_shut_down_and_stops_on_drop() {
        let app = Router::new().route("/healthz", axum::routing::get(healthz));
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let token = CancellationToken::new();
        let server = spawn_background(listener, app.clone(), token.clone()).unwrap();
        assert_eq!(server.url(), format!("http://{}", server.addr()));
        assert_ne!(server.addr().port(), 0);

        let mut conn = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut conn,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut conn, &mut answer)
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");

        assert!(!token.is_cancelled());
        server.shutdown().await.unwrap();
        assert!(token.is_cancelled(), "shutdown cancels the token it was given");

        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let token = CancellationToken::new();
        drop(spawn_background(listener, app, token.clone()).unwrap());
        assert!(token.is_cancelled(), "dropping stops the server");
    }
}
