//! One PostgreSQL 16 server process on loopback, and what replication and physical backups need:
//! a streaming standby made with pg_basebackup ([`PgServer::start_standby`]), promotion, a standby
//! held behind, base backups and file-system copies of PGDATA restored in place; and a server that
//! accepts TLS connections only ([`PgServer::start_tls`]), with a certificate from a test CA.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::fs::{PermissionsExt, chown, lchown, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

// The certificates of the TLS mode live in their own file, declared here so that the module list
// of the crate root stays as it is: `dlock_testkit::pg::tls`.
#[path = "tls.rs"]
pub mod tls;

pub use tls::{ServerCert, TestCa};

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "PostgreSQL 16 binaries not found in {0}: run scripts/setup.sh, or set DLOCK_PG_BIN to a folder holding initdb and postgres (and pg_basebackup, pg_ctl and psql for replication)"
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
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: String,
        status: String,
        stderr: String,
    },
    #[error("{what} within {secs}s; see {log}")]
    Timeout { what: String, secs: u64, log: String },
    #[error("{0}")]
    State(String),
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

/// A PostgreSQL 16 program (`psql`, `pg_basebackup`, `pg_ctl`, `pg_controldata`, …) of [`bin_dir`].
pub fn tool_path(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// psql 16, from [`bin_dir`].
pub fn psql_path() -> PathBuf {
    tool_path("psql")
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
    /// Set for a server started with [`start_tls`](Self::start_tls).
    tls: Option<ServerTls>,
}

/// The TLS side of a server started with [`PgServer::start_tls`]: `ssl=on`, a server certificate
/// signed by [`ca`](Self::ca), and a `pg_hba.conf` that admits `hostssl` connections only
/// (`hostnossl … reject`), as a database that requires TLS (Cloud SQL with SSL required, RDS with
/// `rds.force_ssl`, CloudNativePG) does.
#[derive(Debug)]
pub struct ServerTls {
    /// The CA that signed the server's certificate: its [`cert`](TestCa::cert) is what a client
    /// names in `sslrootcert`.
    pub ca: TestCa,
    /// The host names and addresses the server's certificate is valid for.
    pub names: Vec<String>,
}

/// The names [`PgServer::start_tls`] puts in the server certificate: the two ways a test reaches
/// a loopback server.
pub const TLS_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// `pg_hba.conf` of a TLS-only server: every database and replication over TLS from loopback,
/// anything without TLS refused by name (rather than by the absence of a matching line), so the
/// server's answer to a plain connection says so.
const TLS_ONLY_HBA: &str = "\
# TYPE     DATABASE     USER  ADDRESS       METHOD
hostssl    all          all   127.0.0.1/32  trust
hostssl    replication  all   127.0.0.1/32  trust
hostnossl  all          all   all           reject
hostnossl  replication  all   all           reject
";

/// Servers to stop at process exit (tests keep theirs in statics, which are never dropped).
static RUNNING: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

impl PgServer {
    /// initdb + postgres on a free port under a fresh data directory. `label` names the directory.
    pub fn start(label: &str) -> Result<Self, PgError> {
        Self::start_with(label, &[])
    }

    /// Like [`start`](Self::start), with extra `-c name=value` settings.
    pub fn start_with(label: &str, settings: &[(&str, &str)]) -> Result<Self, PgError> {
        Self::start_inner(label, settings, None)
    }

    /// A server that accepts TLS connections only ([`ServerTls`]): a fresh test CA signs its
    /// certificate for [`TLS_NAMES`]. [`tls_url`](Self::tls_url) gives a URL that verifies it.
    pub fn start_tls(label: &str) -> Result<Self, PgError> {
        Self::start_tls_for(label, &TLS_NAMES, &[])
    }

    /// Like [`start_tls`](Self::start_tls), with a certificate valid for `names` only (host names
    /// or IP addresses) and extra settings. A certificate that does not name `127.0.0.1`, the
    /// address every URL of the test kit uses, is how a test meets a host-name mismatch.
    ///
    /// A standby of such a server ([`start_standby`](Self::start_standby)) is not TLS-enabled:
    /// its settings do not carry the primary's `ssl` ones.
    pub fn start_tls_for(label: &str, names: &[&str], settings: &[(&str, &str)]) -> Result<Self, PgError> {
        let ca = TestCa::new(label)?;
        let tls = ServerTls {
            ca,
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        Self::start_inner(label, settings, Some(tls))
    }

    fn start_inner(label: &str, settings: &[(&str, &str)], tls: Option<ServerTls>) -> Result<Self, PgError> {
        let bin = bin_dir();
        if !bin.join("postgres").exists() || !bin.join("initdb").exists() {
            return Err(PgError::BinariesMissing(bin));
        }
        remove_stale_dirs();
        let owner = unprivileged_owner()?;
        let base = new_dir(label, owner)?;
        let data = base.join("data");

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

        let Some(tls) = tls else {
            return Self::launch(label, base, owner, settings);
        };
        let (cert, key) = install_server_cert(&tls, &base, owner)?;
        let hba = data.join("pg_hba.conf");
        fs::write(&hba, TLS_ONLY_HBA).map_err(io_err(format!("write {}", hba.display())))?;
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let mut all: Vec<(&str, &str)> =
            vec![("ssl", "on"), ("ssl_cert_file", &cert), ("ssl_key_file", &key)];
        all.extend_from_slice(settings);
        let mut server = Self::launch(label, base, owner, &all)?;
        tracing::info!(event = "postgres_tls", port = server.port, names = ?tls.names);
        server.tls = Some(tls);
        Ok(server)
    }

    /// Starts postgres on PGDATA `base/data` on a free port and waits until it accepts connections.
    fn launch(
        label: &str,
        base: PathBuf,
        owner: Option<(u32, u32)>,
        settings: &[(&str, &str)],
    ) -> Result<Self, PgError> {
        let bin = bin_dir();
        let data = base.join("data");
        let log_path = base.join("server.log");
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
                        tls: None,
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

    /// The TLS side of a server started with [`start_tls`](Self::start_tls); `None` otherwise.
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// [`url`](Self::url) with `sslmode=<sslmode>` and, for a TLS server, `sslrootcert=` its CA:
    /// `tls_url("postgres", "postgres", "verify-full")` connects only to this server's certificate.
    pub fn tls_url(&self, user: &str, db: &str, sslmode: &str) -> String {
        let mut url = format!("{}?sslmode={sslmode}", self.url(user, db));
        if let Some(tls) = &self.tls {
            url.push_str("&sslrootcert=");
            url.push_str(&url_encode_path(tls.ca.cert()));
        }
        url
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

    /// A streaming standby of `primary` (which must be running): `pg_basebackup -R -X stream` of it
    /// into a fresh folder, then postgres on that copy on a free port with `hot_standby=on`, the
    /// test kit's defaults and `settings`. Its `primary_conninfo` (in `postgresql.auto.conf`, where
    /// [`hold_behind`](Self::hold_behind)'s `ALTER SYSTEM` can change it) carries
    /// `application_name=<label>`, so a primary's `synchronous_standby_names` can name it: start the
    /// primary with `synchronous_commit=on` and `synchronous_standby_names=<label>` for synchronous
    /// replication (its commits then wait for this standby; until it streams they wait for ever,
    /// so set the primary up with `SET synchronous_commit = local` sessions first).
    ///
    /// Returns once the standby accepts connections and its WAL receiver streams. The primary needs
    /// nothing special: PostgreSQL 16 defaults to `wal_level=replica` and `max_wal_senders=10`,
    /// initdb's trust `pg_hba.conf` admits replication from 127.0.0.1, and a base backup forces
    /// full-page writes on the primary while it runs whatever `full_page_writes` says. `settings`
    /// are kept for [`restart`](Self::restart), also once promoted; pass the primary's own
    /// (`synchronous_commit=on`, …) for a standby meant to take over.
    pub fn start_standby(
        primary: &PgServer,
        label: &str,
        settings: &[(&str, &str)],
    ) -> Result<PgServer, PgError> {
        if !primary.running {
            return Err(PgError::State(format!(
                "a standby {label} needs a running primary (port {})",
                primary.port
            )));
        }
        remove_stale_dirs();
        let owner = unprivileged_owner()?;
        let base = new_dir(label, owner)?;
        let data = base.join("data");
        primary.basebackup_into(&data, owner, true)?;
        // pg_basebackup -R wrote standby.signal and a primary_conninfo naming the connection it
        // used; ours adds the application_name and nothing else (no passfile, no SSL or GSS tries).
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name={}",
            primary.port,
            conninfo_quote(label)
        );
        let auto_conf = data.join("postgresql.auto.conf");
        let mut text =
            fs::read_to_string(&auto_conf).map_err(io_err(format!("read {}", auto_conf.display())))?;
        text = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("primary_conninfo"))
            .map(|l| format!("{l}\n"))
            .collect();
        text.push_str(&format!("primary_conninfo = {}\n", sql_quote(&conninfo)));
        fs::write(&auto_conf, text).map_err(io_err(format!("write {}", auto_conf.display())))?;

        let mut all: Vec<(&str, &str)> = vec![("hot_standby", "on")];
        all.extend_from_slice(settings);
        let standby = Self::launch(label, base, owner, &all)?;
        let limit = Duration::from_secs(30);
        standby.wait_for(
            "postgres",
            "SELECT status FROM pg_stat_wal_receiver",
            |out| out == "streaming",
            limit,
            &format!("standby {label} did not stream from port {}", primary.port),
        )?;
        tracing::info!(
            event = "postgres_standby_streaming",
            label,
            port = standby.port,
            primary = primary.port
        );
        Ok(standby)
    }

    /// Promotes a standby (`pg_ctl promote -w`) and returns once it is out of recovery and takes
    /// writes. It starts a new timeline (the primary's plus one).
    pub fn promote(&self) -> Result<(), PgError> {
        self.require_running("promote")?;
        let mut cmd = Command::new(tool_path("pg_ctl"));
        cmd.args(["promote", "-w", "-t", "60", "-D"]).arg(self.pgdata());
        as_owner(&mut cmd, self.owner);
        run_tool("pg_ctl promote", cmd)?;
        // pg_ctl returns when pg_control says "in production", a moment before the server lets
        // sessions write.
        self.wait_for(
            "postgres",
            "SELECT pg_is_in_recovery()",
            |out| out == "f",
            Duration::from_secs(30),
            "the promoted standby did not leave recovery",
        )?;
        tracing::info!(event = "postgres_promoted", port = self.port);
        Ok(())
    }

    /// Stops a standby receiving WAL (`ALTER SYSTEM SET primary_conninfo = ''`, reload) and
    /// returns once its WAL receiver is gone: from then on it lags behind every write of the
    /// primary, as an asynchronous standby with lag does, until `primary_conninfo` is set again
    /// (it stays empty across [`restart`](Self::restart)). Pausing replay would not do: promotion
    /// replays everything received.
    pub fn hold_behind(&self) -> Result<(), PgError> {
        self.require_running("hold a standby behind")?;
        self.sql("postgres", "ALTER SYSTEM SET primary_conninfo = ''")?;
        self.sql("postgres", "SELECT pg_reload_conf()")?;
        self.wait_for(
            "postgres",
            "SELECT count(*) FROM pg_stat_wal_receiver",
            |out| out == "0",
            Duration::from_secs(30),
            "the standby's WAL receiver did not stop",
        )?;
        tracing::info!(event = "postgres_standby_held", port = self.port);
        Ok(())
    }

    /// A base backup of this running server (`pg_basebackup -X stream`, no standby.signal) into a
    /// new folder, which is returned: a PGDATA to restore later with
    /// [`restore_pgdata`](Self::restore_pgdata). It is removed when the process exits.
    pub fn base_backup(&self, label: &str) -> Result<PathBuf, PgError> {
        self.require_running("take a base backup")?;
        let dir = new_dir(label, self.owner)?;
        scratch(&dir);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("chmod {}", dir.display())))?;
        self.basebackup_into(&dir, self.owner, false)?;
        Ok(dir)
    }

    /// A file-system copy of this server's PGDATA, which must be shut down
    /// ([`shutdown`](Self::shutdown) or [`crash`](Self::crash)), into a new folder, which is
    /// returned. It is removed when the process exits.
    pub fn copy_pgdata(&self, label: &str) -> Result<PathBuf, PgError> {
        if self.running {
            return Err(PgError::State(format!(
                "copy PGDATA of the server on port {}: it is running",
                self.port
            )));
        }
        let dir = new_dir(label, self.owner)?;
        scratch(&dir);
        copy_tree(&self.pgdata(), &dir, self.owner)?;
        Ok(dir)
    }

    /// Replaces the PGDATA of this shut-down server with a copy of `from` (a
    /// [`base_backup`](Self::base_backup) or a [`copy_pgdata`](Self::copy_pgdata)), owned by the
    /// server's user with mode 0700, so that [`restart`](Self::restart) starts the restored copy,
    /// as a primary: a standby.signal or recovery.signal in `from` is not copied.
    ///
    /// A base backup starts with crash recovery from its backup_label up to the end of the WAL
    /// the backup streamed, and then takes writes on the timeline it was taken on: no new
    /// timeline, the same system identifier (`pg_control_system()`), only a new
    /// `pg_postmaster_start_time()` — a restored history that reuses the timeline numbers.
    pub fn restore_pgdata(&mut self, from: &Path) -> Result<(), PgError> {
        if self.running {
            return Err(PgError::State(format!(
                "restore PGDATA of the server on port {}: it is running; shut it down first",
                self.port
            )));
        }
        let data = self.pgdata();
        if data.exists() {
            fs::remove_dir_all(&data).map_err(io_err(format!("remove {}", data.display())))?;
        }
        copy_tree(from, &data, self.owner)?;
        for leftover in ["standby.signal", "recovery.signal", "postmaster.pid"] {
            let f = data.join(leftover);
            if f.exists() {
                fs::remove_file(&f).map_err(io_err(format!("remove {}", f.display())))?;
            }
        }
        tracing::info!(event = "postgres_pgdata_restored", port = self.port, from = %from.display());
        Ok(())
    }

    /// Runs one statement with psql 16 as `postgres` on database `db` and returns its output,
    /// unaligned and tuples only (`psql -X -At`), trimmed.
    pub fn sql(&self, db: &str, statement: &str) -> Result<String, PgError> {
        let mut cmd = Command::new(psql_path());
        cmd.args([
            "-X",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
        ])
        .args(["-p", &self.port.to_string(), "-d", db, "-c", statement]);
        run_tool("psql", cmd).map(|out| out.trim().to_owned())
    }

    /// Polls `query` until `done` accepts its output (errors meanwhile count as not yet).
    fn wait_for(
        &self,
        db: &str,
        query: &str,
        done: impl Fn(&str) -> bool,
        limit: Duration,
        what: &str,
    ) -> Result<(), PgError> {
        let started = Instant::now();
        loop {
            let last = match self.sql(db, query) {
                Ok(out) if done(&out) => return Ok(()),
                Ok(out) => out,
                Err(e) => e.to_string(),
            };
            if !alive(self.pid) || started.elapsed() > limit {
                return Err(PgError::Timeout {
                    what: format!("{what} (last answer to {query:?}: {last:?})"),
                    secs: limit.as_secs(),
                    log: self.data_dir.join("server.log").display().to_string(),
                });
            }
            // Another process's state, read through SQL: nothing to block on but the next look.
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn require_running(&self, what: &str) -> Result<(), PgError> {
        if self.running {
            Ok(())
        } else {
            Err(PgError::State(format!(
                "{what}: the server on port {} is shut down",
                self.port
            )))
        }
    }

    /// pg_basebackup of this server into `dir` (created by pg_basebackup or empty), as `owner`,
    /// with `-R` (standby.signal and primary_conninfo) when `standby`.
    fn basebackup_into(&self, dir: &Path, owner: Option<(u32, u32)>, standby: bool) -> Result<(), PgError> {
        let mut cmd = Command::new(tool_path("pg_basebackup"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-D",
        ])
        .arg(dir)
        // A fast checkpoint: the default spreads it over checkpoint_completion_target.
        .args(["-X", "stream", "-c", "fast", "--no-sync"]);
        if standby {
            cmd.arg("-R");
        }
        as_owner(&mut cmd, owner);
        run_tool("pg_basebackup", cmd)?;
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

/// A new folder `dlock-pg-<our pid>-<label>-<n>` in the temp dir, owned by `owner` (removed as
/// stale by a later run once we are gone).
fn new_dir(label: &str, owner: Option<(u32, u32)>) -> Result<PathBuf, PgError> {
    let dir = std::env::temp_dir().join(format!("dlock-pg-{}-{label}-{}", std::process::id(), unique()));
    fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
    if let Some((uid, gid)) = owner {
        chown(&dir, Some(uid), Some(gid)).map_err(io_err(format!("chown {}", dir.display())))?;
    }
    Ok(dir)
}

/// A new folder of test files, owned by the test process (not the server's user) and removed at
/// process exit.
pub(crate) fn scratch_dir(label: &str) -> Result<PathBuf, PgError> {
    let dir = new_dir(label, None)?;
    scratch(&dir);
    Ok(dir)
}

/// The server's certificate, issued by the test CA for the server's names, copied beside PGDATA
/// (not into it, so a restored PGDATA keeps working) and owned by the server's user: postgres
/// refuses a key file that others can read.
fn install_server_cert(
    tls: &ServerTls,
    base: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(PathBuf, PathBuf), PgError> {
    let names: Vec<&str> = tls.names.iter().map(String::as_str).collect();
    let issued = tls.ca.issue("server", &names)?;
    let (cert, key) = (base.join("server.crt"), base.join("server.key"));
    for (from, to, mode) in [(&issued.cert, &cert, 0o644), (&issued.key, &key, 0o600)] {
        fs::copy(from, to).map_err(io_err(format!("copy {}", from.display())))?;
        fs::set_permissions(to, fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("chmod {}", to.display())))?;
        if let Some((uid, gid)) = owner {
            chown(to, Some(uid), Some(gid)).map_err(io_err(format!("chown {}", to.display())))?;
        }
    }
    Ok((cert, key))
}

/// A path as a URL query value: every byte but the unreserved ones and `/` percent-encoded.
fn url_encode_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs a PostgreSQL program to its end; its stdout, or [`PgError::Tool`] with its stderr.
fn run_tool(tool: &str, mut cmd: Command) -> Result<String, PgError> {
    cmd.stdin(Stdio::null());
    // The bundled libpq for the programs' own libraries too (see `bundled_lib_dir`).
    if let Some(lib) = bundled_lib_dir() {
        cmd.env("LD_LIBRARY_PATH", lib);
    }
    let out = cmd.output().map_err(io_err(format!("run {tool}")))?;
    if !out.status.success() {
        return Err(PgError::Tool {
            tool: tool.to_owned(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `lib/` beside [`bin_dir`] when it holds its own libpq, as the installed build does: its WAL
/// receiver module (libpqwalreceiver.so) was linked to look for libpq under the build's prefix,
/// not beside itself, and would otherwise load the system's libpq, or none.
fn bundled_lib_dir() -> Option<PathBuf> {
    let lib = bin_dir().parent()?.join("lib");
    lib.join("libpq.so.5").exists().then_some(lib)
}

/// Copies the tree `from` to `to` (which must not exist): folders, files and symlinks with their
/// modes, owned by `owner`; `to` itself gets mode 0700, as postgres wants of a PGDATA.
fn copy_tree(from: &Path, to: &Path, owner: Option<(u32, u32)>) -> Result<(), PgError> {
    fn walk(from: &Path, to: &Path, owner: Option<(u32, u32)>) -> Result<(), PgError> {
        let meta = fs::symlink_metadata(from).map_err(io_err(format!("stat {}", from.display())))?;
        let ft = meta.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(from).map_err(io_err(format!("readlink {}", from.display())))?;
            symlink(&target, to).map_err(io_err(format!("symlink {}", to.display())))?;
        } else if ft.is_dir() {
            fs::create_dir(to).map_err(io_err(format!("create {}", to.display())))?;
            for entry in fs::read_dir(from).map_err(io_err(format!("read {}", from.display())))? {
                let entry = entry.map_err(io_err(format!("read {}", from.display())))?;
                walk(&entry.path(), &to.join(entry.file_name()), owner)?;
            }
            fs::set_permissions(to, meta.permissions()).map_err(io_err(format!("chmod {}", to.display())))?;
        } else {
            fs::copy(from, to).map_err(io_err(format!("copy {}", from.display())))?;
        }
        if let Some((uid, gid)) = owner {
            lchown(to, Some(uid), Some(gid)).map_err(io_err(format!("chown {}", to.display())))?;
        }
        Ok(())
    }
    if to.exists()
        && fs::read_dir(to)
            .map_err(io_err(format!("read {}", to.display())))?
            .next()
            .is_some()
    {
        return Err(PgError::State(format!("copy into {}: not empty", to.display())));
    }
    if to.exists() {
        fs::remove_dir(to).map_err(io_err(format!("remove {}", to.display())))?;
    }
    walk(from, to, owner)?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("chmod {}", to.display())))?;
    Ok(())
}

/// `'text'` as an SQL string literal (and a postgresql.conf value).
fn sql_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A libpq connection-string value, quoted.
fn conninfo_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Folders (backups, copies) to remove at exit.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn scratch(dir: &Path) {
    if let Ok(mut s) = SCRATCH.lock() {
        s.push(dir.to_owned());
    }
    register_atexit();
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
    if let Some(lib) = bundled_lib_dir() {
        cmd.env("LD_LIBRARY_PATH", lib);
    }
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
    let dirs = SCRATCH
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default();
    for dir in dirs {
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
