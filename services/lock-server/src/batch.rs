//! Concurrent calls of one statement (acquire, release) sent to lockdb as one statement per round
//! trip: the statement over unnested arrays of the calls' binds ([`crate::sql::unnested`], one table
//! modification for the whole batch), or `WITH` copies of it ([`crate::sql::batched`]) for a
//! statement of another shape. What lets the PostgreSQL backend go past one statement's round
//! trip per call under load, without changing what any single call means.
//!
//! A call is queued; if fewer than [`MAX_IN_FLIGHT`] batches are running — of any kind: the
//! acquire and release batchers of one repository share the bound ([`InFlight`]) — a batch task is
//! started. It takes whatever is queued (oldest first, at most [`MAX_BATCH`], never two calls for one
//! key), runs it as one statement, hands each caller exactly its own outcome, gives its slot back and
//! offers it to the other kind's queue first, then to its own. So an idle server runs each call alone,
//! at once (C1's statement as it is), and batches only form while earlier ones are in flight.
//!
//! Each caller's outcome is its own row's: when the statement fails as a whole (one call named an
//! unknown session, a deadlock, a value PostgreSQL refuses), nothing of it was committed, and every
//! call of the batch is run again alone, so one bad call is answered with its own error and the
//! others as if it had not been there.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::Error;
use crate::sql;

/// Largest number of calls in one statement. Bounds the statement's work and, for `WITH` copies, the
/// number of distinct batched texts each connection prepares (two kinds × 31 sizes, well inside
/// sqlx's cache of 100; the `unnest` form is one text for every size).
pub const MAX_BATCH: usize = 32;

/// Batches running at once, acquires and releases together. Few, so that under load calls wait in
/// the queue (and are batched) rather than each taking a connection and a statement of its own; more
/// than one, so that calls for one contended key (one per batch) still overlap. Shared by both kinds
/// because what it bounds is lockdb's work at once: fewer busy backends make larger batches and less
/// switching between PostgreSQL processes on few cores. A shared bound of 2 left cores idle at 16
/// clients and measured no better than 4 (docs/benchmarks.md).
pub const MAX_IN_FLIGHT: usize = 4;

/// The connections a repository's batches run on: [`MAX_IN_FLIGHT`] of their own, opened as `pool`'s
/// are (same database, options and ping rule), beside `pool`, which keeps serving sessions,
/// heartbeats, renewals and reads: a burst of calls never takes the connections those need, and each
/// statement goes to one of a few PostgreSQL backends, where out of the shared pool consecutive
/// batches went round all of its backends (docs/benchmarks.md: up to 40 % less lockdb CPU per
/// cycle in some runs, no difference in others).
pub(crate) fn own_pool(pool: &PgPool) -> PgPool {
    pool.options()
        .clone()
        .max_connections(MAX_IN_FLIGHT as u32)
        .min_connections(0)
        .connect_lazy_with((*pool.connect_options()).clone())
}

/// One call of a batchable statement: its binds, in the order the statement documents, and how its
/// row (or its absence) becomes the caller's answer.
pub(crate) trait Call: Send + Sync + 'static {
    type Out: Send + 'static;
    /// Placeholders per copy of the statement.
    const BINDS: usize;
    /// The row the call touches; two calls for one key never share a statement.
    fn key(&self) -> &str;
    fn bind(&self, args: &mut PgArguments) -> Result<(), BoxDynError>;
    /// The SQL type of each placeholder, in order, for the arrays of [`sql::unnested`].
    const TYPES: &'static [&'static str];
    /// The binds of `calls` as one array per placeholder, in order ([`sql::unnested`]).
    fn bind_columns(calls: &[&Self], args: &mut PgArguments) -> Result<(), BoxDynError>;
    /// `None`: the statement returned no row for this call (what that means is the caller's, C1).
    fn outcome(row: Option<&PgRow>) -> Result<Self::Out, sqlx::Error>;
}

/// What a batcher has done, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Statements sent (a call run alone counts as one).
    pub statements: u64,
    /// Calls answered.
    pub calls: u64,
    /// The most calls one statement carried.
    pub largest: usize,
    /// Batches that failed as a whole and were run again call by call.
    pub fallbacks: u64,
    /// Batches sent as the one `unnest` statement ([`sql::unnested`]) rather than `WITH` copies.
    pub unnested: u64,
}

