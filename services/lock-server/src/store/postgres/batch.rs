//! Concurrent calls of one statement (acquire, release) sent to lockdb as one statement per round
//! trip: the statement over unnested arrays of the calls' binds ([`sql::unnested`], one table
//! modification for the whole batch), or `WITH` copies of it ([`sql::batched`]) for a
//! statement of another shape. What lets the PostgreSQL backend go past one statement's round
//! trip per call under load, without changing what any single call means.
//!
//! A call is queued; if fewer than [`MAX_IN_FLIGHT`] batches are running — of any kind: the
//! acquire and release batchers of one repository share the bound ([`InFlight`]) — a batch task is
//! started. While another statement is in flight it first yields to the runtime a few times
//! ([`GATHER_YIELDS`], so that calls about to be queued join it); then it takes whatever is queued
//! (oldest first, at most [`MAX_BATCH`], never two calls for one key), runs it as one statement,
//! hands each caller exactly its own outcome, gives its slot back and offers it to the other kind's
//! queue first, then to its own. So an idle server runs each call alone, at once (C1's statement as
//! it is), and batches only form while earlier ones are in flight.
//!
//! When calls of both kinds are queued, one statement carries a batch of each ([`Pair`],
//! [`sql::paired`]): one transaction's fixed cost in lockdb instead of two. Such a statement shares no
//! key with any other in flight (see [`Pair`] for why).
//!
//! Each caller's outcome is its own row's: when the statement fails as a whole (one call named an
//! unknown session, a deadlock, a value PostgreSQL refuses), nothing of it was committed, and every
//! call of the batch is run again alone, so one bad call is answered with its own error and the
//! others as if it had not been there.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::conns::Conns;
use super::epoch::Epochs;
use super::sql;
use crate::error::Error;
use crate::store::{BatchFamilies, StatementLabels};

/// Largest number of calls in one statement. Bounds the statement's work and, for `WITH` copies, the
/// number of distinct batched texts each connection prepares (two kinds × 31 sizes, well inside
/// sqlx's cache of 100; the `unnest` form is one text for every size).
pub const MAX_BATCH: usize = 32;

/// Batches running at once, acquires and releases together. Few, so that under load calls wait in
/// the queue (and are batched) rather than each taking a connection and a statement of its own; more
/// than one, so that calls for one contended key (one per batch) still overlap. Shared by both kinds
/// because what it bounds is lockdb's work at once: fewer busy backends make larger batches and less
/// switching between PostgreSQL processes on few cores. 3 since acquires and releases share
/// statements ([`Pair`]): with fewer statements in flight more of them carry both kinds, and lockdb's
/// CPU per cycle fell by 13 % from 4 with no row worse; 2 cut it further but slowed the contended
/// one-key rows (docs/benchmarks.md).
pub const MAX_IN_FLIGHT: usize = 3;

/// Times a batch task yields to the runtime before it takes the queued calls, while another statement
/// is in flight. Under load, requests whose calls are about to be queued are already running or
/// runnable on the runtime's workers (their bodies read, their JSON parsed): yielding lets them queue
/// first and ride in this statement instead of the next one — fewer statements per call, more of them
/// carrying both kinds, and a statement costs lockdb about as much as the calls it carries
/// (docs/benchmarks.md: at 16 clients 3.2 calls per statement instead of 1.8, lockdb's CPU per cycle
/// 36 % lower; more yields did not make the batches larger). With nothing else in flight there is no
/// load to gather from, and the yields would only cost a lone call a wake-up of the runtime.
const GATHER_YIELDS: usize = 3;

