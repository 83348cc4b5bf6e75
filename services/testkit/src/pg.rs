//! One PostgreSQL 16 server process on loopback.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "PostgreSQL 16 binaries not found in {0}: run scripts/setup.sh, or set DLOCK_PG_BIN to a folder holding initdb and postgres"
    )]
    BinariesMissing(PathBuf),
    #[error(
        "user {0:?} (DLOCK_PG_USER) does not exist; postgres refuses to run as root and needs an unprivileged user"
    )]
    NoUser(String),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("initdb failed ({status}); see {log}")]
    Initdb { status: String, log: String },
    #[error("postgres did not become ready within {secs}s; see {log}")]
    NotReady { secs: u64, log: String },
    #[error("postgres did not shut down within {secs}s; see {log}")]
    NotStopped { secs: u64, log: String },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> PgError {
    let what = what.into();
    move |source| PgError::Io { what, source }
}

/// Where the PostgreSQL 16 binaries are.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DLOCK_PG_BIN") {
        return PathBuf::from(dir);
    }
    tools_dir().join("pg16").join("bin")
}

/// Tools installed by scripts/setup.sh, outside the clone so reruns reuse them and so an
/// unprivileged user can reach them.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("DLOCK_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/dlock-tools"))
}

/// A running server. Dropping it (or the process exiting) stops it and removes its data.
#[derive(Debug)]
pub struct PgServer {
    pub port: u16,
    /// The server's folder: `data/` (PGDATA, see [`pgdata`](Self::pgdata)) and `server.log`.
    pub data_dir: PathBuf,
    pub pid: u32,
    // What a restart needs to start the same server again.
    owner: Option<(u32, u32)>,
    settings: Vec<(String, String)>,
    /// False between [`shutdown`](Self::shutdown) and [`restart`](Self::restart).
    running: bool,
}

/// Servers to stop at process exit (tests keep theirs in statics, which are never dropped).
static RUNNING: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

impl PgServer {
    /// initdb + postgres on a free port under a fresh data directory. `label` names the directory.
    pub fn start(label: &str) -> Result<Self, PgError> {
        Self::start_with(label, &[])
    }

    /// Like [`start`](Self::start), with extra `-c name=value` settings.
    pub fn start_with(label: &str, settings: &[(&str, &str)]) -> Result<Self, PgError> {
        let bin = bin_dir();
        if !bin.join("postgres").exists() || !bin.join("initdb").exists() {
            return Err(PgError::BinariesMissing(bin));
        }
        remove_stale_dirs();
        let owner = unprivileged_owner()?;
        let base = std::env::temp_dir().join(format!("dlock-pg-{}-{label}-{}", std::process::id(), unique()));
        fs::create_dir_all(&base).map_err(io_err(format!("create {}", base.display())))?;
        if let Some((uid, gid)) = owner {
            chown(&base, Some(uid), Some(gid)).map_err(io_err(format!("chown {}", base.display())))?;
        }
        let data = base.join("data");
        let log_path = base.join("server.log");

        let initdb_log = base.join("initdb.log");
        let log = fs::File::create(&initdb_log).map_err(io_err("create initdb.log"))?;
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(Stdio::from(log.try_clone().map_err(io_err("dup log"))?))
            .stderr(Stdio::from(log));
        as_owner(&mut initdb, owner);
        let status = initdb.status().map_err(io_err("run initdb"))?;
        if !status.success() {
            return Err(PgError::Initdb {
                status: status.to_string(),
                log: initdb_log.display().to_string(),
            });
        }

        let mut last_err = None;
        // A free port can be taken between our probe and postgres' bind; try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let pid = spawn_postgres(&bin, &data, &log_path, port, owner, settings)?;
            match wait_ready(&data, pid, Duration::from_secs(30)) {
                Ok(()) => {
                    if let Ok(mut r) = RUNNING.lock() {
                        r.push((pid, base.clone()));
                    }
                    register_atexit();
                    tracing::info!(event = "postgres_started", label, port, pid);
                    return Ok(Self {
                        port,
                        data_dir: base.clone(),
                        pid,
                        owner,
                        settings: settings
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                        running: true,
                    });
                }
                Err(e) => {
                    stop_pid(pid);
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or(PgError::NotReady {
            secs: 30,
            log: log_path.display().to_string(),
        }))
    }

    pub fn url(&self, user: &str, db: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{db}", self.port)
    }

    /// PGDATA: the cluster's data directory (what a physical backup copies).
    pub fn pgdata(&self) -> PathBuf {
        self.data_dir.join("data")
    }

    /// Stops the server cleanly and keeps its data: a fast shutdown (SIGINT) ends the sessions,
    /// writes a checkpoint and removes postmaster.pid, so PGDATA is then a consistent physical state
    /// that can be copied or replaced. [`restart`](Self::restart) starts it again.
    pub fn shutdown(&mut self) -> Result<(), PgError> {
        if !self.running {
            return Ok(());
        }
        // SAFETY: kill with a pid we started; a stale pid only yields ESRCH.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGINT);
        }
        let limit = Duration::from_secs(30);
        let started = Instant::now();
        while alive(self.pid) {
            if started.elapsed() > limit {
                return Err(PgError::NotStopped {
                    secs: limit.as_secs(),
                    log: self.data_dir.join("server.log").display().to_string(),
                });
            }
            // Waiting for another process to exit: there is nothing to block on but its /proc entry.
            std::thread::sleep(Duration::from_millis(10));
        }
        // Nothing to stop at exit any more (and the pid may be reused); restart registers again.
        if let Ok(mut r) = RUNNING.lock() {
            r.retain(|(p, _)| *p != self.pid);
        }
        self.running = false;
        Ok(())
    }