struct Pending<C: Call> {
    call: C,
    reply: oneshot::Sender<Result<C::Out, Error>>,
    queued_at: Instant,
}

/// Where a batched call's time goes, per statement (`statement="acquire"|"release"`), as lock-server
/// exports it (`lock_batch_wait_seconds`, `lock_batch_statement_seconds`, `lock_batch_calls`): the
/// wait in the queue for a batch to take it, the round trip of the statement that carried it, and
/// how many calls each statement carried. The rest of a request's time is the HTTP path's.
#[derive(Debug, Clone)]
pub struct BatchFamilies {
    pub waited: HistogramFamily,
    pub statement: HistogramFamily,
    pub calls: HistogramFamily,
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
        }
    }
}

impl BatchFamilies {
    /// The histograms of one statement's batcher (the families' own: what it observes is exported).
    pub(crate) fn of(&self, statement: &str) -> BatchTimes {
        let labels = StatementLabels {
            statement: statement.to_owned(),
        };
        BatchTimes {
            waited: self.waited.get_or_create(&labels).clone(),
            statement: self.statement.get_or_create(&labels).clone(),
            calls: self.calls.get_or_create(&labels).clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BatchTimes {
    waited: Histogram,
    statement: Histogram,
    calls: Histogram,
}

/// The batches in flight of one repository's batchers, bounded together by [`MAX_IN_FLIGHT`], and the
/// batchers (lanes) a freed slot is offered to.
pub(crate) struct InFlight {
    permits: Arc<Semaphore>,
    lanes: Mutex<Vec<Weak<dyn Lane>>>,
    most: AtomicUsize,
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("running", &self.running())
            .field("most", &self.most())
            .finish_non_exhaustive()
    }
}

/// A batcher as [`InFlight`] sees it.
trait Lane: Send + Sync {
    /// Starts a batch of this lane's queued calls if there are any and a slot is free.
    fn kick(self: Arc<Self>);
}

impl InFlight {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            lanes: Mutex::new(Vec::new()),
            most: AtomicUsize::new(0),
        })
    }

    /// The most batches that were in flight at once.
    pub(crate) fn most(&self) -> usize {
        self.most.load(Ordering::Relaxed)
    }

    /// Batches in flight now: the slots taken.
    fn running(&self) -> usize {
        MAX_IN_FLIGHT - self.permits.available_permits()
    }

    /// A free slot, if there is one.
    fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.permits.clone().try_acquire_owned().ok()?;
        self.most.fetch_max(self.running(), Ordering::Relaxed);
        Some(slot)
    }

    fn lanes(&self) -> MutexGuard<'_, Vec<Weak<dyn Lane>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a slot of lane `freed` was given back: every lane with queued calls may take a free
    /// slot, the ones after `freed` first, `freed` itself last — so one kind's steady stream of calls
    /// cannot keep the other's queue waiting.
    fn offer(&self, freed: usize) {
        // Held while kicking: a kick never waits (it takes a slot only if one is free, and spawns).
        let lanes = self.lanes();
        let n = lanes.len();
        for lane in (1..=n).filter_map(|i| lanes[(freed + i) % n].upgrade()) {
            lane.kick();
        }
    }
}

pub(crate) struct Batcher<C: Call> {
    pool: PgPool,
    stmt: &'static str,
    queue: Mutex<VecDeque<Pending<C>>>,
    in_flight: Arc<InFlight>,
    /// This batcher's place among `in_flight`'s lanes.
    lane: usize,
    /// The batched text for any size: `stmt` over unnested arrays, if it has a shape
    /// [`sql::unnested`] knows (C1's acquire and release, and their broken variants, do).
    unnested: Option<Arc<str>>,
    /// Otherwise, the `WITH` copies for each size, built on first use.
    texts: Vec<OnceLock<Arc<str>>>,
    statements: AtomicU64,
    calls: AtomicU64,
    largest: AtomicUsize,
    fallbacks: AtomicU64,
    unnested_sent: AtomicU64,
    times: BatchTimes,
}

