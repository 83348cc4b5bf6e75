//! dlock's own services as real processes on loopback, for the demo and the cross-process proof
//! tests: spawn a binary from the build, wait until `/readyz` answers, pause it (SIGSTOP) and resume
//! it, stop it with SIGTERM when dropped.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_common::tls::{PLAINTEXT_ENV, TLS_CERT_FILE_ENV, TLS_KEY_FILE_ENV};

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error(
        "binary {0} not found next to this executable or in DLOCK_BIN_DIR; build the workspace (scripts/setup.sh)"
    )]
    NotBuilt(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{name} did not become ready at {url} within {secs}s; its log: {log}")]
    NotReady {
        name: String,
        url: String,
        secs: u64,
        log: String,
    },
    #[error("{name} exited before becoming ready ({status}); its log: {log}")]
    Exited {
        name: String,
        status: String,
        log: String,
    },
}

/// Finds a workspace binary: `DLOCK_BIN_DIR`, else the folder of the running executable, else its
/// parent (integration tests run from target/<profile>/deps).
pub fn binary(name: &str) -> Result<PathBuf, ProcError> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("DLOCK_BIN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        dirs.push(dir.to_path_buf());
        if let Some(parent) = dir.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| ProcError::NotBuilt(name.to_owned()))
}

/// A free loopback port (probed by binding port 0).
pub fn free_port() -> Result<u16, ProcError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|source| ProcError::Io {
        what: "probe port".into(),
        source,
    })?;
    l.local_addr().map(|a| a.port()).map_err(|source| ProcError::Io {
        what: "probe port".into(),
        source,
    })
}

/// One running service process.
#[derive(Debug)]
pub struct Service {
    pub name: String,
    pub port: u16,
    pub log: PathBuf,
    /// The CA its HTTPS certificate is signed by; `None`: it serves plain HTTP.
    pub ca: Option<PathBuf>,
    child: Child,
}

/// How to start one service.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub binary: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The port the service will listen on (also substituted for `{port}` in args).
    pub port: u16,
    /// Path polled for readiness; `None` means "do not wait".
    pub ready_path: Option<String>,
    /// Set by [`Spec::https`]: the CA that signs the certificate the service serves.
    pub ca: Option<PathBuf>,
    /// Set by [`Spec::bin_dir`]: where the binary is, instead of [`binary`]'s search.
    pub bin_dir: Option<PathBuf>,
}

/// A server's command line with `--plaintext` added unless it names a TLS file (`--tls-…`): for
/// tests of its other flags (a server given neither refuses to start).
pub fn plaintext_unless_tls<I: IntoIterator<Item = S>, S: Into<String>>(args: I) -> Vec<String> {
    let mut all: Vec<String> = args.into_iter().map(Into::into).collect();
    if !all.iter().any(|a| a.starts_with("--tls-")) {
        all.push("--plaintext".into());
    }
    all
}

/// The binaries that serve an HTTP API and must be told HTTPS or `--plaintext`.
const SERVERS: [&str; 4] = ["lock-server", "payment-resource", "rail-proxy", "rail-stub"];

impl Spec {
    /// A service on a free port. A server (lock-server, payment-resource, rail-proxy, rail-stub)
    /// serves plain HTTP, asked for explicitly (`DLOCK_PLAINTEXT`), until [`Spec::https`].
    pub fn new(name: &str, binary: &str) -> Result<Self, ProcError> {
        let env = if SERVERS.contains(&binary) {
            vec![(PLAINTEXT_ENV.to_owned(), "true".to_owned())]
        } else {
            Vec::new()
        };
        Ok(Self {
            name: name.to_owned(),
            binary: binary.to_owned(),
            args: Vec::new(),
            env,
            port: free_port()?,
            ready_path: Some("/readyz".to_owned()),
            ca: None,
            bin_dir: None,
        })
    }

    /// Start the binary from `dir` (when given) instead of [`binary`]'s search.
    pub fn bin_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.bin_dir = dir;
        self
    }

    /// Serve HTTPS with this certificate, signed by `ca` (the service's URL becomes `https://`, and
    /// readiness is asked over TLS, trusting `ca` alone).
    pub fn https(mut self, cert: &crate::pg::tls::ServerCert, ca: &Path) -> Self {
        self.env.retain(|(k, _)| k != PLAINTEXT_ENV);
        self.ca = Some(ca.to_path_buf());
        self.env(TLS_CERT_FILE_ENV, cert.cert.display().to_string())
            .env(TLS_KEY_FILE_ENV, cert.key.display().to_string())
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: &str, v: impl Into<String>) -> Self {
        self.env.push((k.to_owned(), v.into()));
        self
    }

    pub fn no_wait(mut self) -> Self {
        self.ready_path = None;
        self
    }
}

