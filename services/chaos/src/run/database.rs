//! A PostgreSQL 16 database of the campaign ([`Database`]): alone, or a primary with a streaming
//! standby behind a [`TcpLink`] for the failover nemesis; crashed, restarted and failed over.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use dlock_testkit::served;
use dlock_testkit::{History, PgServer};
use sqlx::Connection;
use tokio::time::Instant;

use crate::nemesis::Replication;
use crate::proxy::Recorder;
use crate::tcp::TcpLink;

/// A PostgreSQL 16 database, migrated. Alone, one server that its clients reach directly; the
/// database nemesis crashes and restarts it. Replicated (for the failover nemesis), a primary with
/// a streaming standby on loopback (pg_basebackup), and its clients reach the primary through a
/// [`TcpLink`] that a failover re-points to the promoted standby. The servers sit behind a lock so
/// that the nemeses can drive them from blocking threads.
pub(super) struct Database {
    history: History,
    /// The port every client is given: the server's own, or the link's.
    port: u16,
    nodes: Arc<std::sync::Mutex<Nodes>>,
    link: Option<TcpLink>,
    replication: Option<Replication>,
}

/// The servers of one database: the primary, and its standby when replicated.
pub(super) struct Nodes {
    primary: PgServer,
    standby: Option<PgServer>,
    /// The number of the next server started (node 0 is the first primary).
    next: u32,
}

/// How long a failover waits for a standby to stream (and, synchronous, to be the synchronous one).
pub(super) const STREAMING_LIMIT: Duration = Duration::from_secs(60);

/// How long an asynchronous failover waits for the record to show writes the held standby lacks.
pub(super) const LAG_LIMIT: Duration = Duration::from_secs(30);

/// Tokens past lockdb's sequence at the hold that must have been granted before the primary is
/// killed: nextval WAL-logs 32 values ahead (`SEQ_LOG_VALS`), so a standby held at sequence value
/// `v` may resume at up to `v + 33`; twice that is a token the promoted standby will issue again.
pub(super) const LOST_TOKENS: i64 = 64;

/// Acknowledged posts after the hold before a held paydb standby's primary is killed.
pub(super) const LOST_POSTS: u64 = 5;

impl Database {
    /// The label of server `n` of `history`'s database, also its `application_name` as a standby.
    pub(super) fn node_label(history: History, n: u32) -> String {
        format!("chaos_{}_{n}", history.name())
    }

    /// Server `n`'s settings. Committed means committed: the nemeses crash these servers, and the
    /// test kit's default (synchronous_commit=off) would lose acknowledged transactions in a crash.
    /// Synchronous replication: server `n`, once primary, waits for its standby, server `n + 1`.
    pub(super) fn node_settings(
        history: History,
        n: u32,
        replication: Option<Replication>,
    ) -> Vec<(String, String)> {
        let mut out = vec![("synchronous_commit".to_owned(), "on".to_owned())];
        if replication.is_some() {
            // A standby whose primary restarted (the database nemesis) streams again within half
            // a second, not the default 5 s (with synchronous replication the primary's commits
            // wait for it meanwhile).
            out.push(("wal_retrieve_retry_interval".to_owned(), "500ms".to_owned()));
        }
        if replication == Some(Replication::Sync) {
            out.push((
                "synchronous_standby_names".to_owned(),
                Self::node_label(history, n + 1),
            ));
        }
        out
    }

