//! The store behind the HTTP API, one folder per backend: [`postgres`] (lockdb, C1's statements,
//! [`Repo`]) and [`etcd`] ([`EtcdRepo`]). Both give the same typed answers with the same meaning of
//! "zero rows", so the handlers, error codes and metrics are one implementation. [`Backend`] is the
//! one the server runs and the only place that tells the two apart: the store operations, the
//! blocking acquire's wait ([`Backend::wait`]), a key's watch feed ([`Backend::watch`]), the
//! store's own metrics ([`Backend::register_metrics`]) and the listener it may need.
//!
//! Here too is what both backends share: the answers (the rows below), the grace of a queue's
//! waiter ([`GRACE`]), why a grant went ([`Cause`]), why a queued waiter woke ([`WakeReason`]),
//! what a watch stream carries ([`Item`]), and the batches' metric families ([`BatchFamilies`]).

pub mod etcd;
pub mod postgres;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dlock_common::FencingToken;
use dlock_wire::lock::{LockEvent, LockEventType, LockState, LockView, SequenceJump};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::etcd::EtcdRepo;
use self::postgres::Repo;
use crate::config::QueueFaults;
use crate::error::Error;

// ---- the answers -------------------------------------------------------------------------------

/// A granted lock: the row C1's acquire returns.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Grant {
    pub fencing_token: i64,
    pub owner_id: String,
    pub session_id: Uuid,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// A renewed grant, with the holder the re-signed grant names.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Renewed {
    pub fencing_token: i64,
    pub expires_at: DateTime<Utc>,
    pub owner_id: String,
    pub session_id: Uuid,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Session {
    pub session_id: Uuid,
    pub owner_id: String,
    pub expires_at: DateTime<Utc>,
}

/// A key's row as the operator read sees it; `expired` is judged by the database clock.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LockRow {
    pub fencing_token: i64,
    pub owner_id: String,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub expired: bool,
}

/// One held key of the listing (`GET /v1/locks`), with its queue length.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ListedRow {
    pub lock_key: String,
    pub fencing_token: i64,
    pub owner_id: String,
    pub session_id: Uuid,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub expired: bool,
    pub waiters: i64,
}

/// The grant a force-revoke removed.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Revoked {
    pub owner_id: String,
    pub fencing_token: i64,
}

/// What a token-pinned force-revoke found. Only [`Revocation::Revoked`] wrote anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    /// The live grant at that token was deleted and audited.
    Revoked(Revoked),
    /// That key and token are already in `lock_revocation`: a retry of a revoke that happened.
    AlreadyRevoked(Revoked),
    /// A live grant with another token holds the key; it was left alone.
    HeldByOtherToken { current_token: i64 },
    /// No live grant holds the key.
    NotHeld,
}

// ---- the blocking acquire ----------------------------------------------------------------------

/// A queue row counts this long after its wait ends (so that a replica's own deadline always comes
/// first); a row a dead replica left behind is skipped after it.
pub const GRACE: Duration = Duration::from_secs(2);

/// One blocking acquire.
#[derive(Debug, Clone)]
pub struct Waiter {
    pub key: String,
    pub owner_id: String,
    pub session_id: Uuid,
    pub ttl_secs: f64,
    pub wait: Duration,
}

/// Why a queued waiter was woken to look again (`lock_wait_wakeups_total{reason}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum WakeReason {
    /// A release, revocation or session end freed the key (or, on etcd, a lapse): the head is woken.
    freed,
    /// The waiter ahead left: this one may be the head.
    head,
    /// The holder's lease was due to end (PostgreSQL: a lapse has no event).
    lease_end,
    /// The waiter ahead was due to lapse (its replica died).
    ahead_lapsed,
    /// Its own place went with its session.
    gone,
    /// The listener reconnected and notifications may have been missed.
    resync,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeLabels {
    pub reason: WakeReason,
}

