//! One worker: its own lock session, a loop of passes, one account at a time.
//!
//! A pass finds the work ([`Discovery`]), shuffles it (so that workers spread over accounts), and
//! visits each account in turn: it acquires `account:<account_id>` with a short bounded wait in the
//! account's queue on lock-server — contended means another live holder has it, so the worker
//! moves on — and works that account's payouts one after the other. A pass that met only held
//! accounts waits in the queue of one of them for the poll interval instead of sleeping and asking
//! again: the holder's release wakes it. Every payout attempt on an account carries a newer token
//! than the one before it (strict `<` at (a) and (d)): between two attempts the worker re-enters
//! the key in its session for a fresh token, one request instead of a release and an acquire. The
//! lock is released at the end of the visit, whatever happened.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_client::{ClientError, LockClient, LockHandle, Session};
use dlock_common::metrics::Resource;
use rand::Rng;
use rand::seq::SliceRandom;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Config;
use crate::critical::{Critical, Ended, Resources};
use crate::metrics::{AcquireResult, BackoffGauges, Metrics, Outcome};
use crate::model::{Payout, PayoutState};

/// After this many consecutive failures to reach the services, a batch-mode worker gives up.
const MAX_CONSECUTIVE_FAILURES: u32 = 20;

/// How a payout whose attempt ended in an unexpected error (a transport error, a 5xx, a protocol
/// surprise: [`Outcome::error`]) is tried again. No payout waits for ever and no process stops
/// trying one while it runs:
///
/// - each error puts the payout into **backoff**: discovery skips it until its next-attempt time,
///   `base` after the first error, doubled after each further consecutive one, capped at `max`, and
///   jittered (each wait is drawn between half and all of it, so executors that failed together do
///   not come back together). An attempt that gets an answer (posted, failed, fenced out, lock lost,
///   unresolved) resets it;
/// - after `budget` consecutive errors the payout is reported. A long-running executor logs
///   `payout_retry_backoff` once, at ERROR, and keeps trying it every `max` (never gives it up); a
///   batch run (`--exit-when-idle`) stops trying it (`payout_given_up`), and its exit hands it on:
///   it exits non-zero with the payout named in its report, for the next run to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
    pub budget: u32,
    /// Batch mode: stop at the budget (the exit hands the payout on). Service mode: never.
    pub give_up_at_budget: bool,
}

impl RetryPolicy {
    pub fn of(config: &Config) -> Self {
        Self {
            base: config.payout_retry_backoff,
            max: config.payout_retry_backoff_max,
            budget: config.max_errors_per_payout,
            give_up_at_budget: config.exit_when_idle,
        }
    }

    /// The backoff after the `errors`-th consecutive error (counted from 1), before jitter: doubling
    /// from `base` below the budget, `max` from the budget on.
    pub fn backoff(&self, errors: u32) -> Duration {
        if errors >= self.budget {
            return self.max;
        }
        let doublings = errors.saturating_sub(1).min(30);
        self.base.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// [`RetryPolicy::backoff`] with jitter: uniform between half of it and all of it.
    pub fn jittered(&self, errors: u32) -> Duration {
        let full = self.backoff(errors);
        let half = full / 2;
        if full.is_zero() {
            return full;
        }
        rand::rng().random_range(half..=full)
    }
}

/// What the process knows about payouts beyond the listing: the explicit ones, and those it left
/// unfinished (fenced out, lock lost, errors), so that it re-reads them in later passes; and, for
/// those whose last attempt ended in an error, when they may be tried again ([`RetryPolicy`]).
#[derive(Debug)]
pub struct Tracked {
    inner: Mutex<HashMap<Uuid, TrackedPayout>>,
    policy: RetryPolicy,
    gauges: BackoffGauges,
}

#[derive(Debug, Default, Clone, Copy)]
struct TrackedPayout {
    /// Consecutive attempts that ended in an unexpected error.
    errors: u32,
    /// Set by an error: not tried again before then.
    retry_at: Option<Instant>,
    /// Its error budget is spent (reported once; reset with the errors).
    over_budget: bool,
    /// Batch mode only: this run spent the payout's error budget and leaves it to the next run.
    given_up: bool,
}

/// What [`Tracked::error`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Consecutive errors so far.
    pub errors: u32,
    /// When it is tried again; `None`: given up by this batch run.
    pub retry_in: Option<Duration>,
}

