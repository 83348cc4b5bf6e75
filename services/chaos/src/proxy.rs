//! The links of a campaign: one HTTP proxy on loopback between each executor and each service it
//! talks to (and between rail-proxy and the rail). A link does two things.
//!
//! - **It records.** Every request that is one of the operations of [`crate::history::F`] is written
//!   to the history as `invoke` before it is forwarded and as `ok` / `fail` / `info` when it ends,
//!   timed on the run's one monotonic clock. The code under test is unchanged: the record is what
//!   went over the wire.
//! - **It is the network's faults** (the partition nemesis): a link can pass, drop every request
//!   (`Blackhole`: nothing reaches the service, the caller hears nothing until it gives up), deliver
//!   requests but drop the answers (`DropAnswers`: one-way — the service acts, the caller never
//!   learns of it), reset every connection (`Reset`), or answer `503` without forwarding (`Unknown`:
//!   the rail's "don't know" on the rail link). Cutting an executor off from the lock service but
//!   not from the resources is setting its lock link and leaving the others; the other way round,
//!   the reverse.
//!
//! The proxy speaks HTTP/1.1 (hyper) to the caller and forwards with reqwest. A dropped or reset
//! exchange closes the caller's connection without an answer, which is what a dead link looks like.
//!
//! With [`LinkTls`] (the campaign's default) a link speaks HTTPS on both sides, as the services do:
//! it terminates the caller's TLS with a certificate of the run's CA for its loopback address (the
//! caller verifies it against that CA exactly as it would the real server) and forwards over HTTPS,
//! verifying the service against the run's CA alone. Its ALPN offers `http/1.1` only, so a caller
//! that could speak h2 still gets one exchange per connection at a time, and a dropped exchange
//! still closes the caller's connection (in h2 it would reset one stream): the faults mean what
//! they mean in plain HTTP. A caller that does not complete the handshake (plain HTTP, another CA)
//! has its connection closed without an answer.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use dlock_common::tls::TlsFiles;
use dlock_testkit::pg::tls::{ServerCert, client_builder_trusting};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value as Json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use uuid::Uuid;

use crate::history::{Event, F, Type, Value};

/// Where the history goes: one JSON line per event, in the order they happened on the run clock.
pub struct Recorder {
    start: Instant,
    next_op: AtomicU64,
    inner: Mutex<RecorderInner>,
    /// What the failover nemesis waits on: the highest token an `ok` acquire answered, and the
    /// `ok` posts, so far (signalled on every event).
    seen: Mutex<Seen>,
    changed: tokio::sync::Notify,
}

/// What the record has shown so far, for a nemesis that waits on the record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// The highest fencing token an `ok` acquire was answered.
    pub highest_grant: Option<i64>,
    /// `ok` acquires.
    pub grants: u64,
    /// `ok` posts that wrote (not idempotent answers).
    pub posts: u64,
}

struct RecorderInner {
    out: BufWriter<File>,
    index: u64,
    /// A copy kept in memory for the checker (histories of a run are a few hundred MB at most).
    events: Vec<Event>,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("create {}", path.display()))?;
        Ok(Self {
            start: Instant::now(),
            next_op: AtomicU64::new(0),
            inner: Mutex::new(RecorderInner {
                out: BufWriter::new(file),
                index: 0,
                events: Vec::new(),
            }),
            seen: Mutex::new(Seen::default()),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// What the record has shown so far.
    pub fn seen(&self) -> Seen {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the record shows what `cond` asks for, at most `limit`; what it shows then,
    /// and whether `cond` holds.
    pub async fn wait_for(&self, limit: Duration, cond: impl Fn(&Seen) -> bool) -> (Seen, bool) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            let seen = self.seen();
            if cond(&seen) {
                return (seen, true);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let seen = self.seen();
                return (seen, cond(&seen));
            }
        }
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn new_op(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends one event. The time is taken under the lock, so file order is time order.
    pub fn record(&self, process: &str, kind: Type, f: F, op: u64, value: Value) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let event = Event {
            index: inner.index,
            time_ns: self.now_ns(),
            process: process.to_owned(),
            kind,
            f,
            op,
            value,
        };
        inner.index += 1;
        if let Ok(line) = serde_json::to_string(&event) {
            // A history that cannot be written is a run that cannot be judged: say so loudly.
            if let Err(e) = writeln!(inner.out, "{line}") {
                tracing::error!(event = "history_write_failed", error = %e);
            }
        }
        let (ok_grant, ok_post) = (
            event.kind == Type::Ok && event.f == F::Acquire,
            event.kind == Type::Ok && event.f == F::Post && event.value.idempotent != Some(true),
        );
        let token = event.value.token;
        inner.events.push(event);
        drop(inner);
        if ok_grant || ok_post {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if ok_grant {
                seen.grants += 1;
                seen.highest_grant = seen.highest_grant.max(token);
            }
            if ok_post {
                seen.posts += 1;
            }
            drop(seen);
            self.changed.notify_waiters();
        }
    }

    /// Flushes the file and hands out the events recorded so far.
    pub fn finish(&self) -> Result<Vec<Event>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.out.flush().context("flush the history")?;
        Ok(inner.events.clone())
    }
}