/// The connections a repository's batches run on: [`MAX_IN_FLIGHT`] of their own, opened as `pool`'s
/// are (same database, options and ping rule), beside `pool`, which keeps serving sessions,
/// heartbeats, renewals and reads: a burst of calls never takes the connections those need, and each
/// statement goes to one of a few PostgreSQL backends, where out of the shared pool consecutive
/// batches went round all of its backends (docs/benchmarks.md: up to 40 % less lockdb CPU per
/// cycle in some runs, no difference in others).
/// Kept between statements ([`Conns`]). These are the only connections that grant, so each is
/// vouched for by `epochs` when it is opened, before any statement runs on it ([`Epochs::vouch`]).
pub(crate) fn own_pool(pool: &PgPool, epochs: &Arc<Epochs>) -> Arc<Conns> {
    let epochs = epochs.clone();
    Arc::new(Conns::new(
        pool.options()
            .clone()
            .max_connections(MAX_IN_FLIGHT as u32)
            .min_connections(0)
            .after_connect(move |conn, _meta| {
                let epochs = epochs.clone();
                Box::pin(async move { epochs.vouch(conn).await })
            })
            .connect_lazy_with((*pool.connect_options()).clone()),
    ))
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

/// Deliberately broken batching, for the negative controls only. Production is [`BatchFaults::NONE`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchFaults {
    /// A paired statement ([`Pair`]) starts whatever keys the statements in flight hold, and any
    /// statement takes keys a paired one in flight holds: the rule that keeps pairs deadlock-free
    /// is off.
    pub pair_over_held_keys: bool,
}

impl BatchFaults {
    pub const NONE: BatchFaults = BatchFaults {
        pair_over_held_keys: false,
    };
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
    /// Batches sent in one statement with a batch of the other kind ([`Pair`]); counted in
    /// `statements` of both kinds.
    pub paired: u64,
    /// Slots that found calls queued but none to take: each waited for the keys of a paired
    /// statement in flight (counted by both kinds' batchers).
    pub blocked: u64,
}

struct Pending<C: Call> {
    call: C,
    reply: oneshot::Sender<Result<C::Out, Error>>,
    queued_at: Instant,
}

#[derive(Debug, Clone)]
pub(crate) struct BatchTimes {
    waited: Histogram,
    statement: Histogram,
    calls: Histogram,
    paired: Counter,
}