/// What the queues of both backends count while they wait: the waiters asleep now
/// (`lock_waiting`) and why they woke (`lock_wait_wakeups_total`). Registered with the server's
/// other metrics ([`crate::metrics::Metrics`]), which holds these.
#[derive(Debug, Clone, Default)]
pub struct WaitMetrics {
    /// Blocking acquires asleep in a queue in this process now (waiting for a wake-up or a timer).
    pub waiting: Gauge,
    pub wakeups: Family<WakeLabels, Counter>,
}

impl WaitMetrics {
    /// Counts a waiter as asleep while the guard lives.
    pub fn asleep(&self) -> Asleep<'_> {
        self.waiting.inc();
        Asleep(self)
    }

    pub fn woken(&self, reason: WakeReason) {
        self.wakeups.get_or_create(&WakeLabels { reason }).inc();
    }
}

/// A waiter asleep in a queue ([`WaitMetrics::asleep`]).
#[derive(Debug)]
pub struct Asleep<'a>(&'a WaitMetrics);

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        self.0.waiting.dec();
    }
}

// ---- the watch ---------------------------------------------------------------------------------

/// Why a grant went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Released,
    Revoked,
    Expired,
    SessionEnded,
}

impl Cause {
    fn kind(self) -> LockEventType {
        match self {
            Cause::Released => LockEventType::Released,
            Cause::Revoked => LockEventType::Revoked,
            Cause::Expired => LockEventType::Expired,
            Cause::SessionEnded => LockEventType::SessionEnded,
        }
    }
}

/// What a watch stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// First: the key as it is.
    State(LockView),
    /// Then each change.
    Change(LockEvent),
}

/// The key as a watch's first item shows it: `holder` is its token, owner and whether its lease
/// has lapsed.
fn view_of(key: &str, holder: Option<(i64, String, bool)>) -> LockView {
    match holder.and_then(|(t, o, expired)| FencingToken::new(t).ok().map(|t| (t, o, expired))) {
        None => LockView {
            lock_key: key.to_owned(),
            state: LockState::Free,
            fencing_token: None,
            owner_id: None,
            acquired_at: None,
            expires_at: None,
        },
        Some((token, owner, expired)) => LockView {
            lock_key: key.to_owned(),
            state: if expired {
                LockState::Expired
            } else {
                LockState::Held
            },
            fencing_token: Some(token),
            owner_id: Some(owner),
            acquired_at: None,
            expires_at: None,
        },
    }
}

/// The watch feeds of one server (its state holds them): the PostgreSQL backend's, one per watched
/// key; etcd needs none (each watch is an etcd watch of its own).
#[derive(Debug, Default)]
pub struct Feeds {
    postgres: Arc<postgres::feed::Feeds>,
}

fn event(
    key: &str,
    kind: LockEventType,
    token: i64,
    owner: Option<String>,
    expires_at: Option<DateTime<Utc>>,
) -> Option<LockEvent> {
    Some(LockEvent {
        kind,
        lock_key: key.to_owned(),
        fencing_token: FencingToken::new(token).ok()?,
        owner_id: owner,
        expires_at,
    })
}

// ---- the batches' metrics ----------------------------------------------------------------------

/// Where a batched call's time goes, per statement (`statement="acquire"|"release"`), as lock-server
/// exports it (`lock_batch_wait_seconds`, `lock_batch_statement_seconds`, `lock_batch_calls`): the
/// wait in the queue for a batch to take it, the round trip of the statement that carried it, and
/// how many calls each statement carried. The rest of a request's time is the HTTP path's. lockdb's
/// batches observe acquires and releases ([`postgres::batch`]), etcd's its release transactions
/// ([`etcd::batch`]).
#[derive(Debug, Clone)]
pub struct BatchFamilies {
    pub waited: HistogramFamily,
    pub statement: HistogramFamily,
    pub calls: HistogramFamily,
    /// Statements that carried a batch of each kind ([`postgres::batch::Pair`]), counted once.
    pub paired: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatementLabels {
    pub statement: String,
}

pub type HistogramFamily = Family<StatementLabels, Histogram, fn() -> Histogram>;

fn seconds() -> Histogram {
    // 20 µs … ~0.7 s.
    Histogram::new(exponential_buckets(0.000_02, 2.0, 16))
}

fn sizes() -> Histogram {
    // 1, 2, 4, … 32 (MAX_BATCH).
    Histogram::new(exponential_buckets(1.0, 2.0, 6))
}

impl Default for BatchFamilies {
    fn default() -> Self {
        Self {
            waited: Family::new_with_constructor(seconds),
            statement: Family::new_with_constructor(seconds),
            calls: Family::new_with_constructor(sizes),
            paired: Counter::default(),
        }
    }
}

impl BatchFamilies {
    /// The batches' histograms: lockdb's statements, or etcd's release transactions.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "lock_batch_wait_seconds",
            "A batched call's wait in the queue until a batch takes it, by statement",
            self.waited.clone(),
        );
        registry.register(
            "lock_batch_statement_seconds",
            "Per call: the round trip to the store of the statement (etcd: transaction) that carried it (a batch, or the call alone), by statement",
            self.statement.clone(),
        );
        registry.register(
            "lock_batch_calls",
            "Calls carried by one statement to lockdb (etcd: one transaction), by statement",
            self.calls.clone(),
        );
    }
}

