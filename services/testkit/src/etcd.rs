//! Real etcd processes on loopback for the lock-server's etcd backend: one member
//! ([`EtcdCluster::single`]) or a real three-member cluster ([`EtcdCluster::three`]) whose members can
//! be stopped and restarted on their data directories (the fault tests stop the leader, then a
//! follower).
//!
//! Binary: `DLOCK_ETCD_BIN`, else `$DLOCK_TOOLS_DIR/bin/etcd` (which `scripts/cluster-tools.sh etcd`
//! fills: Debian's etcd-server 3.4, or etcd 3.5 built with Go), else `etcd` on `PATH`. Data lives on
//! `/dev/shm` when there is one: the tests exercise consensus, not the disk. Each process gets
//! `PR_SET_PDEATHSIG`, so it dies with the test process even if a member is never dropped.
//!
//! Restores: [`EtcdCluster::restore_flags`] are the flags `etcdutl snapshot restore` needs to write
//! a data directory for one member (same name, peer URL and cluster token), and
//! [`EtcdCluster::restart_on`] starts that member on it, on the same ports ([`etcdutl_bin`] finds
//! the tool, which `scripts/cluster-tools.sh etcdutl` builds).
//!
//! TLS: [`EtcdCluster::single_tls`] serves the client URLs over HTTPS only, with a certificate from
//! a [`TestCa`] for `127.0.0.1` and `localhost`, and (with `client_cert_auth`) requires a client
//! certificate signed by that CA (`--client-cert-auth --trusted-ca-file`); [`EtcdTls`] holds the CA
//! and a client certificate. The peer URLs stay plain HTTP (one member). Readiness is then read on a
//! plain-HTTP metrics URL (`--listen-metrics-urls`, which serves `/health` too), so that the check
//! needs no client certificate.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::pg::{PgError, ServerCert, TestCa};
use crate::procs::{ProcError, free_port};

/// The etcd binary the tests run.
pub fn etcd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("DLOCK_ETCD_BIN") {
        return PathBuf::from(p);
    }
    let cached = crate::pg::tools_dir().join("bin/etcd");
    if cached.exists() {
        return cached;
    }
    PathBuf::from("etcd")
}

/// `etcdutl` (etcd >= 3.5's offline tool): `DLOCK_ETCDUTL_BIN`, else `$DLOCK_TOOLS_DIR/bin/etcdutl`,
/// else `etcdutl` on `PATH`; `None` when there is none.
pub fn etcdutl_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DLOCK_ETCDUTL_BIN") {
        return Some(PathBuf::from(p));
    }
    let cached = crate::pg::tools_dir().join("bin/etcdutl");
    if cached.is_file() {
        return Some(cached);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("etcdutl"))
            .find(|p| p.is_file())
    })
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    /// The plain-HTTP port of `/health` and `/metrics` (TLS clusters only: their client port
    /// speaks HTTPS).
    metrics_port: Option<u16>,
    child: Option<Child>,
}

/// The certificates of a cluster whose client URLs speak TLS ([`EtcdCluster::single_tls`]).
#[derive(Debug)]
pub struct EtcdTls {
    ca: TestCa,
    server: ServerCert,
    client: ServerCert,
    client_cert_auth: bool,
}

impl EtcdTls {
    /// The CA that signed the members' certificate and [`Self::client`]: what a client names as
    /// the CA of etcd's certificate, and (with client certificate auth) etcd's `--trusted-ca-file`.
    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// A client certificate (`clientAuth`) signed by [`Self::ca`]: one etcd accepts.
    pub fn client(&self) -> &ServerCert {
        &self.client
    }

    /// Whether the members require a client certificate (`--client-cert-auth`).
    pub fn client_cert_auth(&self) -> bool {
        self.client_cert_auth
    }
}

/// One etcd cluster (1 or 3 members) on loopback. Dropping it kills its members and removes the data.
#[derive(Debug)]
pub struct EtcdCluster {
    base: PathBuf,
    token: String,
    members: Vec<Member>,
    // Boxed: a cluster is held inline in test enums, and most clusters have none.
    tls: Option<Box<EtcdTls>>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

const READY_LIMIT: Duration = Duration::from_secs(60);

impl EtcdCluster {
    /// A single-member etcd.
    pub fn single() -> Result<Self, ProcError> {
        Self::start(1)
    }

    /// A real three-member cluster (three processes, Raft between them over loopback).
    pub fn three() -> Result<Self, ProcError> {
        Self::start(3)
    }

    /// A single-member etcd whose client URL speaks HTTPS only, with a certificate for `127.0.0.1`
    /// and `localhost` from a new [`TestCa`] (`label` names it). With `client_cert_auth` it also
    /// requires a client certificate signed by that CA (`--client-cert-auth`, `--trusted-ca-file`);
    /// without, it accepts any TLS client (neither flag).
    pub fn single_tls(label: &str, client_cert_auth: bool) -> Result<Self, ProcError> {
        let certs = |e: PgError| ProcError::Io {
            what: format!("make the etcd TLS certificates ({label})"),
            source: std::io::Error::other(e.to_string()),
        };
        let ca = TestCa::new(&format!("etcd-{label}")).map_err(certs)?;
        let server = ca
            .issue("etcd-server", &["127.0.0.1", "localhost"])
            .map_err(certs)?;
        let client = ca.issue_client("etcd-client", "lock-server").map_err(certs)?;
        Self::start_with(
            1,
            Some(Box::new(EtcdTls {
                ca,
                server,
                client,
                client_cert_auth,
            })),
        )
    }