impl BatchTimes {
    /// The histograms of one statement's batcher (the families' own: what it observes is exported).
    pub(crate) fn of(families: &BatchFamilies, statement: &str) -> Self {
        let labels = StatementLabels {
            statement: statement.to_owned(),
        };
        BatchTimes {
            waited: families.waited.get_or_create(&labels).clone(),
            statement: families.statement.get_or_create(&labels).clone(),
            calls: families.calls.get_or_create(&labels).clone(),
            paired: families.paired.clone(),
        }
    }
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
    conns: Arc<Conns>,
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
    blocked: AtomicU64,
    times: BatchTimes,
    /// The pair whose batches this batcher's slots run, if its statement pairs with the other
    /// kind's ([`Pair::join`]).
    pair: OnceLock<Weak<dyn PairLane>>,
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
        conns: Arc<Conns>,
        stmt: &'static str,
        times: BatchTimes,
        in_flight: &Arc<InFlight>,
    ) -> Arc<Self> {
        let mut lanes = in_flight.lanes();
        let me = Arc::new(Self {
            conns,
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
            blocked: AtomicU64::new(0),
            times,
            pair: OnceLock::new(),
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
            // One counter for both kinds (what `lock_batch_paired_total` exports).
            paired: self.times.paired.get(),
            blocked: self.blocked.load(Ordering::Relaxed),
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
        // This slot counts as one: gather only beside another statement ([`GATHER_YIELDS`]).
        if self.in_flight.running() > 1 {
            for _ in 0..GATHER_YIELDS {
                tokio::task::yield_now().await;
            }
        }
        let offer = match self.pair.get().and_then(Weak::upgrade) {
            Some(pair) => pair.batch(self.lane).await,
            None => {
                let batch = self.take(&mut |_| true);
                if !batch.is_empty() {
                    self.run(batch).await;
                }
                true
            }
        };
        drop(slot);
        if offer {
            self.in_flight.offer(self.lane);
        }
    }

    /// The oldest queued calls that `admit` lets in, at most one per key (the later ones wait for a
    /// later batch), callers that went away left out (their statement is never sent, as when a lone
    /// request is dropped).
    fn take(&self, admit: &mut dyn FnMut(&str) -> bool) -> Vec<Pending<C>> {
        let mut queue = self.queue();
        let mut batch = Vec::new();
        let mut keys = HashSet::new();
        let mut i = 0;
        while i < queue.len() && batch.len() < MAX_BATCH {
            let key = queue[i].call.key();
            if queue[i].reply.is_closed() {
                queue.remove(i);
            } else if !keys.contains(key) && admit(key) {
                keys.insert(key.to_owned());
                batch.extend(queue.remove(i));
            } else {
                i += 1;
            }
        }
        batch
    }

    /// Whether a call `admit` lets in is queued.
    fn has(&self, admit: &mut dyn FnMut(&str) -> bool) -> bool {
        self.queue()
            .iter()
            .any(|p| !p.reply.is_closed() && admit(p.call.key()))
    }

    /// Counts `batch` as taken now (its wait, its size) and sorts it into the one order in which
    /// every batch touches its rows, so two batches of one kind in flight cannot deadlock on each
    /// other's keys.
    fn note(&self, batch: &mut [Pending<C>]) -> Instant {
        batch.sort_by(|a, b| a.call.key().cmp(b.call.key()));
        let taken = Instant::now();
        for p in batch.iter() {
            self.times
                .waited
                .observe(taken.duration_since(p.queued_at).as_secs_f64());
        }
        self.times.calls.observe(batch.len() as f64);
        self.calls.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.largest.fetch_max(batch.len(), Ordering::Relaxed);
        taken
    }

    async fn run(self: &Arc<Self>, mut batch: Vec<Pending<C>>) {
        let taken = self.note(&mut batch);
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
        self.finish(batch, taken, out).await;
    }

    /// Hands each caller of a batch sent as one statement its own outcome.
    async fn finish(
        self: &Arc<Self>,
        batch: Vec<Pending<C>>,
        taken: Instant,
        out: Result<Vec<C::Out>, sqlx::Error>,
    ) {
        let n = batch.len() as u64;
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
                tracing::debug!(event = "batch_retried_alone", calls = n, error = %e);
                self.alone(batch).await;
            }
            Err(e) => self.fail(batch, &e),
        }
    }

    /// After the batch's statement was refused as a whole and rolled back (nothing of it
    /// committed): each call runs alone and gets its own answer, the bad one its own error.
    async fn alone(self: &Arc<Self>, batch: Vec<Pending<C>>) {
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

    /// Lockdb unreachable or the reply unreadable: every caller gets that error, as it would have
    /// alone. Not run again: the statement may have committed.
    fn fail(&self, batch: Vec<Pending<C>>, e: &sqlx::Error) {
        for p in batch {
            answer(p.reply, Err(Error::from(copy_error(e))));
        }
    }

    /// The call alone: exactly the repository's statement, as before batching.
    async fn single(&self, call: &C) -> Result<C::Out, Error> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        let mut args = PgArguments::default();
        call.bind(&mut args).map_err(sqlx::Error::Encode)?;
        let mut taken = self.conns.take().await?;
        let row = sqlx::query_with(self.stmt, args)
            .fetch_optional(taken.conn())
            .await?;
        self.conns.give_back(taken);
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
        let mut taken = self.conns.take().await?;
        let rows = sqlx::query_with(AssertSqlSafe(text), args)
            .fetch_all(taken.conn())
            .await?;
        self.conns.give_back(taken);
        let mut own = Own::new(n);
        for row in rows {
            own.put(row)?;
        }
        own.outcomes::<C>()
    }
}

/// The rows of one batch, each at its call's `batch_index`.
struct Own(Vec<Option<PgRow>>);

impl Own {
    fn new(n: usize) -> Self {
        Self((0..n).map(|_| None).collect())
    }

    fn put(&mut self, row: PgRow) -> Result<(), sqlx::Error> {
        let i: i32 = row.try_get("batch_index")?;
        match usize::try_from(i).ok().and_then(|i| self.0.get_mut(i)) {
            Some(slot @ None) => {
                *slot = Some(row);
                Ok(())
            }
            _ => Err(sqlx::Error::Protocol(format!(
                "batched statement returned an unexpected row for call {i}"
            ))),
        }
    }

    fn outcomes<C: Call>(&self) -> Result<Vec<C::Out>, sqlx::Error> {
        self.0.iter().map(|row| C::outcome(row.as_ref())).collect()
    }
}