// ---- the backend -------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub enum Backend {
    Postgres(Repo),
    Etcd(EtcdRepo),
}

macro_rules! delegate {
    ($self:ident, $name:ident ( $($arg:expr),* )) => {
        match $self {
            Backend::Postgres(r) => r.$name($($arg),*).await,
            Backend::Etcd(r) => r.$name($($arg),*).await,
        }
    };
}

impl Backend {
    /// The PostgreSQL repository, if that is the backend (tests inspect lockdb through it).
    pub fn postgres(&self) -> Option<&Repo> {
        match self {
            Backend::Postgres(r) => Some(r),
            Backend::Etcd(_) => None,
        }
    }

    pub fn etcd(&self) -> Option<&EtcdRepo> {
        match self {
            Backend::Etcd(r) => Some(r),
            Backend::Postgres(_) => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Postgres(_) => "postgres",
            Backend::Etcd(_) => "etcd",
        }
    }

    pub async fn create_session(&self, owner_id: &str, ttl_secs: f64) -> Result<Session, Error> {
        delegate!(self, create_session(owner_id, ttl_secs))
    }

    pub async fn heartbeat(&self, session_id: Uuid, ttl_secs: f64) -> Result<Option<DateTime<Utc>>, Error> {
        delegate!(self, heartbeat(session_id, ttl_secs))
    }

    pub async fn close_session(&self, session_id: Uuid) -> Result<bool, Error> {
        delegate!(self, close_session(session_id))
    }