    /// Crashes the server as `pg_ctl stop -m immediate` does (SIGQUIT to the postmaster: no
    /// checkpoint, backends killed, crash recovery at the next start) and waits until it is gone.
    /// [`restart`](Self::restart) starts it again. Committed data survives only as the settings
    /// allow: the fault campaign starts its servers with `synchronous_commit=on`.
    pub fn crash(&mut self) {
        if !self.running {
            return;
        }
        stop_pid(self.pid);
        if let Ok(mut r) = RUNNING.lock() {
            r.retain(|(p, _)| *p != self.pid);
        }
        self.running = false;
    }

    /// Starts postgres again on the same port and PGDATA, with the same settings, after
    /// [`shutdown`](Self::shutdown) (PGDATA may have been replaced meanwhile, e.g. by a restore).
    pub fn restart(&mut self) -> Result<(), PgError> {
        if self.running {
            return Ok(());
        }
        let settings: Vec<(&str, &str)> = self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let data = self.pgdata();
        let log_path = self.data_dir.join("server.log");
        let pid = spawn_postgres(&bin_dir(), &data, &log_path, self.port, self.owner, &settings)?;
        if let Err(e) = wait_ready(&data, pid, Duration::from_secs(30)) {
            stop_pid(pid);
            return Err(e);
        }
        if let Ok(mut r) = RUNNING.lock() {
            r.push((pid, self.data_dir.clone()));
        }
        self.pid = pid;
        self.running = true;
        Ok(())
    }

    /// Stops the server and removes its data.
    pub fn stop(&self) {
        if self.running {
            stop_pid(self.pid);
        }
        let _ = fs::remove_dir_all(&self.data_dir);
        if let Ok(mut r) = RUNNING.lock() {
            r.retain(|(p, _)| *p != self.pid);
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn free_port() -> Result<u16, PgError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io_err("bind a probe port"))?;
    Ok(l.local_addr().map_err(io_err("probe port"))?.port())
}

/// uid/gid to run postgres as: `None` when we are not root.
fn unprivileged_owner() -> Result<Option<(u32, u32)>, PgError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let user = std::env::var("DLOCK_PG_USER").unwrap_or_else(|_| "nobody".to_owned());
    let passwd = fs::read_to_string("/etc/passwd").map_err(io_err("read /etc/passwd"))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == user)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .map(Some)
        .ok_or(PgError::NoUser(user))
}

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
}

/// Spawns postgres from a thread that lives as long as the process, with PR_SET_PDEATHSIG so the
/// server dies with us even if we are killed (the signal fires when the spawning *thread* exits).
fn spawn_postgres(
    bin: &Path,
    data: &Path,
    log_path: &Path,
    port: u16,
    owner: Option<(u32, u32)>,
    settings: &[(&str, &str)],
) -> Result<u32, PgError> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(io_err("open server.log"))?;
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D").arg(data).args(["-p", &port.to_string()]);
    let defaults = [
        ("listen_addresses", "127.0.0.1"),
        ("unix_socket_directories", ""),
        ("max_connections", "300"),
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("log_min_messages", "warning"),
    ];
    for (k, v) in defaults.iter().chain(settings.iter()) {
        cmd.arg("-c").arg(format!("{k}={v}"));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().map_err(io_err("dup log"))?))
        .stderr(Stdio::from(log));
    as_owner(&mut cmd, owner);
    // SAFETY: the closure runs between fork and exec and only calls prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("postgres-{port}"))
        .spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id()));
                // Keep this thread (the parent of record for PDEATHSIG) alive while the server runs.
                let _ = child.wait();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        })
        .map_err(io_err("spawn keeper thread"))?;
    rx.recv()
        .map_err(|_| PgError::Io {
            what: "keeper thread".into(),
            source: io::Error::other("exited"),
        })?
        .map_err(io_err("spawn postgres"))
}

/// postmaster.pid's 8th line reads "ready" once the server accepts connections.
fn wait_ready(data: &Path, pid: u32, limit: Duration) -> Result<(), PgError> {
    let started = Instant::now();
    let pidfile = data.join("postmaster.pid");
    loop {
        if let Ok(text) = fs::read_to_string(&pidfile)
            && text.lines().nth(7).is_some_and(|l| l.trim() == "ready")
        {
            return Ok(());
        }
        if !alive(pid) || started.elapsed() > limit {
            let log = data.parent().map(|p| p.join("server.log")).unwrap_or_default();
            return Err(PgError::NotReady {
                secs: limit.as_secs(),
                log: log.display().to_string(),
            });
        }
        // Polling a file the server writes: there is no event to wait on across processes here.
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie still answers kill(0); /proc/<pid>/stat tells zombies apart.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn stop_pid(pid: u32) {
    // SIGQUIT: immediate shutdown; the data is thrown away anyway.
    // SAFETY: kill with a pid we started; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(pid as i32, libc::SIGQUIT);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Data directories left by processes that no longer exist (a killed test run).
fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("dlock-pg-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

extern "C" fn stop_all_at_exit() {
    let servers = RUNNING
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    for (pid, dir) in servers {
        stop_pid(pid);
        let _ = fs::remove_dir_all(dir);
    }
}

fn register_atexit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain extern "C" function; the test harness leaves via exit(), which
        // runs it, so servers held in statics are stopped and their data removed.
        unsafe {
            libc::atexit(stop_all_at_exit);
        }
    });
}
