//! lockdb access: one method per statement of [`super::sql`], results as typed rows. Zero rows is
//! returned as `None`/`false`; what it means (CONTENDED, LEASE_EXPIRED, stale, SESSION_GONE) is
//! decided by the caller, as C1's "zero rows means / caller must" tables say.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Arguments, FromRow, PgPool};
use uuid::Uuid;

use prometheus_client::registry::Registry;

use super::batch::{self, BatchFaults, BatchStats, BatchTimes, Batcher, Call, InFlight, Pair};
use super::conns::Conns;
use super::epoch::Epochs;
use super::hub::Hub;
use super::sql::{self, Statements};
use crate::error::Error;
use crate::store::{BatchFamilies, Grant, ListedRow, LockRow, Renewed, Revocation, Revoked, Session};

/// A watch feed's read of a key ([`sql::WATCH_READ`]).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Watched {
    pub fencing_token: i64,
    pub owner_id: String,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub expired: bool,
    pub left_secs: f64,
}

/// Where a queued waiter stands ([`sql::WAITER_POSITION`]).
#[derive(Debug, Clone, Copy, PartialEq, sqlx::FromRow)]
pub struct Position {
    /// `false`: the row went with its session.
    pub present: bool,
    /// Seconds left of the live waiter just ahead; `None`: this waiter is the head.
    pub ahead_secs: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Repo {
    pool: PgPool,
    stmts: Statements,
    /// `stmts.renew` inside [`sql::with_holder`], built once.
    renew: Arc<str>,
    /// Concurrent acquires and releases go to lockdb batched ([`super::batch`]), each batch built
    /// from `stmts`, so a negative control's broken statement is what its batches run too.
    acquires: Arc<Batcher<AcquireCall>>,
    releases: Arc<Batcher<ReleaseCall>>,
    /// The two batchers' batches as one statement when both kinds are queued; held here, the
    /// batchers hold it weakly.
    pair: Option<Arc<Pair<AcquireCall, ReleaseCall>>>,
    /// The one bound on both batchers' statements in flight.
    in_flight: Arc<InFlight>,
    /// The connections both batchers' statements run on, one per slot of `in_flight`
    /// ([`batch::own_pool`]).
    batch_pool: Arc<Conns>,
    /// The histograms both batchers observe into.
    batches: BatchFamilies,
    /// The lockdb history the batches' connections were vouched for, and the jumps
    /// ([`super::epoch`]).
    epochs: Arc<Epochs>,
    /// The process's listener (started by the server; a repository used alone never starts it, and
    /// then no key counts as watched).
    hub: Arc<Hub>,
}

/// One acquire, bound as C1 §1.3 documents: key, owner, session, TTL.
pub(crate) struct AcquireCall {
    key: String,
    owner_id: String,
    session_id: Uuid,
    ttl_secs: f64,
}

impl Call for AcquireCall {
    type Out = Option<Grant>;
    const BINDS: usize = 4;

    fn key(&self) -> &str {
        &self.key
    }

    fn bind(&self, args: &mut PgArguments) -> Result<(), BoxDynError> {
        args.add(self.key.as_str())?;
        args.add(self.owner_id.as_str())?;
        args.add(self.session_id)?;
        args.add(self.ttl_secs)
    }

    const TYPES: &'static [&'static str] = &["text", "text", "uuid", "float8"];

    fn bind_columns(calls: &[&Self], args: &mut PgArguments) -> Result<(), BoxDynError> {
        args.add(calls.iter().map(|c| c.key.as_str()).collect::<Vec<_>>())?;
        args.add(calls.iter().map(|c| c.owner_id.as_str()).collect::<Vec<_>>())?;
        args.add(calls.iter().map(|c| c.session_id).collect::<Vec<_>>())?;
        args.add(calls.iter().map(|c| c.ttl_secs).collect::<Vec<_>>())
    }

    fn outcome(row: Option<&PgRow>) -> Result<Option<Grant>, sqlx::Error> {
        row.map(Grant::from_row).transpose()
    }
}

/// One release, bound as C1 §1.4 documents: key, token.
pub(crate) struct ReleaseCall {
    key: String,
    token: i64,
}

impl Call for ReleaseCall {
    type Out = bool;
    const BINDS: usize = 2;

    fn key(&self) -> &str {
        &self.key
    }

    fn bind(&self, args: &mut PgArguments) -> Result<(), BoxDynError> {
        args.add(self.key.as_str())?;
        args.add(self.token)
    }