/// The keys of a pair's statements in flight: every statement's (by how many hold each), and
/// those of paired statements.
#[derive(Debug, Default)]
struct Held {
    all: HashMap<String, usize>,
    paired: HashSet<String>,
}

impl Held {
    fn hold(&mut self, keys: &[String], paired: bool) {
        for k in keys {
            *self.all.entry(k.clone()).or_default() += 1;
            if paired {
                self.paired.insert(k.clone());
            }
        }
    }

    fn let_go(&mut self, keys: &[String]) {
        for k in keys {
            self.paired.remove(k);
            if let Some(n) = self.all.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.all.remove(k);
                }
            }
        }
    }
}

/// A [`Pair`] as its batchers see it.
trait PairLane: Send + Sync {
    /// Takes and runs one statement's calls of either kind, or both; `false` when it took nothing
    /// because every queued call's key is in a paired statement in flight (whose end offers its
    /// slot again, so nobody has to now).
    fn batch(self: Arc<Self>, lead: usize) -> Pin<Box<dyn Future<Output = bool> + Send>>;
}

/// An acquire batcher and a release batcher whose batches may share one statement
/// ([`sql::paired`]): one transaction's fixed cost in lockdb for both, which is most of what a
/// small batch costs there (docs/benchmarks.md).
///
/// The rule that keeps it deadlock-free: the halves of a paired statement lock their rows in two
/// runs, not in one order (an acquire of B then a release of A can meet another statement's acquire
/// of A and release of B), so a paired statement starts only when no statement in flight holds any
/// of its keys, and while it runs no statement takes one of them. Statements of one kind alone
/// keep sharing keys with each other as before: each locks its rows in key order.
pub(crate) struct Pair<A: Call, R: Call> {
    acquires: Arc<Batcher<A>>,
    releases: Arc<Batcher<R>>,
    text: Arc<str>,
    held: Mutex<Held>,
    faults: BatchFaults,
}