    pub(super) async fn start(history: History, replication: Option<Replication>) -> Result<Self> {
        let label = if replication.is_some() {
            Self::node_label(history, 0)
        } else {
            format!("chaos-{}", history.name())
        };
        let settings = Self::node_settings(history, 0, replication);
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        // Set up before its standby exists, committing locally (the standby's base backup then
        // carries it all).
        let (server, _) = served::start(&label, &settings, history).await?;
        let mut nodes = Nodes {
            primary: server,
            standby: None,
            next: 1,
        };
        let (port, link) = match replication {
            None => (nodes.primary.port, None),
            Some(mode) => {
                let (nodes_back, standby) = tokio::task::spawn_blocking(move || {
                    let r = Self::new_standby(history, &mut nodes, mode);
                    (nodes, r)
                })
                .await?;
                nodes = nodes_back;
                standby?;
                let link = TcpLink::start(&format!("{}-primary", history.name()), nodes.primary.port).await?;
                (link.port, Some(link))
            }
        };
        let db = Self {
            history,
            port,
            nodes: Arc::new(std::sync::Mutex::new(nodes)),
            link,
            replication,
        };
        if replication.is_some() {
            db.wait_streaming().await?;
        }
        Ok(db)
    }

    /// Builds the next standby of the primary (pg_basebackup, streaming; blocking).
    pub(super) fn new_standby(history: History, nodes: &mut Nodes, mode: Replication) -> Result<()> {
        let n = nodes.next;
        let label = Self::node_label(history, n);
        let settings = Self::node_settings(history, n, Some(mode));
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let standby = PgServer::start_standby(&nodes.primary, &label, &settings)
            .map_err(|e| anyhow!("a standby {label} of {}: {e}", history.name()))?;
        nodes.next += 1;
        nodes.standby = Some(standby);
        Ok(())
    }

    pub(super) fn url(&self, user: &str) -> String {
        format!(
            "postgres://{user}@127.0.0.1:{}/{}",
            self.port,
            self.history.name()
        )
    }

    pub(super) fn app_url(&self) -> String {
        self.url(self.history.app_role())
    }

    pub(super) fn admin_url(&self) -> String {
        self.url("postgres")
    }

    /// The primary's own address (not through the link), and its standby's label.
    pub(super) fn primary(&self) -> (String, Option<String>) {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        (
            nodes.primary.url("postgres", self.history.name()),
            nodes
                .standby
                .as_ref()
                .map(|_| Self::node_label(self.history, nodes.next - 1)),
        )
    }

    /// `pg_ctl stop -m immediate` of the primary, `down` of nothing, start again on the same port
    /// and data (a standby reconnects by itself).
    pub(super) async fn crash_and_restart(&self, down: Duration) -> Result<()> {
        let nodes = self.nodes.clone();
        tokio::task::spawn_blocking(move || {
            let mut n = nodes.lock().unwrap_or_else(|p| p.into_inner());
            n.primary.crash();
            std::thread::sleep(down);
            n.primary.restart()
        })
        .await??;
        Ok(())
    }