/// What a link does to the traffic over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Requests are swallowed: never forwarded, never answered (until the link heals, when the
    /// held connections are closed).
    Blackhole,
    /// Requests are forwarded, answers are swallowed.
    DropAnswers,
    /// Connections are closed at once, nothing forwarded.
    Reset,
    /// `503` without forwarding: an answer that says nothing about what happened.
    Unknown,
    /// Every request held this long, then forwarded: a slow link that delivers late.
    Delay(Duration),
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Pass => "pass",
            Mode::Blackhole => "blackhole",
            Mode::DropAnswers => "drop-answers",
            Mode::Reset => "reset",
            Mode::Unknown => "unknown",
            Mode::Delay(_) => "delay",
        }
    }
}

/// Which service is behind a link (decides how requests are read as operations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Upstream {
    LockServer,
    PaymentResource,
    RailProxy,
    /// rail-proxy → rail-stub: not recorded (the rail's own record is its ground truth).
    Rail,
}

/// Requests in flight through links, per operation: the kill nemesis waits for a write to be in
/// flight before it kills the process serving it ("mid-posting").
#[derive(Debug, Default)]
pub struct InFlight {
    counts: Mutex<HashMap<(Upstream, F), u64>>,
    changed: tokio::sync::Notify,
}

impl InFlight {
    fn add(&self, up: Upstream, f: F, delta: i64) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry((up, f)).or_default();
        *n = n.saturating_add_signed(delta);
        drop(c);
        self.changed.notify_waiters();
    }

    pub fn count(&self, up: Upstream, f: F) -> u64 {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&(up, f)).copied().unwrap_or(0)
    }

    /// Waits until an `f` to `up` is in flight, at most `limit`; `true` if one is.
    pub async fn wait_for(&self, up: Upstream, f: F, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            if self.count(up, f) > 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count(up, f) > 0;
            }
        }
    }
}

/// HTTPS on both sides of a link: the certificate it serves its caller (of the run's CA, for
/// loopback) and the CA it verifies the service against, alone. Cheap to clone; one for every link
/// of a run.
#[derive(Clone)]
pub struct LinkTls {
    acceptor: TlsAcceptor,
    ca: PathBuf,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTls")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

/// How long a caller has to complete its TLS handshake: one that stalls (a paused executor) holds
/// only its own connection, and not for ever.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

impl LinkTls {
    /// Serves `cert` to callers (checked as a service checks its pair at start-up) and trusts `ca`
    /// alone for the services.
    pub fn new(cert: &ServerCert, ca: &Path) -> Result<Self> {
        let files = TlsFiles {
            cert: cert.cert.clone(),
            key: cert.key.clone(),
        };
        files.check().context("the links' certificate")?;
        let chain = CertificateDer::pem_file_iter(&files.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| anyhow!("read {}: {e}", files.cert.display()))?;
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| anyhow!("read {}: {e}", files.key.display()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(dlock_common::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("the links' TLS configuration")?;
        // HTTP/1.1 only: the link serves HTTP/1.1, and its faults close whole connections.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            ca: ca.to_path_buf(),
        })
    }

