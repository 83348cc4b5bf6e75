//! A service unavailable for a moment. rail-proxy, with a payout already reserved (RAIL_SUBMITTED,
//! its amount held on the account): every submission fails with a transport error until a new
//! rail-proxy answers on the same port. lock-server, before the payout is claimed: every acquire
//! fails until it is back. Real processes on loopback over real PostgreSQL 16 (lockdb and paydb),
//! as in the proof tests.
//!
//! No payout may wait for ever: an executor backs off and tries again — a long-running one even past
//! `--max-errors-per-payout`, which it only reports — and a batch run waits out the backoff rather
//! than exit idle; if the run spends the budget it exits non-zero naming the payout, and the next run
//! finishes it. In every case the payout ends POSTED, paid once, with nothing left reserved.
//!
//! Binaries come from the workspace build (see tests/proof.rs).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_testkit::TestDb;
use dlock_testkit::procs::Service;
use dlock_testkit::stack::{Stack, StackOptions, log_events, process_state};
use dlock_testkit::wait::eventually;
use payout_executor::model::{Payout, PayoutState};
use serde_json::Value;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(60);
const CURRENCY: &str = "EUR";
const OPENING: i64 = 10_000;
const AMOUNT: i64 = 700;

static NEXT: AtomicU32 = AtomicU32::new(0);

struct Env {
    stack: Stack,
    _lockdb: TestDb,
    _paydb: TestDb,
}

impl Drop for Env {
    /// The service logs are kept when the test failed (the panic messages name them).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.stack.log_dir);
        }
    }
}

fn log_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "payout-outage-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The stack, an account holding [`OPENING`] and one PENDING payout of [`AMOUNT`] on it; then
/// rail-proxy is stopped (its port refuses connections until it is restarted).
async fn outage(name: &str) -> (Env, Payout) {
    let (mut env, p) = with_payout(name).await;
    env.stack.rail_proxy.stop();
    (env, p)
}

/// The stack, an account holding [`OPENING`] and one PENDING payout of [`AMOUNT`] on it.
async fn with_payout(name: &str) -> (Env, Payout) {
    let lockdb = dlock_testkit::lockdb().await;
    let paydb = dlock_testkit::paydb().await;
    let opts = StackOptions::new(log_dir(name));
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts)
        .await
        .unwrap_or_else(|e| panic!("start the stack (logs in {}): {e:#}", opts.log_dir.display()));
    let account = stack.create_account(CURRENCY, OPENING).await.unwrap();
    let payout = stack.create_payout(account, AMOUNT, CURRENCY).await.unwrap();
    let env = Env {
        stack,
        _lockdb: lockdb,
        _paydb: paydb,
    };
    (env, payout)
}

/// `event` lines of `svc`'s log about payout `id`.
fn events(svc: &Service, event: &str, id: Uuid) -> Vec<Value> {
    log_events(&svc.log, event)
        .into_iter()
        .filter(|e| e["payout_id"] == id.to_string())
        .collect()
}