    /// Waits (bounded) until the standby streams from the primary, and with synchronous
    /// replication until it is the synchronous standby: only then does a failover lose nothing.
    pub(super) async fn wait_streaming(&self) -> Result<()> {
        let (url, Some(label)) = self.primary() else {
            bail!("{} has no standby", self.history.name());
        };
        let sync = self.replication == Some(Replication::Sync);
        let deadline = Instant::now() + STREAMING_LIMIT;
        loop {
            let row: Result<Option<(String, String)>> = async {
                let mut c = sqlx::PgConnection::connect(&url).await?;
                Ok(sqlx::query_as(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
                )
                .bind(&label)
                .fetch_optional(&mut c)
                .await?)
            }
            .await;
            let last = match row {
                Ok(Some((state, sync_state))) => {
                    if state == "streaming" && (!sync || sync_state == "sync") {
                        return Ok(());
                    }
                    format!("{state}, {sync_state}")
                }
                Ok(None) => "not connected".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{}'s standby {label} did not stream{} within {} s (last: {last})",
                    self.history.name(),
                    if sync { " synchronously" } else { "" },
                    STREAMING_LIMIT.as_secs()
                );
            }
            // Another server's replication state: there is nothing to await but a new look.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// lockdb's sequence on the primary itself.
    pub(super) async fn primary_sequence(&self) -> Result<i64> {
        let (url, _) = self.primary();
        let mut c = sqlx::PgConnection::connect(&url).await?;
        let (v,): (i64,) = sqlx::query_as("SELECT last_value FROM fencing_token_seq")
            .fetch_one(&mut c)
            .await?;
        Ok(v)
    }

    /// The failover: (asynchronous) hold the standby behind until the record shows writes it
    /// lacks; kill the primary; promote the standby; build it a new standby; point the link at it
    /// no sooner than `down` after the kill. What happened, for the record of faults.
    pub(super) async fn failover(
        &self,
        lag: Option<Duration>,
        down: Duration,
        recorder: &Recorder,
    ) -> Result<String> {
        let link = self
            .link
            .as_ref()
            .ok_or_else(|| anyhow!("{} is not replicated", self.history.name()))?;
        let mode = self
            .replication
            .ok_or_else(|| anyhow!("{} is not replicated", self.history.name()))?;
        self.wait_streaming().await?;
        let mut note = Vec::new();
        if let Some(lag) = lag {
            let held_at = Instant::now();
            let nodes = self.nodes.clone();
            tokio::task::spawn_blocking(move || {
                let mut n = nodes.lock().unwrap_or_else(|p| p.into_inner());
                match n.standby.as_mut() {
                    Some(s) => s
                        .hold_behind()
                        .map_err(|e| anyhow!("hold the standby behind: {e}")),
                    None => Err(anyhow!("no standby")),
                }
            })
            .await??;
            // Acknowledged writes the standby cannot have: awaited on the record, not guessed.
            let (reached, what) = match self.history {
                History::Lockdb => {
                    let at_hold = self.primary_sequence().await?;
                    let want = at_hold + LOST_TOKENS;
                    let (seen, reached) = recorder
                        .wait_for(LAG_LIMIT, |s| s.highest_grant.is_some_and(|t| t >= want))
                        .await;
                    (
                        reached,
                        format!(
                            "sequence {at_hold} at the hold, then granted up to token {}",
                            seen.highest_grant.map_or("none".into(), |t| t.to_string())
                        ),
                    )
                }
                History::Paydb => {
                    let before = recorder.seen().posts;
                    let (seen, reached) = recorder
                        .wait_for(LAG_LIMIT, |s| s.posts >= before + LOST_POSTS)
                        .await;
                    (
                        reached,
                        format!("{} posts acknowledged after the hold", seen.posts - before),
                    )
                }
            };
            tokio::time::sleep_until(held_at + lag).await;
            note.push(format!(
                "standby held behind {:.1} s: {what}{}",
                held_at.elapsed().as_secs_f64(),
                if reached { "" } else { " (fewer than awaited)" }
            ));
        }
        let killed = Instant::now();
        let nodes = self.nodes.clone();
        let history = self.history;
        let new_port = tokio::task::spawn_blocking(move || -> Result<u16> {
            let mut n = nodes.lock().unwrap_or_else(|p| p.into_inner());
            if n.standby.is_none() {
                bail!("no standby to promote");
            }
            n.primary.crash();
            n.standby
                .as_mut()
                .ok_or_else(|| anyhow!("no standby to promote"))?
                .promote()
                .map_err(|e| anyhow!("promote the standby: {e}"))?;
            let Some(standby) = n.standby.take() else {
                bail!("no standby to promote");
            };
            // The old primary's data goes with it: it is not rejoined (that would be pg_rewind).
            let _old = std::mem::replace(&mut n.primary, standby);
            Self::new_standby(history, &mut n, mode)?;
            Ok(n.primary.port)
        })
        .await??;
        let rebuilt = killed.elapsed();
        tokio::time::sleep_until(killed + down).await;
        link.repoint(new_port);
        note.push(format!(
            "promoted and a new standby built in {:.1} s, clients followed {:.1} s after the kill",
            rebuilt.as_secs_f64(),
            killed.elapsed().as_secs_f64()
        ));
        self.wait_streaming().await?;
        Ok(note.join("; "))
    }
}