    /// The CA the services are verified against (and the link's own certificate is signed by).
    pub fn ca_file(&self) -> &Path {
        &self.ca
    }
}

/// One link: a loopback port that forwards to `upstream_port`.
pub struct Link {
    pub name: String,
    pub port: u16,
    https: bool,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Starts a link. `process` names the caller in the history (`executor-2`). With `tls` it
    /// serves HTTPS and reaches the service (which must serve HTTPS too) over HTTPS.
    pub async fn start(
        name: &str,
        process: &str,
        upstream: Upstream,
        upstream_port: u16,
        recorder: Option<Arc<Recorder>>,
        inflight: Arc<InFlight>,
        tls: Option<&LinkTls>,
    ) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind a link")?;
        let port = listener.local_addr()?.port();
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let http = match tls {
            Some(t) => client_builder_trusting(&t.ca)?,
            None => reqwest::Client::builder(),
        }
        // The caller's own timeout decides when it gives up; this only bounds a dead upstream.
        .timeout(Duration::from_secs(60))
        .pool_idle_timeout(Duration::from_secs(5))
        .build()?;
        let shared = Arc::new(LinkShared {
            process: process.to_owned(),
            upstream,
            scheme: if tls.is_some() { "https" } else { "http" },
            target: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            recorder,
            inflight,
            http,
            mode: mode_rx,
        });
        let acceptor = tls.map(|t| t.acceptor.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        None => serve(stream, shared).await,
                        Some(acceptor) => {
                            // A caller that does not speak TLS, or does not trust the run's CA,
                            // fails here and its connection is closed: nothing is forwarded.
                            if let Ok(Ok(tls)) =
                                tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await
                            {
                                serve(tls, shared).await;
                            }
                        }
                    }
                });
            }
        });
        Ok(Self {
            name: name.to_owned(),
            port,
            https: tls.is_some(),
            mode,
            task,
        })
    }

    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one caller's connection (plain or TLS) until it or the link closes it.
async fn serve<I>(io: I, shared: Arc<LinkShared>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { shared.handle(req).await }
    });
    // An error here is the connection we closed on purpose, or the caller's.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

struct LinkShared {
    process: String,
    upstream: Upstream,
    /// `https` when the link forwards over TLS.
    scheme: &'static str,
    target: SocketAddr,
    recorder: Option<Arc<Recorder>>,
    inflight: Arc<InFlight>,
    http: reqwest::Client,
    mode: watch::Receiver<Mode>,
}

/// A recorded operation in flight. If the exchange is dropped before it completes (the caller
/// hung up, so hyper dropped the request), the operation is completed as `info`: it may or may
/// not have reached the service.
struct Pending {
    rec: Arc<Recorder>,
    inflight: Arc<InFlight>,
    upstream: Upstream,
    process: String,
    f: F,
    op: u64,
    id: Option<String>,
    token: Option<i64>,
    done: bool,
}

impl Pending {
    fn complete(&mut self, kind: Type, value: Value) {
        if self.done {
            return;
        }
        self.done = true;
        self.inflight.add(self.upstream, self.f, -1);
        self.rec.record(&self.process, kind, self.f, self.op, value);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let value = Value {
            token: self.token,
            error: Some("the caller hung up before the answer".into()),
            ..Value::default()
        };
        self.complete(Type::Info, value);
    }
}