    /// The certificates, when the client URLs speak TLS.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_deref()
    }

    fn start(n: usize) -> Result<Self, ProcError> {
        Self::start_with(n, None)
    }

    fn start_with(n: usize, tls: Option<Box<EtcdTls>>) -> Result<Self, ProcError> {
        let root = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let id = format!(
            "{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let base = root.join(format!("dlock-etcd-{id}"));
        fs::create_dir_all(&base).map_err(io("create etcd dir"))?;
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                data_dir: base.join(format!("m{i}")),
                log: base.join(format!("m{i}.log")),
                metrics_port: match tls {
                    Some(_) => Some(free_port()?),
                    None => None,
                },
                child: None,
            });
        }
        let mut cluster = Self {
            base,
            token: format!("dlock-test-{id}"),
            members,
            tls,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i)?;
        }
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) -> Result<(), ProcError> {
        let initial = self.initial_cluster();
        let client_url = self.endpoint(i);
        let m = &mut self.members[i];
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(io("open etcd log"))?;
        let mut cmd = Command::new(etcd_bin());
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{}", m.peer_port))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{}", m.peer_port))
            .arg("--initial-cluster")
            .arg(initial)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.token)
            // Short timeouts so that an election after a stopped leader takes well under a second.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null());
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.server.cert)
                .arg("--key-file")
                .arg(&tls.server.key);
            if tls.client_cert_auth {
                cmd.arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(tls.ca.cert());
            }
        }
        if let Some(port) = m.metrics_port {
            cmd.arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{port}"));
        }
        cmd.stdout(Stdio::from(log.try_clone().map_err(io("dup etcd log"))?))
            .stderr(Stdio::from(log));
        // SAFETY: prctl with PR_SET_PDEATHSIG is async-signal-safe and touches no memory of ours.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| ProcError::Io {
            what: format!(
                "start {} (install it with scripts/cluster-tools.sh etcd)",
                etcd_bin().display()
            ),
            source,
        })?;
        m.child = Some(child);
        Ok(())
    }

    /// Waits for the member's `/health` to say true (it has a leader and serves).
    fn wait_healthy(&mut self, i: usize) -> Result<(), ProcError> {
        let started = Instant::now();
        loop {
            if health(self.health_port(i)) {
                return Ok(());
            }
            let m = &mut self.members[i];
            if let Some(child) = m.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(ProcError::Exited {
                    name: format!("etcd {}", m.name),
                    status: status.to_string(),
                    log: m.log.display().to_string(),
                });
            }
            if started.elapsed() > READY_LIMIT {
                return Err(ProcError::NotReady {
                    name: format!("etcd {}", m.name),
                    url: format!(
                        "http://127.0.0.1:{}/health",
                        m.metrics_port.unwrap_or(m.client_port)
                    ),
                    secs: READY_LIMIT.as_secs(),
                    log: m.log.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// `http://127.0.0.1:<port>`, or `https://…` when the client URLs speak TLS.
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Where member `i` answers `/health` in plain HTTP: its client port, or with TLS its metrics
    /// port.
    fn health_port(&self, i: usize) -> u16 {
        let m = &self.members[i];
        m.metrics_port.unwrap_or(m.client_port)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Kills member `i` (SIGKILL: a crash, not a graceful leave) and waits for it to be gone.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts member `i` on its data directory and waits until it is healthy again.
    pub fn restart(&mut self, i: usize) -> Result<(), ProcError> {
        self.stop(i);
        self.spawn(i)?;
        self.wait_healthy(i)
    }

    /// The cluster's scratch folder (removed on drop): a place for snapshots and restored data.
    pub fn dir(&self) -> &Path {
        &self.base
    }

    /// The flags `etcdutl snapshot restore` needs so that the data directory it writes belongs to
    /// member `i` of this cluster: etcd derives the member and cluster IDs from them, and a member
    /// started with other ones would refuse its own data.
    pub fn restore_flags(&self, i: usize) -> Vec<String> {
        let m = &self.members[i];
        vec![
            "--name".into(),
            m.name.clone(),
            "--initial-cluster".into(),
            self.initial_cluster(),
            "--initial-cluster-token".into(),
            self.token.clone(),
            "--initial-advertise-peer-urls".into(),
            format!("http://127.0.0.1:{}", m.peer_port),
        ]
    }

    /// Stops member `i`, then starts it on `data_dir` (e.g. one `etcdutl snapshot restore` wrote
    /// with [`Self::restore_flags`]) on the same ports, and waits until it is healthy. Put the
    /// directory under [`Self::dir`] so that it is removed with the cluster.
    pub fn restart_on(&mut self, i: usize, data_dir: impl Into<PathBuf>) -> Result<(), ProcError> {
        self.stop(i);
        self.members[i].data_dir = data_dir.into();
        self.spawn(i)?;
        self.wait_healthy(i)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
        let _ = fs::remove_dir_all(&self.base);
    }
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> ProcError {
    move |source| ProcError::Io {
        what: what.into(),
        source,
    }
}

/// `GET /health` on the client port; true when etcd answers `"health":"true"`.
fn health(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}