async fn wait_failed_attempts(svc: &Service, id: Uuid, n: usize) {
    eventually(
        &format!("{} to fail {n} rail submissions of {id}", svc.name),
        LIMIT,
        || async { (events(svc, "payout_attempt_failed", id).len() >= n).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log {}", svc.log.display()));
}

/// The stranded state the outage leaves while it lasts: reserved, in flight, unknown to the rail.
async fn assert_held_in_flight(stack: &Stack, p: &Payout) {
    let now = stack.payout(p.payout_id).await.unwrap();
    assert_eq!(
        (now.state, now.reserved_minor),
        (PayoutState::RailSubmitted, AMOUNT),
        "{now:?}"
    );
    assert_eq!(stack.account(p.account_id).await.unwrap().reserved_minor, AMOUNT);
    assert_eq!(stack.rail_received().await.unwrap().received(p.payout_id), 0);
}

/// Waits (bounded) until the payout is terminal; its state then, or the last one seen.
async fn wait_terminal(stack: &Stack, id: Uuid, limit: Duration) -> Payout {
    let ended = eventually(&format!("payout {id} to end"), limit, || async {
        stack.payout(id).await.ok().filter(|p| p.state.is_terminal())
    })
    .await;
    match ended {
        Ok(p) => p,
        Err(_) => stack.payout(id).await.unwrap(),
    }
}

/// POSTED, paid once, debited once, nothing left reserved on the payout or the account.
async fn assert_finished(stack: &Stack, p: &Payout, now: &Payout, log: &Service) {
    assert_eq!(
        (now.state, now.reserved_minor),
        (PayoutState::Posted, 0),
        "the payout did not end after the outage: {now:?}; log {}",
        log.log.display()
    );
    let account = stack.account(p.account_id).await.unwrap();
    assert_eq!(
        (account.balance_minor, account.reserved_minor),
        (OPENING - AMOUNT, 0),
        "{account:?}"
    );
    let received = stack.rail_received().await.unwrap();
    assert_eq!(
        (received.received(p.payout_id), received.paid(p.payout_id)),
        (1, 1)
    );
    assert_eq!(stack.reconciliation().await.unwrap()["clean"], true);
}

/// The executor's retry gauges (backing off, over the error budget).
async fn gauges(stack: &Stack, svc: &Service) -> (f64, f64) {
    let url = svc.url();
    (
        stack.metric(&url, "payouts_backing_off", &[]).await.unwrap(),
        stack
            .metric(&url, "payouts_over_error_budget", &[])
            .await
            .unwrap(),
    )
}

/// The defect: every executor retried the submission five times within ~50 ms, logged
/// `payout_given_up` and never came back to it, so the payout stayed RAIL_SUBMITTED with its amount
/// reserved for as long as the executors lived. Now a long-running executor goes past the budget
/// (reporting it once at ERROR, in `payouts_over_error_budget`) and still finishes the payout once
/// rail-proxy is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_running_executor_finishes_a_payout_after_a_rail_proxy_outage_past_its_error_budget() {
    let (mut env, p) = outage("service").await;
    let id = p.payout_id;
    let mut e1 = env
        .stack
        .start_executor(env.stack.service_executor_spec("e1").unwrap().args([
            "--max-errors-per-payout",
            "3",
            "--payout-retry-backoff-ms",
            "100",
            "--payout-retry-backoff-max-ms",
            "1000",
        ]))
        .await
        .unwrap();
    // The error budget is spent while rail-proxy is away.
    wait_failed_attempts(&e1, id, 3).await;
    assert_held_in_flight(&env.stack, &p).await;
    let during = gauges(&env.stack, &e1).await;

    env.stack.restart_rail_proxy_same_port(true, &[]).await.unwrap();
    let now = wait_terminal(&env.stack, id, Duration::from_secs(30)).await;
    assert_finished(&env.stack, &p, &now, &e1).await;

    // Reported once, never given up; the gauges saw it and saw it end.
    assert_eq!(events(&e1, "payout_retry_backoff", id).len(), 1);
    assert!(events(&e1, "payout_given_up", id).is_empty());
    assert_eq!(during, (1.0, 1.0), "backing off, over budget, during the outage");
    let stack = &env.stack;
    eventually("the retry gauges to return to zero", LIMIT, || async {
        (gauges(stack, &e1).await == (0.0, 0.0)).then_some(())
    })
    .await
    .unwrap();
    e1.stop();
}

/// How long rail-proxy stays away in the batch scenario, from the first failed submission: "a few
/// hundred milliseconds", as in the fault-injection run that found the defect. This is the fault's
/// duration, not a wait for anything.
const OUTAGE: Duration = Duration::from_millis(500);

/// A batch run whose payout is backing off has work left: it waits for the retry (its budget bounds
/// the wait) instead of exiting idle or giving up, and finishes the payout when rail-proxy is back.
/// With the default budget (5 errors) and a 200 ms first backoff the budget spans at least 1.5 s; the
/// old executor spent it within some 50 ms of the outage's start and exited non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_executor_waits_out_the_backoff_and_finishes_the_payout_after_the_outage() {
    let (mut env, p) = outage("batch").await;
    let id = p.payout_id;
    let mut e1 = env
        .stack
        .start_executor(env.stack.executor_spec("e1").unwrap().args([
            "--payout-retry-backoff-ms",
            "200",
            "--payout-retry-backoff-max-ms",
            "1000",
        ]))
        .await
        .unwrap();
    wait_failed_attempts(&e1, id, 1).await;
    tokio::time::sleep(OUTAGE).await;
    let running_during_outage = matches!(process_state(e1.pid()), Some(s) if s != 'Z');
    assert_held_in_flight(&env.stack, &p).await;

    env.stack.restart_rail_proxy_same_port(true, &[]).await.unwrap();
    let exit = e1.wait_exit(LIMIT).await.expect("the batch run ends");
    let now = env.stack.payout(id).await.unwrap();
    assert_finished(&env.stack, &p, &now, &e1).await;
    assert!(running_during_outage, "the batch run ended during the outage");
    assert!(exit.success(), "{exit}; log {}", e1.log.display());
    assert!(events(&e1, "payout_given_up", id).is_empty());
    let stopped = log_events(&e1.log, "worker_stopped");
    assert!(stopped.iter().all(|e| e["exit"] == "Idle"), "{stopped:?}");
}