    const TYPES: &'static [&'static str] = &["text", "int8"];

    fn bind_columns(calls: &[&Self], args: &mut PgArguments) -> Result<(), BoxDynError> {
        args.add(calls.iter().map(|c| c.key.as_str()).collect::<Vec<_>>())?;
        args.add(calls.iter().map(|c| c.token).collect::<Vec<_>>())
    }

    fn outcome(row: Option<&PgRow>) -> Result<bool, sqlx::Error> {
        Ok(row.is_some())
    }
}

impl Repo {
    /// The repository with the contract's statements: the only constructor production code uses.
    pub fn new(pool: PgPool) -> Self {
        Self::with_statements(pool, Statements::C1)
    }

    /// For negative controls only: the same repository running a deliberately different statement set.
    pub fn with_statements(pool: PgPool, stmts: Statements) -> Self {
        Self::with_faults(pool, stmts, BatchFaults::NONE)
    }

    /// For negative controls only: the repository with deliberately broken batching.
    pub fn with_batch_faults(pool: PgPool, faults: BatchFaults) -> Self {
        Self::with_faults(pool, Statements::C1, faults)
    }

    fn with_faults(pool: PgPool, stmts: Statements, faults: BatchFaults) -> Self {
        let batches = BatchFamilies::default();
        let in_flight = InFlight::new();
        let epochs = Arc::new(Epochs::new(stmts.jump));
        let batch_pool = batch::own_pool(&pool, &epochs);
        let acquires = Batcher::new(
            batch_pool.clone(),
            stmts.acquire,
            BatchTimes::of(&batches, "acquire"),
            &in_flight,
        );
        let releases = Batcher::new(
            batch_pool.clone(),
            stmts.release,
            BatchTimes::of(&batches, "release"),
            &in_flight,
        );
        // Their batches share statements from now on (`None`: a negative control's statement of
        // another shape, whose batches run apart).
        let pair = Pair::join(&acquires, &releases, faults);
        Self {
            acquires,
            releases,
            pair,
            batch_pool,
            epochs,
            in_flight,
            batches,
            renew: sql::with_holder(stmts.renew).into(),
            hub: Arc::new(Hub::new(pool.clone())),
            pool,
            stmts,
        }
    }

    /// What this process vouched for and its last jump of the sequence.
    pub fn epochs(&self) -> &Epochs {
        &self.epochs
    }

    /// How acquires were sent to lockdb (statements, calls, largest batch), for tests and benchmarks.
    pub fn acquire_batches(&self) -> BatchStats {
        self.acquires.stats()
    }

    /// Whether acquire and release batches share statements ([`super::batch::Pair`]): always with
    /// C1's statements; for tests.
    pub fn pairs_batches(&self) -> bool {
        self.pair.is_some()
    }

    /// Where batched calls' time goes, per statement (exported with the server's metrics:
    /// [`Repo::register_metrics`]).
    pub fn batch_families(&self) -> &BatchFamilies {
        &self.batches
    }

    /// As [`Repo::acquire_batches`], for releases.
    pub fn release_batches(&self) -> BatchStats {
        self.releases.stats()
    }

    /// The most acquire and release statements that were in flight at once (bounded together by
    /// [`super::batch::MAX_IN_FLIGHT`]), for tests.
    pub fn most_batches_in_flight(&self) -> usize {
        self.in_flight.most()
    }

    /// The lockdb connections open now: the shared pool's and the batches' own
    /// ([`super::batch::MAX_IN_FLIGHT`] at most), for tests.
    pub fn connections(&self) -> (u32, u32) {
        (self.pool.size(), self.batch_pool.size())
    }