/// Why an exchange ended without an answer to the caller (closes its connection).
#[derive(Debug)]
struct Dropped(&'static str);

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Dropped {}

/// The longest a swallowed request or answer is held before its connection is closed.
const HOLD_LIMIT: Duration = Duration::from_secs(30);

impl LinkShared {
    async fn handle(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Dropped> {
        let (parts, body) = req.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return Err(Dropped("request body broken")),
        };
        let path = parts.uri.path().to_owned();
        let op = if self.upstream == Upstream::Rail {
            None
        } else {
            operation(self.upstream, parts.method.as_str(), &path)
        };
        let token_header = parts
            .headers
            .get(dlock_common::FENCING_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok());
        let request_json: Json = serde_json::from_slice(&body).unwrap_or(Json::Null);

        let mut pending = match (op, &self.recorder) {
            (Some((f, id)), Some(rec)) => {
                let n = rec.new_op();
                let value = invoke_value(f, id.as_deref(), token_header, &request_json);
                rec.record(&self.process, Type::Invoke, f, n, value);
                self.inflight.add(self.upstream, f, 1);
                Some(Pending {
                    rec: rec.clone(),
                    inflight: self.inflight.clone(),
                    upstream: self.upstream,
                    process: self.process.clone(),
                    f,
                    op: n,
                    id,
                    token: token_header,
                    done: false,
                })
            }
            _ => None,
        };
        let answer = self.exchange(&parts, body).await;
        if let Some(p) = pending.as_mut() {
            let (kind, value) = match &answer {
                Ok((status, bytes)) => {
                    let json: Json = serde_json::from_slice(bytes).unwrap_or(Json::Null);
                    completion(p.f, p.id.as_deref(), p.token, *status, &json)
                }
                Err(e) => (
                    Type::Info,
                    Value {
                        token: p.token,
                        error: Some(e.0.to_owned()),
                        ..Value::default()
                    },
                ),
            };
            p.complete(kind, value);
        }
        let (status, bytes) = answer?;
        let mut response = Response::new(Full::new(bytes));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }

    /// Forwards one request as the link's mode says; the answer, or why there is none.
    async fn exchange(
        &self,
        parts: &http::request::Parts,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), Dropped> {
        let mode = *self.mode.borrow();
        match mode {
            Mode::Pass | Mode::DropAnswers => {}
            // Delivered late, however the link is set by then: packets already on their way.
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Blackhole => {
                self.hold().await;
                return Err(Dropped("partition: request dropped"));
            }
            Mode::Reset => return Err(Dropped("partition: connection reset")),
            Mode::Unknown => {
                return Ok((
                    StatusCode::SERVICE_UNAVAILABLE,
                    Bytes::from_static(br#"{"code":"UNAVAILABLE","message":"injected: no answer"}"#),
                ));
            }
        }
        let path_and_query = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let url = format!("{}://{}{}", self.scheme, self.target, path_and_query);
        let mut request = self.http.request(parts.method.clone(), url).body(body);
        for (name, value) in &parts.headers {
            if name != hyper::header::HOST && name != hyper::header::CONNECTION {
                request = request.header(name, value);
            }
        }
        let result = async {
            let response = request.send().await.map_err(|e| {
                if e.is_connect() {
                    Dropped("service unreachable")
                } else if e.is_timeout() {
                    Dropped("service timed out")
                } else {
                    Dropped("connection to the service broke")
                }
            })?;
            let status = response.status();
            let bytes = response.bytes().await.map_err(|_| Dropped("answer broken off"))?;
            Ok::<_, Dropped>((status, bytes))
        }
        .await;
        // The mode is read again: a link cut while the request was out loses the answer.
        let mode = *self.mode.borrow();
        if mode == Mode::DropAnswers {
            self.hold().await;
            return Err(Dropped("partition: answer dropped"));
        }
        result
    }

    /// Holds a swallowed exchange until the link heals (or [`HOLD_LIMIT`]).
    async fn hold(&self) {
        let mut rx = self.mode.clone();
        let _ = tokio::time::timeout(HOLD_LIMIT, rx.wait_for(|m| *m == Mode::Pass)).await;
    }
}

/// The operation a request is, with the id in its path (session, key or payout).
fn operation(up: Upstream, method: &str, path: &str) -> Option<(F, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let f = match (up, method, segs.as_slice()) {
        (Upstream::LockServer, "POST", ["v1", "sessions"]) => (F::OpenSession, None),
        (Upstream::LockServer, "POST", ["v1", "sessions", id, "heartbeat"]) => (F::Heartbeat, Some(*id)),
        (Upstream::LockServer, "DELETE", ["v1", "sessions", id]) => (F::CloseSession, Some(*id)),
        (Upstream::LockServer, "POST", ["v1", "locks", key, "acquire"]) => (F::Acquire, Some(*key)),
        (Upstream::LockServer, "POST", ["v1", "locks", key, "renew"]) => (F::Renew, Some(*key)),
        (Upstream::LockServer, "POST", ["v1", "locks", key, "release"]) => (F::Release, Some(*key)),
        (Upstream::PaymentResource, "POST", ["v1", "payouts", id, "claim"]) => (F::Claim, Some(*id)),
        (Upstream::PaymentResource, "POST", ["v1", "payouts", id, "transition"]) => {
            (F::Transition, Some(*id))
        }
        (Upstream::PaymentResource, "POST", ["v1", "payouts", id, "post"]) => (F::Post, Some(*id)),
        (Upstream::RailProxy, "POST", ["v1", "submissions"]) => (F::Submit, None),
        (Upstream::RailProxy, "POST", ["v1", "submissions", id, "resolve"]) => (F::Resolve, Some(*id)),
        _ => return None,
    };
    Some((f.0, f.1.map(percent_decode)))
}

/// Lock keys travel percent-encoded in the path (`account%3A…`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(hi << 4 | lo);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn is_lock(f: F) -> bool {
    matches!(
        f,
        F::OpenSession | F::Heartbeat | F::CloseSession | F::Acquire | F::Renew | F::Release
    )
}

fn int(j: &Json, k: &str) -> Option<i64> {
    j.get(k).and_then(Json::as_i64)
}

fn text(j: &Json, k: &str) -> Option<String> {
    j.get(k).and_then(Json::as_str).map(str::to_owned)
}

fn uuid(j: &Json, k: &str) -> Option<Uuid> {
    j.get(k).and_then(Json::as_str).and_then(|s| s.parse().ok())
}

fn time(j: &Json, k: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    j.get(k).and_then(Json::as_str).and_then(|s| s.parse().ok())
}

/// What an invoke says: what was asked.
fn invoke_value(f: F, id: Option<&str>, token: Option<i64>, body: &Json) -> Value {
    let mut v = Value {
        token: token.or_else(|| int(body, "fencingToken")),
        ..Value::default()
    };
    match f {
        F::OpenSession => v.owner = text(body, "ownerId"),
        F::Heartbeat | F::CloseSession => v.session = id.and_then(|s| s.parse().ok()),
        F::Acquire | F::Renew | F::Release => {
            v.key = id.map(str::to_owned);
            v.session = uuid(body, "sessionId");
            v.owner = text(body, "ownerId");
        }
        F::Claim | F::Post | F::Resolve => {
            v.payout = id.and_then(|s| s.parse().ok());
            v.owner = text(body, "ownerId");
        }
        F::Transition => {
            v.payout = id.and_then(|s| s.parse().ok());
            v.from = text(body, "from");
            v.to = text(body, "to");
        }
        F::Submit => v.payout = uuid(body, "payoutId"),
        F::Create => {}
    }
    v
}

/// What a completion says, and which kind it is: 2xx `ok`, 4xx `fail` (refused: did not happen),
/// anything else `info` (may or may not have happened).
fn completion(f: F, id: Option<&str>, token: Option<i64>, status: StatusCode, body: &Json) -> (Type, Value) {
    let mut v = Value {
        status: Some(status.as_u16()),
        token,
        ..Value::default()
    };
    if is_lock(f) {
        v.key = id
            .map(str::to_owned)
            .filter(|_| matches!(f, F::Acquire | F::Renew | F::Release));
    } else {
        v.payout = id.and_then(|s| s.parse().ok());
    }
    let kind = if status.is_success() {
        Type::Ok
    } else if status.is_client_error() {
        Type::Fail
    } else {
        Type::Info
    };
    if kind != Type::Ok {
        v.code = text(body, "code");
        v.resource = text(body, "resourceType");
        v.highest = int(body, "highest");
        if kind == Type::Info {
            v.error = Some(format!("answered {status}"));
        }
        return (kind, v);
    }
    match f {
        F::OpenSession | F::Heartbeat => {
            v.session = uuid(body, "sessionId");
            v.expires_at = time(body, "expiresAt");
        }
        F::CloseSession => v.session = uuid(body, "sessionId"),
        F::Acquire => {
            v.token = int(body, "fencingToken");
            v.session = uuid(body, "sessionId");
            v.owner = text(body, "ownerId");
            v.acquired_at = time(body, "acquiredAt");
            v.expires_at = time(body, "expiresAt");
        }
        F::Renew => {
            v.token = int(body, "fencingToken").or(token);
            v.expires_at = time(body, "expiresAt");
        }
        F::Release => {
            v.token = int(body, "fencingToken").or(token);
            v.released = body.get("released").and_then(Json::as_bool);
            v.stale = body.get("stale").and_then(Json::as_bool);
        }
        F::Claim | F::Transition | F::Post => {
            let p = body.get("payout").unwrap_or(body);
            v.state = text(p, "state");
            v.account = uuid(p, "accountId");
            // An idempotent answer changed nothing (e.g. a post of an already-POSTED payout).
            v.idempotent = body.get("idempotent").and_then(Json::as_bool);
        }
        F::Submit | F::Resolve => {
            v.payout = uuid(body, "payoutId").or(v.payout);
            v.outcome = text(body, "outcome");
        }
        F::Create => {}
    }
    (kind, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_routes_as_operations() {
        assert_eq!(
            operation(Upstream::LockServer, "POST", "/v1/locks/account%3Aabc/acquire"),
            Some((F::Acquire, Some("account:abc".to_owned())))
        );
        assert_eq!(
            operation(Upstream::RailProxy, "POST", "/v1/submissions"),
            Some((F::Submit, None))
        );
        assert_eq!(operation(Upstream::PaymentResource, "GET", "/v1/payouts"), None);
        assert_eq!(operation(Upstream::LockServer, "GET", "/v1/locks/k"), None);
    }

    #[test]
    fn completions_are_typed_by_status() {
        let (k, v) = completion(
            F::Post,
            Some("00000000-0000-0000-0000-000000000001"),
            Some(7),
            StatusCode::CONFLICT,
            &serde_json::json!({"code": "FENCED_OUT", "resourceType": "account", "highest": 9}),
        );
        assert_eq!(k, Type::Fail);
        assert_eq!(v.code.as_deref(), Some("FENCED_OUT"));
        assert_eq!(v.resource.as_deref(), Some("account"));
        assert_eq!(v.highest, Some(9));
        let (k, _) = completion(F::Post, None, Some(7), StatusCode::BAD_GATEWAY, &Json::Null);
        assert_eq!(k, Type::Info);
    }
}