impl Service {
    /// Starts the process with its output in `<log_dir>/<name>.log` and waits until it is ready.
    pub async fn start(spec: Spec, log_dir: &Path) -> Result<Self, ProcError> {
        let bin = match &spec.bin_dir {
            Some(dir) => Some(dir.join(&spec.binary))
                .filter(|p| p.is_file())
                .ok_or_else(|| ProcError::NotBuilt(format!("{}/{}", dir.display(), spec.binary)))?,
            None => binary(&spec.binary)?,
        };
        fs::create_dir_all(log_dir).map_err(|source| ProcError::Io {
            what: "create log dir".into(),
            source,
        })?;
        let log = log_dir.join(format!("{}.log", spec.name));
        let file = fs::File::create(&log).map_err(|source| ProcError::Io {
            what: "create log".into(),
            source,
        })?;
        let err = file.try_clone().map_err(|source| ProcError::Io {
            what: "dup log".into(),
            source,
        })?;
        let port = spec.port.to_string();
        let child = Command::new(&bin)
            .args(spec.args.iter().map(|a| a.replace("{port}", &port)))
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|source| ProcError::Io {
                what: format!("spawn {}", bin.display()),
                source,
            })?;
        let mut svc = Self {
            name: spec.name.clone(),
            port: spec.port,
            log,
            ca: spec.ca.clone(),
            child,
        };
        if let Some(path) = &spec.ready_path {
            svc.wait_ready(path, Duration::from_secs(60)).await?;
        }
        Ok(svc)
    }

    pub fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn wait_ready(&mut self, path: &str, limit: Duration) -> Result<(), ProcError> {
        let url = format!("{}{path}", self.url());
        let started = Instant::now();
        // One client for every poll (a CA file that cannot be read never answers: NotReady).
        let https = self
            .ca
            .as_deref()
            .map(|ca| crate::pg::tls::client_trusting(ca, Duration::from_secs(1)).ok());
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(ProcError::Exited {
                    name: self.name.clone(),
                    status: status.to_string(),
                    log: self.log.display().to_string(),
                });
            }
            let ok = match &https {
                None => http_ok(self.port, path).await,
                Some(Some(client)) => https_ok(client, &url).await,
                Some(None) => false,
            };
            if ok {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(ProcError::NotReady {
                    name: self.name.clone(),
                    url,
                    secs: limit.as_secs(),
                    log: self.log.display().to_string(),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// SIGSTOP: the process keeps its state and sockets but runs no instruction until resumed —
    /// the "GC pause" of the fencing argument.
    pub fn pause(&self) -> Result<(), ProcError> {
        self.signal("STOP")
    }

    /// SIGCONT.
    pub fn resume(&self) -> Result<(), ProcError> {
        self.signal("CONT")
    }

    fn signal(&self, sig: &str) -> Result<(), ProcError> {
        let status = Command::new("kill")
            .args([format!("-{sig}"), self.child.id().to_string()])
            .status()
            .map_err(|source| ProcError::Io {
                what: format!("kill -{sig}"),
                source,
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(ProcError::Io {
                what: format!("kill -{sig}"),
                source: std::io::Error::other(status.to_string()),
            })
        }
    }

    /// Waits for the process to exit on its own (e.g. a batch executor), up to `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }

    /// SIGTERM (graceful), then SIGKILL if it does not exit within 5 s.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = self.resume();
        let _ = self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A GET over HTTPS with `client` (which trusts the service's CA alone) answering 2xx.
async fn https_ok(client: &reqwest::Client, url: &str) -> bool {
    client
        .get(url)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// A bare HTTP/1.1 GET on loopback answering 2xx (no HTTP client dependency in the kit).
async fn http_ok(port: u16, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(Ok(mut s)) = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    else {
        return false;
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await,
        Ok(Ok(n)) if n >= 12 && buf.starts_with(b"HTTP/1.1 2")
    )
}