impl<C: Call> fmt::Debug for Batcher<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("stmt", &self.stmt)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<C: Call> Batcher<C> {
    /// A batcher whose batches count against `in_flight`'s bound, with the others of its repository.
    pub(crate) fn new(
        pool: PgPool,
        stmt: &'static str,
        times: BatchTimes,
        in_flight: &Arc<InFlight>,
    ) -> Arc<Self> {
        let mut lanes = in_flight.lanes();
        let me = Arc::new(Self {
            pool,
            stmt,
            unnested: sql::unnested(stmt, C::TYPES).map(Arc::from),
            queue: Mutex::new(VecDeque::new()),
            in_flight: in_flight.clone(),
            lane: lanes.len(),
            texts: (0..=MAX_BATCH).map(|_| OnceLock::new()).collect(),
            statements: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            largest: AtomicUsize::new(0),
            fallbacks: AtomicU64::new(0),
            unnested_sent: AtomicU64::new(0),
            times,
        });
        let lane: Arc<dyn Lane> = me.clone();
        lanes.push(Arc::downgrade(&lane));
        drop(lanes);
        me
    }

    pub(crate) fn stats(&self) -> BatchStats {
        BatchStats {
            statements: self.statements.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            unnested: self.unnested_sent.load(Ordering::Relaxed),
        }
    }