/// An outage longer than a batch run's error budget: the run backs off between attempts, stops at
/// the budget and exits non-zero naming the payout — it hands it on — and the next run finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_executor_that_spends_the_budget_exits_non_zero_naming_the_payout_and_the_next_run_finishes_it()
 {
    let (mut env, p) = outage("batch-budget").await;
    let id = p.payout_id;
    let mut e1 = env
        .stack
        .start_executor(env.stack.executor_spec("e1").unwrap().args([
            "--max-errors-per-payout",
            "3",
            "--payout-retry-backoff-ms",
            "100",
            "--payout-retry-backoff-max-ms",
            "400",
        ]))
        .await
        .unwrap();
    let exit = e1.wait_exit(LIMIT).await.expect("the batch run ends");
    assert_eq!(exit.code(), Some(1), "log {}", e1.log.display());
    assert_held_in_flight(&env.stack, &p).await;

    // Three attempts, each after the backoff the one before it scheduled; then given up, named.
    let failed = events(&e1, "payout_attempt_failed", id);
    assert_eq!(failed.len(), 3, "{failed:?}");
    let waits: Vec<Option<u64>> = failed.iter().map(|e| e["retry_in_ms"].as_u64()).collect();
    assert!(
        waits[0].is_some() && waits[1].is_some() && waits[2].is_none(),
        "{waits:?}"
    );
    let at = |e: &Value| {
        chrono::DateTime::parse_from_rfc3339(e["timestamp"].as_str().unwrap_or_default())
            .unwrap_or_else(|err| panic!("timestamp of {e}: {err}"))
    };
    for (pair, wait) in failed.windows(2).zip(&waits) {
        let gap = (at(&pair[1]) - at(&pair[0])).num_milliseconds();
        let wait = i64::try_from(wait.unwrap_or_default()).unwrap();
        assert!(
            gap + 5 >= wait,
            "tried again after {gap} ms, before its {wait} ms backoff"
        );
    }
    assert_eq!(events(&e1, "payout_given_up", id).len(), 1);
    let stopped = log_events(&e1.log, "executor_stopped");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0]["given_up_ids"], id.to_string(), "{stopped:?}");
    assert_eq!(stopped[0]["clean"], false);

    // The next run takes it over.
    env.stack.restart_rail_proxy_same_port(true, &[]).await.unwrap();
    let mut e2 = env
        .stack
        .start_executor(env.stack.executor_spec("e2").unwrap())
        .await
        .unwrap();
    let exit = e2.wait_exit(LIMIT).await.expect("the second run ends");
    assert!(exit.success(), "{exit}; log {}", e2.log.display());
    let now = env.stack.payout(id).await.unwrap();
    assert_finished(&env.stack, &p, &now, &e2).await;
}