impl Tracked {
    pub fn new(ids: &[Uuid], policy: RetryPolicy, gauges: BackoffGauges) -> Self {
        let t = Self {
            inner: Mutex::default(),
            policy,
            gauges,
        };
        for id in ids {
            t.watch(*id);
        }
        t
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, TrackedPayout>> {
        // A panic elsewhere cannot leave this map inconsistent (single inserts/removes).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The gauges follow the map; called with the map locked, after every change.
    fn publish(&self, map: &HashMap<Uuid, TrackedPayout>) {
        let backing_off = map.values().filter(|t| t.errors > 0 && !t.given_up).count();
        let over_budget = map.values().filter(|t| t.over_budget).count();
        self.gauges
            .backing_off
            .set(i64::try_from(backing_off).unwrap_or(i64::MAX));
        self.gauges
            .over_budget
            .set(i64::try_from(over_budget).unwrap_or(i64::MAX));
    }

    /// Re-read it in later passes (its backoff, if any, stands).
    pub fn watch(&self, id: Uuid) {
        self.lock().entry(id).or_default();
    }

    /// An attempt got an answer that was not an error: re-read it in later passes, its backoff
    /// and error count reset.
    pub fn answered(&self, id: Uuid) {
        let mut map = self.lock();
        let t = map.entry(id).or_default();
        if t.errors > 0 && !t.given_up {
            t.errors = 0;
            t.retry_at = None;
            t.over_budget = false;
        }
        self.publish(&map);
    }

    pub fn done(&self, id: Uuid) {
        let mut map = self.lock();
        map.remove(&id);
        self.publish(&map);
    }

    /// Counts an error against the payout and schedules its next attempt. `budget` is the
    /// policy's, or lower for a payout that cannot be worked at all (an unknown id: 1).
    pub fn error(&self, id: Uuid, budget: u32) -> Retry {
        let policy = RetryPolicy {
            budget: budget.min(self.policy.budget),
            ..self.policy
        };
        let mut map = self.lock();
        let t = map.entry(id).or_default();
        if t.given_up {
            return Retry {
                errors: t.errors,
                retry_in: None,
            };
        }
        t.errors = t.errors.saturating_add(1);
        let errors = t.errors;
        t.over_budget = errors >= policy.budget;
        let retry = if errors >= policy.budget && policy.give_up_at_budget {
            t.given_up = true;
            t.retry_at = None;
            tracing::error!(
                event = "payout_given_up",
                payout_id = %id,
                errors,
                "this batch run spent the payout's error budget: it stops trying it and exits \
                 non-zero naming it, for the next run to finish it"
            );
            None
        } else {
            let wait = policy.jittered(errors);
            t.retry_at = Some(Instant::now() + wait);
            if errors == policy.budget {
                tracing::error!(
                    event = "payout_retry_backoff",
                    payout_id = %id,
                    errors,
                    retry_every_ms = u64::try_from(policy.max.as_millis()).unwrap_or(u64::MAX),
                    "unexpected errors on every recent attempt of this payout; still retried, at the \
                     capped backoff, until it ends (never given up)"
                );
            }
            Some(wait)
        };
        self.publish(&map);
        Retry {
            errors,
            retry_in: retry,
        }
    }

    /// Whether it may be attempted now: not given up, and not waiting out a backoff.
    pub fn is_due(&self, id: Uuid, now: Instant) -> bool {
        self.lock().get(&id).is_none_or(|t| t.is_due(now))
    }

    /// The tracked payouts that may be attempted now.
    pub fn due_ids(&self, now: Instant) -> Vec<Uuid> {
        self.lock()
            .iter()
            .filter(|(_, t)| t.is_due(now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The earliest next attempt of a payout waiting out a backoff (it is still work: a batch run
    /// waits for it rather than exit idle).
    pub fn next_retry(&self) -> Option<Instant> {
        self.lock()
            .values()
            .filter(|t| !t.given_up)
            .filter_map(|t| t.retry_at)
            .min()
    }

    /// Batch mode: the payouts this run gave up, for its report.
    pub fn given_up(&self) -> Vec<Uuid> {
        self.lock()
            .iter()
            .filter(|(_, t)| t.given_up)
            .map(|(id, _)| *id)
            .collect()
    }
}

impl TrackedPayout {
    fn is_due(&self, now: Instant) -> bool {
        !self.given_up && self.retry_at.is_none_or(|at| at <= now)
    }
}

/// What every worker of the process shares.
#[derive(Debug)]
pub struct Shared {
    pub config: Config,
    pub lock_client: LockClient,
    pub resources: Resources,
    pub metrics: Metrics,
    pub tracked: Tracked,
    /// Cleared the first time payment-resource refuses to list an in-flight state.
    pub inflight_listing: std::sync::atomic::AtomicBool,
    pub shutdown: CancellationToken,
}

/// How a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// Batch mode: nothing left that this executor can take.
    Idle,
    /// SIGTERM.
    Shutdown,
    /// Batch mode: the services could not be reached for too long.
    Unreachable,
}

/// Finds the payouts to work on. Bounded work: a pass reads **one** page of PENDING payouts (from the
/// worker's keyset cursor, which moves on page by page and wraps around at the end, so every payout
/// is reached however long the backlog) and one page of each in-flight state — never the whole
/// backlog. The in-flight pages (a dead holder's payouts, rare) are read at most once per poll
/// interval: a busy worker's passes come every few payouts, and four lists each time were most of
/// its discovery requests. A worker about to call itself idle lists them first.
struct Discovery<'a> {
    shared: &'a Shared,
    /// Where this worker's next PENDING page starts (`None`: the oldest).
    pending_cursor: &'a mut Option<String>,
    /// When this worker last listed the in-flight states (`None`: never, or asked for now).
    inflight_listed_at: &'a mut Option<Instant>,
    /// Set by [`Discovery::pass`]: whether it listed them.
    listed_inflight: bool,
}

impl Discovery<'_> {
    /// One page of PENDING payouts and, where payment-resource can list them, one page of each
    /// in-flight state; plus every tracked payout, re-read. Explicit mode (`--payout-id`) reads only
    /// the tracked ones.
    async fn pass(&mut self) -> Result<Vec<Payout>, ClientError> {
        let shared = self.shared;
        let mut found: Vec<Payout> = Vec::new();
        let mut seen: HashSet<Uuid> = HashSet::new();
        if shared.config.payout_ids.is_empty() {
            let after = self.pending_cursor.clone();
            let next = self
                .page(PayoutState::Pending, after.as_deref(), &mut found, &mut seen)
                .await?;
            // A short page is the end of the queue: the next pass starts from the oldest again.
            *self.pending_cursor = next;
            let due = self
                .inflight_listed_at
                .is_none_or(|at| at.elapsed() >= shared.config.poll_interval);
            if due {
                *self.inflight_listed_at = Some(Instant::now());
                self.listed_inflight = true;
            }
            for state in PayoutState::IN_FLIGHT {
                if !due {
                    break;
                }
                if !shared.inflight_listing.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                match self.page(state, None, &mut found, &mut seen).await {
                    Ok(_) => {}
                    // This payment-resource lists only PENDING: in-flight payouts of dead holders
                    // are then found only through --payout-id (or this process's own tracking).
                    Err(ClientError::Api {
                        status,
                        code,
                        message,
                    }) if status.as_u16() == 400 => {
                        if shared
                            .inflight_listing
                            .swap(false, std::sync::atomic::Ordering::Relaxed)
                        {
                            tracing::warn!(
                                event = "inflight_listing_unsupported",
                                %code,
                                %message,
                                "payment-resource cannot list in-flight payouts; a dead holder's payout \
                                 is resumed only when named with --payout-id"
                            );
                        }
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        // Those waiting out a backoff are not read until they are due.
        for id in shared.tracked.due_ids(Instant::now()) {
            if seen.contains(&id) {
                continue;
            }
            match shared.resources.payments.get(id).await {
                Ok(p) => {
                    seen.insert(id);
                    found.push(p);
                }
                Err(ClientError::Api { status, code, .. }) if status.as_u16() == 404 => {
                    tracing::error!(event = "unknown_payout", payout_id = %id, %code, "no such payout");
                    // Nothing to work on: a batch run reports it at once; a long-running executor
                    // asks again at the capped backoff.
                    shared.tracked.error(id, 1);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    /// One page of `state` after `after`; returns the cursor of the next page (`None` at the end).
    async fn page(
        &self,
        state: PayoutState,
        after: Option<&str>,
        found: &mut Vec<Payout>,
        seen: &mut HashSet<Uuid>,
    ) -> Result<Option<String>, ClientError> {
        let api = &self.shared.resources.payments;
        let page = api.list(state, after, self.shared.config.page_size).await?;
        for p in page.items {
            if seen.insert(p.payout_id) {
                found.push(p);
            }
        }
        Ok(page.next_cursor.filter(|next| after != Some(next.as_str())))
    }
}

/// One account visit's result, for the pass loop.
struct Visit {
    /// Another live holder had the account for the whole wait.
    contended: bool,
    session_lost: bool,
    /// The acquire failed with an error (the lock service down, or its session gone): not the
    /// payouts' fault, so no error is counted against them; the pass ends and the worker pauses
    /// before it asks the lock service again.
    lock_unreachable: bool,
    /// A listed payout was already terminal: the pass's list is stale, the next pass lists afresh.
    stale: bool,
}

impl Visit {
    fn contended() -> Self {
        Self {
            contended: true,
            session_lost: false,
            lock_unreachable: false,
            stale: false,
        }
    }

    fn done(session: &Session, stale: bool) -> Self {
        Self {
            contended: false,
            session_lost: session.is_lost(),
            lock_unreachable: false,
            stale,
        }
    }
}

/// The payouts grouped by account, accounts in the order of their first payout (the pass's
/// shuffle), payouts in their order.
fn by_account(work: Vec<Payout>) -> Vec<(Uuid, Vec<Payout>)> {
    let mut visits: Vec<(Uuid, Vec<Payout>)> = Vec::new();
    let mut at: HashMap<Uuid, usize> = HashMap::new();
    for p in work {
        match at.get(&p.account_id) {
            Some(i) => visits[*i].1.push(p),
            None => {
                at.insert(p.account_id, visits.len());
                visits.push((p.account_id, vec![p]));
            }
        }
    }
    visits
}

pub struct Worker {
    pub n: u32,
    pub owner_id: String,
    pub shared: Arc<Shared>,
}

impl Worker {
    pub async fn run(self) -> WorkerExit {
        let shared = &self.shared;
        let config = &shared.config;
        let mut session: Option<Session> = None;
        let mut pending_cursor: Option<String> = None;
        let mut inflight_listed_at: Option<Instant> = None;
        let mut failures = 0u32;
        let exit = loop {
            if shared.shutdown.is_cancelled() {
                break WorkerExit::Shutdown;
            }
            let mut discovery = Discovery {
                shared,
                pending_cursor: &mut pending_cursor,
                inflight_listed_at: &mut inflight_listed_at,
                listed_inflight: false,
            };
            let pass = discovery.pass().await;
            let listed_inflight = discovery.listed_inflight || !config.payout_ids.is_empty();
            let found = match pass {
                Ok(found) => found,
                Err(e) => {
                    failures += 1;
                    tracing::warn!(event = "discovery_failed", worker = self.n, error = %e, failures);
                    if config.exit_when_idle && failures >= MAX_CONSECUTIVE_FAILURES {
                        break WorkerExit::Unreachable;
                    }
                    self.pause(config.poll_interval).await;
                    continue;
                }
            };
            let mut work: Vec<Payout> = Vec::new();
            let now = Instant::now();
            for p in found {
                if p.state.is_terminal() {
                    shared.tracked.done(p.payout_id);
                } else if shared.tracked.is_due(p.payout_id, now) {
                    work.push(p);
                }
            }
            if work.is_empty() {
                // An empty page after a cursor is not the end of the queue: start over first.
                if pending_cursor.take().is_some() {
                    continue;
                }
                // Nor is a pass that did not list the in-flight states: list them now.
                if !listed_inflight {
                    inflight_listed_at = None;
                    continue;
                }
                // A payout waiting out its backoff is still work: a batch run waits for it (its
                // error budget bounds the wait) instead of exiting idle.
                if let Some(at) = shared.tracked.next_retry() {
                    let wait = at.saturating_duration_since(Instant::now());
                    self.pause(wait.min(config.poll_interval)).await;
                    continue;
                }
                if config.exit_when_idle {
                    break WorkerExit::Idle;
                }
                self.pause(config.poll_interval).await;
                continue;
            }
            work.shuffle(&mut rand::rng());

            let mut progressed = false;
            // The first account of the pass that was held: waited for below, if nothing else could
            // be done.
            let mut contended: Option<(Uuid, Vec<Payout>)> = None;
            for (account, payouts) in by_account(work) {
                if shared.shutdown.is_cancelled() {
                    break;
                }
                let current = match self.session(&mut session).await {
                    Ok(s) => s,
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(event = "session_open_failed", worker = self.n, error = %e, failures);
                        break;
                    }
                };
                failures = 0;
                let visit = self.visit(current, account, &payouts, config.acquire_wait).await;
                if visit.session_lost {
                    session = None;
                }
                if visit.lock_unreachable {
                    // Every other account of this pass would meet the same lock service: end the
                    // pass without progress, so the worker pauses instead of spinning on it.
                    break;
                }
                if visit.contended {
                    contended.get_or_insert((account, payouts));
                } else {
                    progressed = true;
                }
                if visit.stale {
                    break;
                }
            }
            if config.exit_when_idle && failures >= MAX_CONSECUTIVE_FAILURES {
                break WorkerExit::Unreachable;
            }
            if !progressed {
                // Only held accounts stood in the way: rather than sleep and ask again, wait in
                // that account's queue for the poll interval (woken by its release).
                let waited = match (contended, session.as_ref()) {
                    (Some((account, payouts)), Some(current)) if !shared.shutdown.is_cancelled() => {
                        Some(self.visit(current, account, &payouts, config.poll_interval).await)
                    }
                    _ => None,
                };
                match waited {
                    Some(visit) => {
                        if visit.session_lost {
                            session = None;
                        }
                        if visit.lock_unreachable {
                            self.pause(config.poll_interval).await;
                        }
                    }
                    None => self.pause(config.poll_interval).await,
                }
            }
        };
        if let Some(s) = session
            && let Err(e) = s.close().await
        {
            tracing::warn!(event = "session_close_failed", worker = self.n, error = %e);
        }
        tracing::info!(event = "worker_stopped", worker = self.n, exit = ?exit);
        exit
    }

    /// Sleeps, or returns early on shutdown.
    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.shared.shutdown.cancelled() => {}
        }
    }

    /// The worker's open session, opening a new one if there is none or it was lost.
    async fn session<'s>(&self, slot: &'s mut Option<Session>) -> Result<&'s Session, ClientError> {
        if slot.as_ref().is_some_and(Session::is_lost) {
            *slot = None;
        }
        if slot.is_none() {
            let opened = self
                .shared
                .lock_client
                .open_session(&self.owner_id, self.shared.config.session_ttl)
                .await?;
            *slot = Some(opened);
        }
        slot.as_ref()
            .ok_or_else(|| ClientError::Protocol("no session after opening one".into()))
    }

    /// One account: acquire its lock (waiting up to `wait` in the account's queue on lock-server,
    /// woken by the release before it), work its payouts one after the other, and release. Every
    /// payout attempt carries a newer token than the one before it on the account (strict `<` at
    /// (a) and (d)): after an attempt that may have written with the token, the key is re-entered
    /// for the next one ([`LockHandle::reenter`]: one request, and nobody comes in between). The
    /// visit ends early when a listed payout was already terminal (another holder visited the
    /// account since the pass listed it: the rest of the list is stale, and the pass ends too),
    /// when the lock is lost, a resource fenced the token out, an attempt failed with an error, or
    /// the process is shutting down.
    async fn visit(&self, session: &Session, account: Uuid, payouts: &[Payout], wait: Duration) -> Visit {
        let shared = &self.shared;
        let config = &shared.config;
        let key = dlock_common::grant::account_key(account);

        let mut picked = Instant::now();
        let mut lock = match session.acquire(&key, config.lease_ttl, wait).await {
            Ok(lock) => {
                shared.metrics.acquire(AcquireResult::granted, picked.elapsed());
                lock
            }
            Err(ClientError::Contended { .. }) => {
                shared.metrics.acquire(AcquireResult::contended, picked.elapsed());
                shared.metrics.processed(Outcome::contended);
                tracing::debug!(event = "payout_contended", account_id = %account, lock_key = %key);
                return Visit::contended();
            }
            Err(e) => return self.lock_failed(session, &key, payouts.first(), e),
        };
        let mut stale = false;
        for (i, p) in payouts.iter().enumerate() {
            if shared.shutdown.is_cancelled() {
                break;
            }
            if i > 0 {
                picked = Instant::now();
                lock = match lock.reenter().await {
                    Ok(lock) => {
                        shared.metrics.acquire(AcquireResult::granted, picked.elapsed());
                        lock
                    }
                    // Our lease had lapsed and another holder has the account now: it works it.
                    Err(ClientError::Contended { .. }) => {
                        shared.metrics.acquire(AcquireResult::contended, picked.elapsed());
                        return Visit::done(session, false);
                    }
                    Err(e) => return self.lock_failed(session, &key, Some(p), e),
                };
            }
            let ended = self.attempt(&lock, p).await;
            // Already terminal: another holder visited the account since this pass listed it, so
            // the rest of what the pass listed is stale too. The next pass lists afresh.
            stale = matches!(ended, Some(Ok(Ended::NotClaimable { .. })));
            let go_on = matches!(
                ended,
                Some(Ok(Ended::Posted { .. }
                    | Ended::Failed { .. }
                    | Ended::AlreadyTerminal { .. }
                    | Ended::Unresolved
                    | Ended::Abandoned { .. }))
            );
            let outcome = self.classify(p, &key, lock.token().get(), ended);
            shared.metrics.processed(outcome);
            if matches!(outcome, Outcome::posted | Outcome::failed) {
                shared.metrics.payout_done(picked.elapsed());
            }
            if !go_on || lock.is_lost() {
                break;
            }
        }
        // Always give the lock back. A stale release (the grant was no longer ours) is logged by the
        // client and never retried.
        let token = lock.token();
        if let Err(e) = lock.release().await {
            tracing::warn!(event = "lock_release_failed", lock_key = %key, fencing_token = token.get(), error = %e);
        }
        Visit::done(session, stale)
    }

    /// The account's lock could not be had for an error (the lock service down, or our session
    /// gone): not the payouts' fault, so no error is counted against them. `next` is the payout
    /// the lock was wanted for, for the log.
    fn lock_failed(&self, session: &Session, key: &str, next: Option<&Payout>, e: ClientError) -> Visit {
        let session_lost = matches!(e, ClientError::SessionGone { .. }) || session.is_lost();
        let payout_id = next.map(|p| p.payout_id.to_string()).unwrap_or_default();
        tracing::warn!(
            event = "lock_acquire_failed",
            worker = self.n,
            payout_id = %payout_id,
            lock_key = %key,
            error = %e,
        );
        self.shared.metrics.processed(Outcome::error);
        Visit {
            contended: false,
            session_lost,
            lock_unreachable: true,
            stale: false,
        }
    }

    /// One payout under `lock`: the critical section, or `None` if SIGTERM's grace period ran out
    /// first.
    async fn attempt(&self, lock: &LockHandle, p: &Payout) -> Option<Result<Ended, ClientError>> {
        let shared = &self.shared;
        tracing::info!(
            event = "lock_acquired",
            worker = self.n,
            lock_key = %lock.key(),
            fencing_token = lock.token().get(),
            payout_id = %p.payout_id,
            state = %p.state,
        );
        let critical = Critical {
            resources: &shared.resources,
            lock,
            payout_id: p.payout_id,
            owner_id: &self.owner_id,
        };
        // On SIGTERM the current payout may finish within the grace period; past it, the section is
        // dropped mid-way, which is safe: every step is fenced and recorded, and a successor resumes.
        let grace = async {
            shared.shutdown.cancelled().await;
            tokio::time::sleep(shared.config.shutdown_grace).await;
        };
        tokio::select! {
            ended = critical.run() => Some(ended),
            _ = grace => None,
        }
    }

    /// Turns the section's end into an outcome, with its log event; records what to look at again.
    fn classify(
        &self,
        p: &Payout,
        key: &str,
        token: i64,
        ended: Option<Result<Ended, ClientError>>,
    ) -> Outcome {
        let shared = &self.shared;
        let tracked = &shared.tracked;
        let id = p.payout_id;
        let Some(ended) = ended else {
            tracing::warn!(event = "payout_interrupted", payout_id = %id, fencing_token = token);
            tracked.watch(id);
            return Outcome::interrupted;
        };
        match ended {
            Ok(Ended::Posted { .. }) => {
                tracked.done(id);
                Outcome::posted
            }
            Ok(Ended::Failed { reason }) => {
                tracing::info!(event = "payout_failed", payout_id = %id, fencing_token = token, reason);
                tracked.done(id);
                Outcome::failed
            }
            Ok(Ended::AlreadyTerminal { state, claim_token }) => {
                tracing::info!(
                    event = "payout_skipped",
                    payout_id = %id,
                    fencing_token = token,
                    %state,
                    claim_token = ?claim_token,
                    "already terminal"
                );
                tracked.done(id);
                Outcome::skipped
            }
            Ok(Ended::NotClaimable { message }) => {
                tracing::info!(event = "payout_skipped", payout_id = %id, fencing_token = token, reason = %message, "already terminal");
                tracked.done(id);
                Outcome::skipped
            }
            Ok(Ended::Unresolved) => {
                // Not an error and never given up: rail-proxy's deadline ends every ambiguity
                // (ABANDONED), so asking again later always terminates.
                tracing::warn!(
                    event = "payout_unresolved",
                    payout_id = %id,
                    fencing_token = token,
                    "the rail cannot tell yet what became of the submission; will ask again"
                );
                tracked.answered(id);
                Outcome::unresolved
            }
            Ok(Ended::Abandoned { reason }) => {
                tracing::warn!(event = "payout_abandoned", payout_id = %id, fencing_token = token, reason);
                tracked.done(id);
                Outcome::abandoned
            }
            Err(ClientError::FencedOut(f)) => {
                // Terminal for this attempt: never retried with this token, nor with a fresh one
                // here. A later pass may take it up again only with a new grant, after re-reading.
                if let Some(resource) = resource(f.resource_type()) {
                    shared.metrics.fenced_out(resource);
                }
                tracing::warn!(
                    event = "fenced_out",
                    key,
                    payout_id = %id,
                    resource = f.resource_type(),
                    resource_id = f.resource_id(),
                    presented = f.presented(),
                    stored = f.highest(),
                    owner_id = f.owner_id(),
                    "a resource refused our token: a newer grant has written it; attempt abandoned"
                );
                tracked.answered(id);
                Outcome::fenced_out
            }
            Err(e @ ClientError::Api { .. }) if e.is_terminal() => {
                tracing::warn!(event = "fenced_out", key, payout_id = %id, presented = token, error = %e);
                tracked.answered(id);
                Outcome::fenced_out
            }
            Err(ClientError::LockLost { reason, .. }) => {
                tracing::warn!(
                    event = "lock_lost",
                    key,
                    payout_id = %id,
                    fencing_token = token,
                    %reason,
                    "critical section abandoned: the lock is no longer ours"
                );
                tracked.answered(id);
                Outcome::lock_lost
            }
            Err(e) => {
                // Tried again after a backoff (and never given up outside a batch run).
                let retry = tracked.error(id, shared.config.max_errors_per_payout);
                tracing::warn!(
                    event = "payout_attempt_failed",
                    key,
                    payout_id = %id,
                    fencing_token = token,
                    error = %e,
                    errors = retry.errors,
                    retry_in_ms = retry
                        .retry_in
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                );
                Outcome::error
            }
        }
    }
}

/// The `resource` label for a `resourceType` from a FENCED_OUT body.
fn resource(resource_type: &str) -> Option<Resource> {
    match resource_type {
        "account" => Some(Resource::account),
        "ledger" => Some(Resource::ledger),
        "payout" => Some(Resource::payout),
        "rail" => Some(Resource::rail),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(give_up_at_budget: bool) -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_millis(1_000),
            budget: 3,
            give_up_at_budget,
        }
    }

    #[test]
    fn backoff_doubles_from_the_base_then_is_the_cap_from_the_budget_on() {
        let p = RetryPolicy {
            budget: 10,
            ..policy(false)
        };
        let ms = |n| p.backoff(n).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4), ms(5)], [100, 200, 400, 800, 1_000]);
        assert_eq!(ms(u32::MAX), 1_000);
        let p = policy(false);
        assert_eq!(p.backoff(3), p.max, "from the budget on: the cap");
        for n in 1..6 {
            let j = p.jittered(n);
            assert!(j >= p.backoff(n) / 2 && j <= p.backoff(n), "{n}: {j:?}");
        }
    }

    /// Service mode: a payout is never given up. While it waits out its backoff it is not due (so
    /// discovery skips it, only until then); an answered attempt resets it.
    #[test]
    fn service_mode_backs_off_and_never_gives_up() {
        let id = Uuid::new_v4();
        let gauges = BackoffGauges::default();
        let t = Tracked::new(&[id], policy(false), gauges.clone());
        assert!(t.is_due(id, Instant::now()));
        for n in 1..=10 {
            let before = Instant::now();
            let r = t.error(id, 3);
            assert_eq!(r.errors, n);
            let wait = r.retry_in.expect("always a next attempt");
            assert!(wait >= policy(false).backoff(n) / 2, "{n}: {wait:?}");
            let at = t.next_retry().expect("backing off");
            assert!(at >= before + wait && at <= Instant::now() + wait, "{n}");
            assert!(
                !t.is_due(id, at - Duration::from_millis(1)),
                "{n}: due during its backoff"
            );
            assert!(t.due_ids(at - Duration::from_millis(1)).is_empty());
            assert!(t.is_due(id, at), "{n}: not due after its backoff");
            assert_eq!(t.due_ids(at), vec![id]);
        }
        assert!(t.given_up().is_empty());
        assert_eq!((gauges.backing_off.get(), gauges.over_budget.get()), (1, 1));
        t.answered(id);
        assert_eq!((gauges.backing_off.get(), gauges.over_budget.get()), (0, 0));
        assert_eq!(t.next_retry(), None);
        assert!(t.is_due(id, Instant::now()));
        assert_eq!(t.error(id, 3).errors, 1, "reset by the answer");
        t.done(id);
        assert_eq!(gauges.backing_off.get(), 0);
    }

    /// Batch mode: backoff below the budget, then given up at it (for the report), and never due
    /// again in this run.
    #[test]
    fn batch_mode_gives_up_at_the_budget() {
        let id = Uuid::new_v4();
        let gauges = BackoffGauges::default();
        let t = Tracked::new(&[id], policy(true), gauges.clone());
        assert!(t.error(id, 3).retry_in.is_some());
        assert!(t.error(id, 3).retry_in.is_some());
        assert!(t.given_up().is_empty());
        assert!(t.next_retry().is_some(), "backing off is still work");
        assert_eq!(t.error(id, 3).retry_in, None);
        assert_eq!(t.given_up(), vec![id]);
        assert_eq!(t.next_retry(), None);
        let much_later = Instant::now() + Duration::from_secs(3_600);
        assert!(!t.is_due(id, much_later));
        assert!(t.due_ids(much_later).is_empty());
        assert_eq!((gauges.backing_off.get(), gauges.over_budget.get()), (0, 1));
        // An unknown payout: its budget is 1.
        let unknown = Uuid::new_v4();
        assert_eq!(t.error(unknown, 1).retry_in, None);
        t.done(id);
        assert_eq!(t.given_up(), vec![unknown]);
    }

    fn payout(account: u128, n: u128) -> Payout {
        serde_json::from_value(serde_json::json!({
            "payoutId": Uuid::from_u128(n), "accountId": Uuid::from_u128(account), "amountMinor": 1,
            "currency": "EUR", "state": "PENDING", "claimedBy": null, "claimToken": null,
            "idempotencyKey": format!("k{n}"), "attemptCount": 0, "reservedMinor": 0,
            "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z"
        }))
        .unwrap()
    }

    /// One visit per account, in the order of each account's first payout in the (shuffled) list,
    /// its payouts in list order; nothing lost or repeated.
    #[test]
    fn the_pass_visits_each_account_once_in_the_order_it_first_appears() {
        let work = vec![
            payout(2, 10),
            payout(1, 11),
            payout(2, 12),
            payout(3, 13),
            payout(1, 14),
        ];
        let visits: Vec<(u128, Vec<u128>)> = by_account(work)
            .into_iter()
            .map(|(a, ps)| (a.as_u128(), ps.iter().map(|p| p.payout_id.as_u128()).collect()))
            .collect();
        assert_eq!(visits, vec![(2, vec![10, 12]), (1, vec![11, 14]), (3, vec![13])]);
        assert!(by_account(Vec::new()).is_empty());
    }

    #[test]
    fn resource_labels() {
        assert_eq!(resource("rail"), Some(Resource::rail));
        assert_eq!(resource("account"), Some(Resource::account));
        assert_eq!(resource("vault"), None);
    }
}