    /// Closes the shared pool and the batches' own connections.
    pub async fn close(&self) {
        self.pool.close().await;
        self.batch_pool.close().await;
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The process's listener of lockdb's notifications.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The batch timings and the sequence jumps ([`crate::store::Backend::register_metrics`]).
    pub fn register_metrics(&self, registry: &mut Registry) {
        let b = self.batch_families();
        b.register(registry);
        registry.register(
            "lock_sequence_jumps",
            "Jumps of fencing_token_seq before any grant on a lockdb history this process could not vouch for, by cause (start, new_system, new_timeline, postmaster_restart)",
            self.epochs().jumps().clone(),
        );
        registry.register(
            "lock_batch_paired",
            "Statements to lockdb that carried a batch of acquires and a batch of releases together (counted in lock_batch_calls under both)",
            b.paired.clone(),
        );
    }

    pub fn statements(&self) -> Statements {
        self.stmts
    }

    pub async fn create_session(&self, owner_id: &str, ttl_secs: f64) -> Result<Session, Error> {
        Ok(sqlx::query_as(sql::CREATE_SESSION)
            .bind(owner_id)
            .bind(ttl_secs)
            .fetch_one(&self.pool)
            .await?)
    }

    /// `None`: the session was reaped or has expired.
    pub async fn heartbeat(&self, session_id: Uuid, ttl_secs: f64) -> Result<Option<DateTime<Utc>>, Error> {
        Ok(sqlx::query_scalar(self.stmts.heartbeat)
            .bind(session_id)
            .bind(ttl_secs)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// `false`: there was no such session (already closed or reaped).
    pub async fn close_session(&self, session_id: Uuid) -> Result<bool, Error> {
        let done = sqlx::query(sql::CLOSE_SESSION)
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// `None`: held by a live, different holder (CONTENDED). An unknown session is
    /// [`Error::SessionGone`] (the foreign key refuses the row).
    pub async fn acquire(
        &self,
        key: &str,
        owner_id: &str,
        session_id: Uuid,
        ttl_secs: f64,
    ) -> Result<Option<Grant>, Error> {
        let grant = self
            .acquires
            .call(AcquireCall {
                key: key.to_owned(),
                owner_id: owner_id.to_owned(),
                session_id,
                ttl_secs,
            })
            .await?;
        // Only a grant of a watched key is told (one atomic load when nothing is watched): the
        // other replicas' watchers learn of it from lockdb, not by polling.
        if let Some(g) = &grant
            && self.hub.is_watched(key)
        {
            self.notify_granted(key, g, ttl_secs).await;
        }
        Ok(grant)
    }

    async fn notify_granted(&self, key: &str, g: &Grant, ttl_secs: f64) {
        let payload = serde_json::json!({
            "e": "granted", "k": key, "t": g.fencing_token, "o": g.owner_id, "l": ttl_secs,
        });
        if let Err(e) = sqlx::query(sql::NOTIFY_GRANTED)
            .bind(payload.to_string())
            .execute(&self.pool)
            .await
        {
            // The grant stands; watchers learn of it with its end instead (the freed notification
            // carries the token and owner).
            tracing::warn!(event = "watch_notify_failed", lock_key = %key, error = %e);
        }
    }

    /// Joins the key's queue; returns the waiter's id (its place). An unknown session is
    /// [`Error::SessionGone`].
    pub async fn enqueue_waiter(
        &self,
        key: &str,
        session_id: Uuid,
        owner_id: &str,
        lasts_secs: f64,
    ) -> Result<i64, Error> {
        Ok(sqlx::query_scalar(sql::ENQUEUE_WAITER)
            .bind(key)
            .bind(session_id)
            .bind(owner_id)
            .bind(lasts_secs)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Where waiter `id` of `key` stands; `lifo` is a negative control's broken order.
    pub async fn waiter_position(&self, key: &str, id: i64, lifo: bool) -> Result<Position, Error> {
        let stmt = if lifo {
            sql::WAITER_POSITION_LIFO
        } else {
            sql::WAITER_POSITION
        };
        Ok(sqlx::query_as(stmt)
            .bind(key)
            .bind(id)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Whether nobody is queued for `key` ([`sql::QUEUE_EMPTY`]).
    pub async fn queue_empty(&self, key: &str) -> Result<bool, Error> {
        Ok(sqlx::query_scalar(sql::QUEUE_EMPTY)
            .bind(key)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Seconds left of the key's grant by the database clock; `None`: the key is free.
    pub async fn holder_left(&self, key: &str) -> Result<Option<f64>, Error> {
        Ok(sqlx::query_scalar(sql::HOLDER_LEFT)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    pub async fn dequeue_waiter(&self, id: i64) -> Result<(), Error> {
        sqlx::query(sql::DEQUEUE_WAITER)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Registers a watch of `key` for `lasts_secs`; returns its id.
    pub async fn add_watch(&self, key: &str, lasts_secs: f64) -> Result<i64, Error> {
        Ok(sqlx::query_scalar(sql::ADD_WATCH)
            .bind(key)
            .bind(lasts_secs)
            .fetch_one(&self.pool)
            .await?)
    }

    pub async fn watch_read(&self, key: &str) -> Result<Option<Watched>, Error> {
        Ok(sqlx::query_as(sql::WATCH_READ)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    pub async fn drop_watch(&self, id: i64) -> Result<(), Error> {
        sqlx::query(sql::DROP_WATCH).bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// One page of held keys after `after`, with their queue lengths.
    pub async fn list(&self, prefix: &str, after: &str, limit: i64) -> Result<Vec<ListedRow>, Error> {
        Ok(sqlx::query_as(sql::LIST_LOCKS)
            .bind(prefix)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// `None`: the lease lapsed or the row belongs to a newer token (LEASE_EXPIRED).
    pub async fn renew(&self, key: &str, token: i64, ttl_secs: f64) -> Result<Option<Renewed>, Error> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(self.renew.clone()))
            .bind(key)
            .bind(token)
            .bind(ttl_secs)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// `false`: the grant is no longer ours (a stale release).
    pub async fn release(&self, key: &str, token: i64) -> Result<bool, Error> {
        self.releases
            .call(ReleaseCall {
                key: key.to_owned(),
                token,
            })
            .await
    }

    /// The owner id the session was opened for; `None`: no such session (closed or reaped).
    pub async fn session_owner(&self, session_id: Uuid) -> Result<Option<String>, Error> {
        Ok(sqlx::query_scalar(sql::SESSION_OWNER)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The owner of the grant at `key` and `token`; `None`: that grant is gone (or never was).
    pub async fn grant_owner(&self, key: &str, token: i64) -> Result<Option<String>, Error> {
        Ok(sqlx::query_scalar(sql::GRANT_OWNER)
            .bind(key)
            .bind(token)
            .fetch_optional(&self.pool)
            .await?)
    }

    pub async fn read(&self, key: &str) -> Result<Option<LockRow>, Error> {
        Ok(sqlx::query_as(sql::READ_LOCK)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Deletes the key's live grant and appends the audit row, in one transaction. `None`: nothing
    /// was held, and nothing is written.
    pub async fn revoke(&self, key: &str, operator: &str, reason: &str) -> Result<Option<Revoked>, Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(sql::MARK_REVOKE).execute(&mut *tx).await?;
        let revoked: Option<Revoked> = sqlx::query_as(sql::REVOKE_GRANT)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(r) = &revoked {
            sqlx::query(sql::INSERT_REVOCATION)
                .bind(key)
                .bind(&r.owner_id)
                .bind(r.fencing_token)
                .bind(operator)
                .bind(reason)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(revoked)
    }

    /// Deletes the key's live grant only if it carries `token`, appending the audit row in the same
    /// transaction; otherwise says why not, writing nothing. The operator only ever uses this form.
    pub async fn revoke_pinned(
        &self,
        key: &str,
        token: i64,
        operator: &str,
        reason: &str,
    ) -> Result<Revocation, Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(sql::MARK_REVOKE).execute(&mut *tx).await?;
        let revoked: Option<Revoked> = sqlx::query_as(sql::REVOKE_PINNED_GRANT)
            .bind(key)
            .bind(token)
            .fetch_optional(&mut *tx)
            .await?;
        let outcome = match revoked {
            Some(r) => {
                sqlx::query(sql::INSERT_REVOCATION)
                    .bind(key)
                    .bind(&r.owner_id)
                    .bind(r.fencing_token)
                    .bind(operator)
                    .bind(reason)
                    .execute(&mut *tx)
                    .await?;
                Revocation::Revoked(r)
            }
            None => {
                let before: Option<Revoked> = sqlx::query_as(sql::FIND_REVOCATION)
                    .bind(key)
                    .bind(token)
                    .fetch_optional(&mut *tx)
                    .await?;
                let current: Option<LockRow> = sqlx::query_as(sql::READ_LOCK)
                    .bind(key)
                    .fetch_optional(&mut *tx)
                    .await?;
                match (before, current) {
                    (Some(r), _) => Revocation::AlreadyRevoked(r),
                    (None, Some(row)) if !row.expired && row.fencing_token != token => {
                        Revocation::HeldByOtherToken {
                            current_token: row.fencing_token,
                        }
                    }
                    _ => Revocation::NotHeld,
                }
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Deletes expired sessions (their locks go by the cascade); returns how many.
    pub async fn reap(&self) -> Result<u64, Error> {
        let done = sqlx::query(sql::REAP_SESSIONS).execute(&self.pool).await?;
        // Queue rows and watches a dead replica left behind, once they lapsed.
        sqlx::query(sql::REAP_WAITERS).execute(&self.pool).await?;
        sqlx::query(sql::REAP_WATCHES).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }

    /// Readiness: a statement on the shared pool and one on the batches' own connections, so
    /// "ready" means acquires and releases can run too. After lockdb restarts, each failed probe
    /// also drops one dead connection, on both sides, before the first acquire meets it.
    pub async fn ping(&self) -> Result<(), Error> {
        sqlx::query(sql::PING).execute(&self.pool).await?;
        let mut taken = self.batch_pool.take().await?;
        sqlx::query(sql::PING).execute(taken.conn()).await?;
        self.batch_pool.give_back(taken);
        Ok(())
    }
}