    pub async fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
    ) -> Result<Option<Grant>, Error> {
        delegate!(self, acquire(key, owner_id, session_id, ttl_secs))
    }

    pub async fn renew(&self, key: &str, token: i64, ttl_secs: f64) -> Result<Option<Renewed>, Error> {
        delegate!(self, renew(key, token, ttl_secs))
    }

    pub async fn release(&self, key: &str, token: i64) -> Result<bool, Error> {
        delegate!(self, release(key, token))
    }

    /// The owner id a session was opened for (`None`: no such session). One read; writes nothing.
    pub async fn session_owner(&self, session_id: Uuid) -> Result<Option<String>, Error> {
        delegate!(self, session_owner(session_id))
    }

    /// The owner of the grant at `key` and `token` (`None`: no such grant). One read; writes nothing.
    pub async fn grant_owner(&self, key: &str, token: i64) -> Result<Option<String>, Error> {
        delegate!(self, grant_owner(key, token))
    }

    pub async fn read(&self, key: &str) -> Result<Option<LockRow>, Error> {
        delegate!(self, read(key))
    }

    pub async fn revoke(&self, key: &str, operator: &str, reason: &str) -> Result<Option<Revoked>, Error> {
        delegate!(self, revoke(key, operator, reason))
    }

    pub async fn revoke_pinned(
        &self,
        key: &str,
        token: i64,
        operator: &str,
        reason: &str,
    ) -> Result<Revocation, Error> {
        delegate!(self, revoke_pinned(key, token, operator, reason))
    }

    /// One page of held keys starting with `prefix`, after `after` (`""`: the first page).
    pub async fn list(&self, prefix: &str, after: &str, limit: i64) -> Result<Vec<ListedRow>, Error> {
        delegate!(self, list(prefix, after, limit))
    }

    pub async fn reap(&self) -> Result<u64, Error> {
        delegate!(self, reap())
    }

    pub async fn ping(&self) -> Result<(), Error> {
        delegate!(self, ping())
    }

    /// Closes the PostgreSQL pools; the etcd channel closes when the last clone drops.
    pub async fn close(&self) {
        if let Backend::Postgres(r) = self {
            r.close().await;
        }
    }

    /// Waits in `w.key`'s queue until `deadline` (the server's bound already applied): `Some`
    /// granted, `None` the wait ended (CONTENDED). PostgreSQL queues in lockdb
    /// ([`postgres::wait`]), etcd in waiter keys ([`etcd::wait`]).
    /// Whether nobody is queued for `key` ([`crate::queue`]'s fast path).
    pub async fn queue_empty(&self, key: &str) -> Result<bool, Error> {
        delegate!(self, queue_empty(key))
    }

    pub async fn wait(
        &self,
        w: &Waiter,
        deadline: Instant,
        faults: QueueFaults,
        cancel: &CancellationToken,
        metrics: &WaitMetrics,
    ) -> Result<Option<Grant>, Error> {
        delegate!(self, wait(w, deadline, faults, cancel, metrics))
    }

    /// Starts a watch of `key` (already validated): `tx` is sent the key's state, then its changes,
    /// until `ends` or until the receiver goes. PostgreSQL shares one feed per key among this
    /// process's watchers ([`postgres::feed`], kept in `feeds`), etcd watches the grant key
    /// ([`etcd::feed`]).
    pub async fn watch(
        &self,
        feeds: &Feeds,
        key: String,
        tx: mpsc::Sender<Item>,
        ends: Instant,
    ) -> Result<(), Error> {
        match self {
            Backend::Postgres(r) => feeds.postgres.subscribe(r, key, tx, ends).await,
            Backend::Etcd(r) => r.watch(key, tx, ends).await,
        }
    }

    /// The store's own metrics, exported as they are counted (the registry holds the same histograms
    /// and counters the store updates):
    ///
    /// - PostgreSQL, per batched statement (`statement="acquire"|"release"`):
    ///   `lock_batch_wait_seconds` (a call's wait in the queue until a batch takes it),
    ///   `lock_batch_statement_seconds` (per call, the round trip of the statement that carried it) and
    ///   `lock_batch_calls` (calls per statement) — where an acquire's time goes, next to
    ///   `http_request_duration_seconds` — and `lock_batch_paired_total` (statements that carried
    ///   both kinds at once, counted under both in `lock_batch_calls`);
    /// - etcd: the same three histograms for `statement="release"`, whose concurrent calls share one
    ///   transaction ([`etcd::batch`]), and `lock_etcd_grant_leases_total{source="granted"|"reused"}`
    ///   (a new lease from etcd, or a released grant's lease kept alive for the session's next grant).
    pub fn register_metrics(&self, registry: &mut Registry) {
        match self {
            Backend::Postgres(r) => r.register_metrics(registry),
            Backend::Etcd(r) => r.register_metrics(registry),
        }
    }

    /// Starts what the backend needs to hear the store (PostgreSQL: the one `LISTEN` connection that
    /// wakes waiters and feeds watches, stopped by `cancel`); etcd pushes by itself.
    pub fn listen(&self, faults: QueueFaults, cancel: CancellationToken) -> Option<JoinHandle<()>> {
        match self {
            Backend::Postgres(r) => Some(r.hub().start(faults, cancel)),
            Backend::Etcd(_) => None,
        }
    }

    /// Whether this replica jumps the fencing sequence before granting on a history it cannot vouch
    /// for, and its last jump (PostgreSQL only: etcd's revision is its token, never jumped).
    pub fn sequence_jumps(&self) -> (bool, Option<SequenceJump>) {
        match self {
            Backend::Postgres(r) => (r.epochs().enabled(), r.epochs().last()),
            Backend::Etcd(_) => (false, None),
        }
    }
}