impl<A: Call, R: Call> Pair<A, R> {
    /// Pairs the two batchers if their statements pair ([`sql::paired`]); from then on every slot
    /// either of them takes runs the pair's next statement.
    pub(crate) fn join(
        acquires: &Arc<Batcher<A>>,
        releases: &Arc<Batcher<R>>,
        faults: BatchFaults,
    ) -> Option<Arc<Self>> {
        let text = sql::paired(acquires.stmt, A::TYPES, releases.stmt, R::TYPES)?;
        let me = Arc::new(Self {
            acquires: acquires.clone(),
            releases: releases.clone(),
            text: text.into(),
            held: Mutex::new(Held::default()),
            faults,
        });
        let lane: Arc<dyn PairLane> = me.clone();
        let _ = acquires.pair.set(Arc::downgrade(&lane));
        let _ = releases.pair.set(Arc::downgrade(&lane));
        Some(me)
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next statement's calls, and their keys now held: both kinds, if calls of both are queued
    /// whose keys no statement in flight holds; else one kind's, whose keys no paired statement in
    /// flight holds: the kind of the lane whose slot this is (`lead`) first, so that, as
    /// [`InFlight::offer`] turns slots from lane to lane, a steady stream of one kind (acquires of a
    /// contended key) cannot keep the other (the release that frees it) waiting.
    fn take(&self, lead: usize) -> (Vec<Pending<A>>, Vec<Pending<R>>, Vec<String>) {
        let mut held = self.held();
        let rule = !self.faults.pair_over_held_keys;
        let free = |held: &Held, k: &str| !rule || !held.all.contains_key(k);
        let mut taken = HashSet::new();
        let (a, r) =
            if self.acquires.has(&mut |k| free(&held, k)) && self.releases.has(&mut |k| free(&held, k)) {
                let a = self
                    .acquires
                    .take(&mut |k| free(&held, k) && taken.insert(k.to_owned()));
                let r = self
                    .releases
                    .take(&mut |k| free(&held, k) && taken.insert(k.to_owned()));
                (a, r)
            } else {
                let mut unpaired = |k: &str| !rule || !held.paired.contains(k);
                let releases_first = lead == self.releases.lane;
                let mut r = Vec::new();
                if releases_first {
                    r = self.releases.take(&mut unpaired);
                }
                let mut a = Vec::new();
                if r.is_empty() {
                    a = self.acquires.take(&mut unpaired);
                }
                if a.is_empty() && !releases_first {
                    r = self.releases.take(&mut unpaired);
                }
                (a, r)
            };
        let keys: Vec<String> = (a.iter().map(|p| p.call.key()))
            .chain(r.iter().map(|p| p.call.key()))
            .map(str::to_owned)
            .collect();
        held.hold(&keys, !a.is_empty() && !r.is_empty());
        (a, r, keys)
    }

    async fn run(self: Arc<Self>, lead: usize) -> bool {
        let (a, r, keys) = self.take(lead);
        match (a.is_empty(), r.is_empty()) {
            (true, true) => {
                // Nothing runnable: either nothing is queued (offering is harmless), or every queued
                // call waits for a paired statement, whose end offers (offering now would only
                // start this empty batch again until then).
                let blocked = self.acquires.has(&mut |_| true) || self.releases.has(&mut |_| true);
                if blocked {
                    for b in [&self.acquires.blocked, &self.releases.blocked] {
                        b.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return !blocked;
            }
            (false, true) => self.acquires.run(a).await,
            (true, false) => self.releases.run(r).await,
            (false, false) => self.both(a, r).await,
        }
        self.held().let_go(&keys);
        true
    }

    /// One statement for a batch of each kind, each caller answered as its own batch would be.
    async fn both(&self, mut a: Vec<Pending<A>>, mut r: Vec<Pending<R>>) {
        let taken = self.acquires.note(&mut a);
        self.releases.note(&mut r);
        for b in [&self.acquires.statements, &self.releases.statements] {
            b.fetch_add(1, Ordering::Relaxed);
        }
        for b in [&self.acquires.unnested_sent, &self.releases.unnested_sent] {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.acquires.times.paired.inc();
        match self.statement(&a, &r).await {
            Ok((aa, rr)) => {
                tokio::join!(
                    self.acquires.finish(a, taken, Ok(aa)),
                    self.releases.finish(r, taken, Ok(rr))
                );
            }
            Err(sqlx::Error::Database(e)) => {
                tracing::debug!(event = "batch_retried_alone", calls = a.len() + r.len(), error = %e);
                tokio::join!(self.acquires.alone(a), self.releases.alone(r));
            }
            Err(e) => {
                self.acquires.fail(a, &e);
                self.releases.fail(r, &e);
            }
        }
    }

    async fn statement(
        &self,
        a: &[Pending<A>],
        r: &[Pending<R>],
    ) -> Result<(Vec<A::Out>, Vec<R::Out>), sqlx::Error> {
        let mut args = PgArguments::default();
        let calls: Vec<&A> = a.iter().map(|p| &p.call).collect();
        A::bind_columns(&calls, &mut args).map_err(sqlx::Error::Encode)?;
        let calls: Vec<&R> = r.iter().map(|p| &p.call).collect();
        R::bind_columns(&calls, &mut args).map_err(sqlx::Error::Encode)?;
        let conns = &self.acquires.conns;
        let mut taken = conns.take().await?;
        let rows = sqlx::query_with(AssertSqlSafe(self.text.clone()), args)
            .fetch_all(taken.conn())
            .await?;
        conns.give_back(taken);
        let (mut own_a, mut own_r) = (Own::new(a.len()), Own::new(r.len()));
        for row in rows {
            match row.try_get::<i32, _>("batch_statement")? {
                0 => own_a.put(row)?,
                _ => own_r.put(row)?,
            }
        }
        Ok((own_a.outcomes::<A>()?, own_r.outcomes::<R>()?))
    }
}

impl<A: Call, R: Call> fmt::Debug for Pair<A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pair")
            .field("held", &*self.held())
            .finish_non_exhaustive()
    }
}

impl<A: Call, R: Call> PairLane for Pair<A, R> {
    fn batch(self: Arc<Self>, lead: usize) -> Pin<Box<dyn Future<Output = bool> + Send>> {
        Box::pin(self.run(lead))
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
