//! The server kit. [`main`] is the whole life of every service binary, one shape for all: logging,
//! configuration (invalid: exit 2, nothing started), the SIGTERM/SIGINT handlers registered before
//! start-up is announced, start, wait, graceful drain, and the [`exit`] codes. Below it: serving an
//! axum router until a signal ([`run_until`]) or in the background of this process with a shutdown
//! handle ([`spawn_background`]), in plain HTTP or over TLS ([`run_tls_until`],
//! [`spawn_background_tls`]: the TLS accept loop, [`TlsListener`]); the liveness endpoint.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::serve::{Listener, ListenerExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::tls::ServerTls;

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

/// Serves `app` over TLS (see [`TlsListener`]) until `shutdown` completes, then lets in-flight
/// requests finish, as [`run_until`] does.
pub async fn run_tls_until(
    listener: TcpListener,
    app: Router,
    tls: &ServerTls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    axum::serve(TlsListener::new(listener, tls)?, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    tracing::info!(event = "stopped");
    Ok(())
}

/// How long a client has to finish the TLS handshake; a connection that has not by then is closed.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const HANDSHAKEN_QUEUE: usize = 64;

/// A listener that hands the server TLS connections: TCP is accepted by a task of its own, and each
/// handshake runs in a task of its own with a deadline ([`TLS_HANDSHAKE_TIMEOUT`]), so a client that
/// connects and says nothing (or speaks plain HTTP) never holds up the others. Handshakes that fail
/// are logged (`tls_handshake_failed`, DEBUG: scanners and plaintext clients are not the server's
/// fault) and dropped. Dropping the listener (the server's graceful shutdown does) stops accepting.
#[derive(Debug)]
pub struct TlsListener {
    addr: SocketAddr,
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `listener`; must be called inside a Tokio runtime.
    pub fn new(listener: TcpListener, tls: &ServerTls) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let (tx, handshaken) = mpsc::channel(HANDSHAKEN_QUEUE);
        let acceptor = tls.acceptor();
        let accepting = tokio::spawn(async move {
            let mut listener = listener;
            loop {
                let (tcp, peer) = tokio::select! {
                    accepted = Listener::accept(&mut listener) => accepted,
                    // The server dropped its end: it is shutting down.
                    () = tx.closed() => return,
                };
                // As in run_until: a response must not wait for the peer's delayed ACK.
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(event = "nodelay_failed", error = %e);
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    let stream = tokio::select! {
                        done = handshake => done,
                        () = tx.closed() => return,
                    };
                    match stream {
                        Ok(Ok(stream)) => {
                            // Fails only when the server is gone; the connection is then dropped.
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(event = "tls_handshake_failed", peer = %peer, error = %e);
                        }
                        Err(_) => tracing::debug!(
                            event = "tls_handshake_failed",
                            peer = %peer,
                            error = "the handshake did not finish in time"
                        ),
                    }
                });
            }
        });
        Ok(Self {
            addr,
            handshaken,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended, which it does only once this listener is dropped (or the
            // runtime shuts down): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// Starts serving `app` on `listener` in a task of its own; it stops when `shutdown` is cancelled.
/// Passing the token in (rather than making one) lets a service hand clones to its own tasks first,
/// so they end at shutdown too. Must be called inside a Tokio runtime.
pub fn spawn_background(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> io::Result<Background> {
    spawn_background_tls(listener, app, None, shutdown)
}

/// [`spawn_background`], over TLS when `tls` is given (HTTPS only on this listener: a plaintext
/// request fails its handshake).
pub fn spawn_background_tls(
    listener: TcpListener,
    app: Router,
    tls: Option<ServerTls>,
    shutdown: CancellationToken,
) -> io::Result<Background> {
    let addr = listener.local_addr()?;
    let until = shutdown.clone().cancelled_owned();
    let (scheme, task) = match tls {
        None => ("http", tokio::spawn(run_until(listener, app, until))),
        Some(tls) => (
            "https",
            tokio::spawn(async move { run_tls_until(listener, app, &tls, until).await }),
        ),
    };
    Ok(Background {
        addr,
        scheme,
        shutdown,
        task,
    })
}

/// A server running in the background of this process (tests, the demo, binaries that also wait
/// for other things). Dropping it stops it without waiting; [`shutdown`](Self::shutdown) stops it
/// and waits for in-flight requests.
#[derive(Debug)]
pub struct Background {
    addr: SocketAddr,
    /// `http` or `https`.
    scheme: &'static str,
    shutdown: CancellationToken,
    task: JoinHandle<io::Result<()>>,
}

impl Background {
    /// The bound address (the real port when port 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>` (`https://` over TLS), without a trailing slash.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
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