/// The timestamps of `event` lines about payout `id`.
fn times(svc: &Service, event: &str, id: Uuid) -> Vec<chrono::DateTime<chrono::FixedOffset>> {
    events(svc, event, id)
        .iter()
        .map(|e| {
            chrono::DateTime::parse_from_rfc3339(e["timestamp"].as_str().unwrap_or_default())
                .unwrap_or_else(|err| panic!("timestamp of {e}: {err}"))
        })
        .collect()
}

/// The poll interval of the lock-server outage scenario.
const POLL_MS: i64 = 300;

/// lock-server down: every acquire fails at once (connection refused). The old executor counted
/// such an attempt as progress and went straight into its next pass, so it asked the dead lock
/// service again within milliseconds, over and over; now a failed acquire ends the pass and the
/// worker waits its poll interval first. No error is counted against the payout (the lock service
/// failed, not the payout), and when lock-server is back the payout ends POSTED, paid once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acquire_pauses_the_worker_and_the_payout_ends_once_lock_server_is_back() {
    let (mut env, p) = with_payout("lock-server").await;
    let mut e1 = env
        .stack
        .start_executor(env.stack.service_executor_spec("e1").unwrap().args([
            "--workers".to_owned(),
            "1".to_owned(),
            "--poll-interval-ms".to_owned(),
            POLL_MS.to_string(),
        ]))
        .await
        .unwrap();
    // The first payout is paid while lock-server runs: the worker holds an open session when the
    // outage begins, so the outage meets the acquire itself.
    let first = wait_terminal(&env.stack, p.payout_id, Duration::from_secs(30)).await;
    assert_eq!(
        first.state,
        PayoutState::Posted,
        "{first:?}; log {}",
        e1.log.display()
    );
    env.stack
        .lock_server
        .as_mut()
        .expect("the stack's lock-server")
        .stop();
    // Payouts are created after the stop, so every attempt on them meets the outage.
    let account = env.stack.create_account(CURRENCY, OPENING).await.unwrap();
    let q = env.stack.create_payout(account, AMOUNT, CURRENCY).await.unwrap();
    let qid = q.payout_id;
    eventually("four failed acquires of the payout", LIMIT, || async {
        (times(&e1, "lock_acquire_failed", qid).len() >= 4).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log {}", e1.log.display()));
    let failed = times(&e1, "lock_acquire_failed", qid);
    for pair in failed.windows(2) {
        let gap = (pair[1] - pair[0]).num_milliseconds();
        assert!(
            gap + 5 >= POLL_MS,
            "asked the dead lock service again after {gap} ms, within its {POLL_MS} ms poll interval; log {}",
            e1.log.display()
        );
    }
    assert!(
        events(&e1, "payout_attempt_failed", qid).is_empty(),
        "an unreachable lock service is not the payout's error"
    );

    env.stack.restart_lock_server_same_port().await.unwrap();
    for payout in [&p, &q] {
        let now = wait_terminal(&env.stack, payout.payout_id, Duration::from_secs(30)).await;
        // The first one was already POSTED; both must be, each paid exactly once.
        assert_eq!(
            (now.state, now.reserved_minor),
            (PayoutState::Posted, 0),
            "{now:?}; log {}",
            e1.log.display()
        );
        let received = env.stack.rail_received().await.unwrap();
        assert_eq!(
            (received.received(now.payout_id), received.paid(now.payout_id)),
            (1, 1)
        );
    }
    assert_eq!(env.stack.reconciliation().await.unwrap()["clean"], true);
    e1.stop();
}