    /// Runs `call` in the next batch and returns its own outcome.
    pub(crate) async fn call(self: &Arc<Self>, call: C) -> Result<C::Out, Error> {
        let (reply, answer) = oneshot::channel();
        self.queue().push_back(Pending {
            call,
            reply,
            queued_at: Instant::now(),
        });
        // The batch runs in its own task, so a caller that goes away (a dropped HTTP request) never
        // takes the other callers' statement down with it.
        self.clone().kick();
        // Dropped unanswered only when the runtime running the batch shut down.
        answer
            .await
            .unwrap_or(Err(Error::Database(sqlx::Error::PoolClosed)))
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<Pending<C>>> {
        // The lock is never held across a panic-prone section; a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one batch in a slot, then offers the slot to every lane. No call is ever left queued with
    /// nobody to run it: a call whose own [`Lane::kick`] found no free slot was queued while every
    /// slot was held, and each holder, after giving its slot back, looks at every queue again.
    async fn batch(self: Arc<Self>, slot: OwnedSemaphorePermit) {
        let batch = self.take();
        if !batch.is_empty() {
            self.run(batch).await;
        }
        drop(slot);
        self.in_flight.offer(self.lane);
    }

    /// The oldest queued calls, at most one per key (the later ones wait for a later batch), callers
    /// that went away left out (their statement is never sent, as when a lone request is dropped).
    fn take(&self) -> Vec<Pending<C>> {
        let mut queue = self.queue();
        let mut batch = Vec::new();
        let mut keys = HashSet::new();
        let mut i = 0;
        while i < queue.len() && batch.len() < MAX_BATCH {
            if queue[i].reply.is_closed() {
                queue.remove(i);
            } else if keys.insert(queue[i].call.key().to_owned()) {
                batch.extend(queue.remove(i));
            } else {
                i += 1;
            }
        }
        batch
    }

    async fn run(self: &Arc<Self>, mut batch: Vec<Pending<C>>) {
        // One order in which every batch touches its rows, so two batches in flight cannot deadlock
        // on each other's keys.
        batch.sort_by(|a, b| a.call.key().cmp(b.call.key()));
        let taken = Instant::now();
        for p in &batch {
            self.times
                .waited
                .observe(taken.duration_since(p.queued_at).as_secs_f64());
        }
        self.times.calls.observe(batch.len() as f64);
        let n = batch.len() as u64;
        self.calls.fetch_add(n, Ordering::Relaxed);
        self.largest.fetch_max(batch.len(), Ordering::Relaxed);
        if batch.len() == 1 {
            if let Some(p) = batch.pop() {
                let out = self.single(&p.call).await;
                self.times.statement.observe(taken.elapsed().as_secs_f64());
                answer(p.reply, out);
            }
            return;
        }
        self.statements.fetch_add(1, Ordering::Relaxed);
        let out = self.batched(&batch).await;
        // Once per call: each call's time in lockdb is its statement's round trip.
        let took = taken.elapsed().as_secs_f64();
        for _ in 0..batch.len() {
            self.times.statement.observe(took);
        }
        match out {
            Ok(outs) => {
                for (p, out) in batch.into_iter().zip(outs) {
                    answer(p.reply, Ok(out));
                }
            }
            Err(sqlx::Error::Database(e)) => {
                // The statement was refused as a whole and rolled back (nothing of it committed):
                // each call runs alone and gets its own answer, the bad one its own error.
                tracing::debug!(event = "batch_retried_alone", calls = n, error = %e);
                self.fallbacks.fetch_add(1, Ordering::Relaxed);
                let mut alone = JoinSet::new();
                for p in batch {
                    let me = self.clone();
                    alone.spawn(async move {
                        let out = me.single(&p.call).await;
                        answer(p.reply, out);
                    });
                }
                while alone.join_next().await.is_some() {}
            }
            // Lockdb unreachable or the reply unreadable: every caller gets that error, as it would
            // have alone. Not run again: the statement may have committed.
            Err(e) => {
                for p in batch {
                    answer(p.reply, Err(Error::from(copy_error(&e))));
                }
            }
        }
    }

    /// The call alone: exactly the repository's statement, as before batching.
    async fn single(&self, call: &C) -> Result<C::Out, Error> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        let mut args = PgArguments::default();
        call.bind(&mut args).map_err(sqlx::Error::Encode)?;
        let row = sqlx::query_with(self.stmt, args)
            .fetch_optional(&self.pool)
            .await?;
        Ok(C::outcome(row.as_ref())?)
    }

    async fn batched(&self, batch: &[Pending<C>]) -> Result<Vec<C::Out>, sqlx::Error> {
        let n = batch.len();
        let mut args = PgArguments::default();
        let text = match &self.unnested {
            Some(text) => {
                let calls: Vec<&C> = batch.iter().map(|p| &p.call).collect();
                C::bind_columns(&calls, &mut args).map_err(sqlx::Error::Encode)?;
                self.unnested_sent.fetch_add(1, Ordering::Relaxed);
                text.clone()
            }
            None => {
                for p in batch {
                    p.call.bind(&mut args).map_err(sqlx::Error::Encode)?;
                }
                self.texts[n]
                    .get_or_init(|| Arc::from(sql::batched(self.stmt, C::BINDS, n)))
                    .clone()
            }
        };
        let rows = sqlx::query_with(AssertSqlSafe(text), args)
            .fetch_all(&self.pool)
            .await?;
        let mut own: Vec<Option<PgRow>> = (0..n).map(|_| None).collect();
        for row in rows {
            let i: i32 = row.try_get("batch_index")?;
            match usize::try_from(i).ok().and_then(|i| own.get_mut(i)) {
                Some(slot @ None) => *slot = Some(row),
                _ => {
                    return Err(sqlx::Error::Protocol(format!(
                        "batched statement returned an unexpected row for call {i}"
                    )));
                }
            }
        }
        own.iter().map(|row| C::outcome(row.as_ref())).collect()
    }
}

impl<C: Call> Lane for Batcher<C> {
    fn kick(self: Arc<Self>) {
        if self.queue().is_empty() {
            return;
        }
        if let Some(slot) = self.in_flight.try_slot() {
            tokio::spawn(self.batch(slot));
        }
    }
}

fn answer<T>(reply: oneshot::Sender<Result<T, Error>>, out: Result<T, Error>) {
    // A caller that went away does not want its answer.
    let _ = reply.send(out);
}

/// An equivalent error for each caller of a failed batch (sqlx errors are not `Clone`), mapped to
/// HTTP as the original is: unreachable lockdb stays 503, anything else stays 500.
fn copy_error(e: &sqlx::Error) -> sqlx::Error {
    match e {
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        sqlx::Error::Io(io) => sqlx::Error::Io(std::io::Error::new(io.kind(), io.to_string())),
        other => sqlx::Error::Protocol(other.to_string()),
    }
}
