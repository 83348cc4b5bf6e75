//! The cross-process proof: real lock-server, rail-stub, rail-proxy, payment-resource and
//! payout-executor processes on loopback, over two separate real PostgreSQL 16 servers (lockdb and
//! paydb). A holder is stopped with SIGSTOP between its last lock check and its write, its lease
//! lapses, a second executor takes over with a strictly higher token and finishes the work, and the
//! paused holder, resumed, is refused by the resources themselves — the rail is paid once, the
//! account is debited once, the books reconcile.
//!
//! Negative controls run the same scenarios with the kill switches off and with the broken acquire
//! (no `nextval` in `DO UPDATE`; on etcd the per-key version as the token), and assert what then
//! actually happens.
//!
//! Every test runs once per lock backend, from the same source: `<test>::postgres` (lockdb on its own
//! PostgreSQL 16 server) and `<test>::etcd` (lock-server `--backend etcd` on a real single-member
//! etcd; paydb stays PostgreSQL). The assertions are the same; where the backends differ in what they
//! show (a lapsed grant, the broken token), the difference is spelled out where it is checked.
//!
//! Binaries come from the workspace build: `cargo test --workspace` builds them; for this crate
//! alone first run `cargo build --bins -p lock-server -p payment-resource -p rail-proxy -p rail-stub
//! -p payout-executor`.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_client::LockState;
use dlock_testkit::TestDb;
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::procs::Service;
use dlock_testkit::stack::{self, LockBackend, Stack, StackOptions, log_events, process_state};
use dlock_testkit::wait::eventually;
use payout_executor::model::{Payout, PayoutState};
use serde_json::Value;
use uuid::Uuid;

/// Every awaited condition gives up after this long, with a message saying what it waited for.
const LIMIT: Duration = Duration::from_secs(60);
const CURRENCY: &str = "EUR";
/// The paused holder's lease: short, so that it lapses quickly once the process is stopped.
const SHORT_LEASE_MS: &str = "1500";
/// The paused holder's session outlives the test, so on PostgreSQL its lapsed grant stays on the row
/// (EXPIRED) for the takeover to find — the path the broken acquire gets wrong. (On etcd the grant's
/// own lease decides: the key goes when it lapses, whatever the session.)
const LONG_SESSION_MS: &str = "120000";

static NEXT: AtomicU32 = AtomicU32::new(0);

// For each named `async fn(LockBackend)`, a module of the same name with one test per backend.
dlock_testkit::on_both_backends!(
    postgres: super::LockBackend::Postgres, etcd: super::LockBackend::Etcd;
    paused_holder_is_fenced_at_rail_proxy,
    paused_holder_is_fenced_at_payment_resource,
    paused_holder_returning_to_a_payout_the_takeover_posted_changes_nothing,
    batch_of_two_executors_posts_every_payout_exactly_once,
    killed_executor_payout_is_finished_by_the_other_without_paying_twice,
    negative_control_rail_fencing_off_stale_submit_is_not_fenced_at_the_rail,
    negative_control_payment_fencing_off_stale_post_lands_and_regresses_the_fence,
    negative_control_broken_acquire_hands_the_takeover_the_paused_holders_token,
    executor_serves_metrics_and_stops_gracefully_on_sigterm,
    ambiguous_timeout_is_resolved_by_asking_the_rail_and_a_rejection_fails_the_payout,
    bad_configuration_is_refused_and_nothing_is_written,
    payouts_exceeding_the_balance_reach_the_rail_only_when_covered,
    negative_control_without_a_funds_check_before_the_rail_the_rail_pays_what_the_ledger_cannot_debit,
    a_crash_between_recording_the_attempt_and_forwarding_it_ends_abandoned,
);

fn log_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "payout-proof-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

struct Env {
    stack: Stack,
    /// `None` on etcd: the locks do not live in PostgreSQL there.
    _lockdb: Option<TestDb>,
    _paydb: TestDb,
    /// The etcd member of a lock-server running in this process (the stack's own is in the stack).
    _etcd: Option<EtcdCluster>,
}

impl Drop for Env {
    /// The service logs are kept when the test failed (the panic messages name them).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.stack.log_dir);
        }
    }
}

async fn env(name: &str, backend: LockBackend, configure: impl FnOnce(&mut StackOptions)) -> Env {
    let lockdb = match backend {
        LockBackend::Postgres => Some(dlock_testkit::lockdb().await),
        LockBackend::Etcd => None,
    };
    let paydb = dlock_testkit::paydb().await;
    let mut opts = StackOptions::new(log_dir(&format!("{name}-{backend}")));
    opts.lock_backend = backend;
    configure(&mut opts);
    let lockdb_url = lockdb.as_ref().map(TestDb::app_url).unwrap_or_default();
    let stack = Stack::start(&lockdb_url, &paydb.app_url(), &opts)
        .await
        .unwrap_or_else(|e| panic!("start the stack (logs in {}): {e:#}", opts.log_dir.display()));
    Env {
        stack,
        _lockdb: lockdb,
        _paydb: paydb,
        _etcd: None,
    }
}

async fn wait_stopped(svc: &Service) {
    let pid = svc.pid();
    eventually(
        &format!("{} (pid {pid}) to stop itself (state T)", svc.name),
        LIMIT,
        || async move { (process_state(pid) == Some('T')).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log: {}", svc.log.display()));
}

async fn wait_exit(svc: &mut Service) -> ExitStatus {
    let name = svc.name.clone();
    let log = svc.log.display().to_string();
    svc.wait_exit(LIMIT)
        .await
        .unwrap_or_else(|| panic!("{name} did not exit within {}s; log: {log}", LIMIT.as_secs()))
}

/// Waits until the paused holder's lease on `key` has lapsed on the lock-server and checks what the
/// server then shows for the paused holder's grant, `token`. Each store decides the lapse by its own
/// clock and shows it its own way: lockdb keeps the row, EXPIRED with its token, until someone takes
/// the key (by lockdb's `now()`); etcd deletes the key together with its lease when the lease's TTL
/// runs out (etcd's lease clock), so the key reads FREE and no token is left to show.
async fn wait_lapsed(stack: &Stack, key: &str, token: i64) {
    let backend = stack.lock_backend;
    let lapsed = match backend {
        LockBackend::Postgres => LockState::Expired,
        LockBackend::Etcd => LockState::Free,
    };
    let shown = eventually(
        &format!("the lease on {key} to lapse ({lapsed:?} on {backend})"),
        LIMIT,
        || async {
            let s = stack.lock_status(key).await.ok()?;
            (s.state == lapsed).then(|| s.fencing_token.map(|t| t.get()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    match backend {
        LockBackend::Postgres => assert_eq!(shown, Some(token), "lockdb keeps the lapsed grant"),
        LockBackend::Etcd => assert_eq!(shown, None, "etcd deleted the key with its lease"),
    }
}

/// The token a stopped executor held when it stopped itself (its `fault_pause` event).
fn paused_token(svc: &Service) -> i64 {
    let pause = log_events(&svc.log, "fault_pause");
    pause
        .first()
        .and_then(|e| e["fencing_token"].as_i64())
        .unwrap_or_else(|| panic!("no fault_pause with a token in {}", svc.log.display()))
}

/// The fencing tokens an executor's log says it acquired `key` with, in order.
fn acquired_tokens(svc: &Service, key: &str) -> Vec<i64> {
    log_events(&svc.log, "lock_acquired")
        .iter()
        .filter(|e| e["lock_key"] == key)
        .filter_map(|e| e["fencing_token"].as_i64())
        .collect()
}

fn fenced_events(svc: &Service) -> Vec<Value> {
    log_events(&svc.log, "fenced_out")
}

async fn payout_state(stack: &Stack, id: Uuid) -> Payout {
    stack
        .payout(id)
        .await
        .unwrap_or_else(|e| panic!("read payout {id}: {e:#}"))
}

/// The fenced-out and duplicate counters of both resources, for before/after deltas.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Counters {
    rail_duplicate_attempted: f64,
    rail_fenced: f64,
    rail_duplicate_attempt_refusals: f64,
    account_fenced: f64,
    ledger_fenced: f64,
    payout_fenced: f64,
}

impl Counters {
    async fn read(stack: &Stack) -> Self {
        let rail = stack.rail_proxy.url();
        let pay = stack.payment.url();
        let get = |url: String, name: &'static str, labels: &'static [(&'static str, &'static str)]| async move {
            stack
                .metric(&url, name, labels)
                .await
                .unwrap_or_else(|e| panic!("scrape {name} at {url}: {e:#}"))
        };
        Self {
            rail_duplicate_attempted: get(rail.clone(), "rail_duplicate_attempted_total", &[]).await,
            rail_fenced: get(rail.clone(), "lock_fenced_out_total", &[("resource", "rail")]).await,
            rail_duplicate_attempt_refusals: get(
                rail,
                "rail_proxy_submissions_total",
                &[("outcome", "duplicate_attempt")],
            )
            .await,
            account_fenced: get(pay.clone(), "lock_fenced_out_total", &[("resource", "account")]).await,
            ledger_fenced: get(pay.clone(), "lock_fenced_out_total", &[("resource", "ledger")]).await,
            payout_fenced: get(pay, "lock_fenced_out_total", &[("resource", "payout")]).await,
        }
    }

    fn minus(self, before: Self) -> Self {
        Self {
            rail_duplicate_attempted: self.rail_duplicate_attempted - before.rail_duplicate_attempted,
            rail_fenced: self.rail_fenced - before.rail_fenced,
            rail_duplicate_attempt_refusals: self.rail_duplicate_attempt_refusals
                - before.rail_duplicate_attempt_refusals,
            account_fenced: self.account_fenced - before.account_fenced,
            ledger_fenced: self.ledger_fenced - before.ledger_fenced,
            payout_fenced: self.payout_fenced - before.payout_fenced,
        }
    }
}

/// What one pause-and-return run left behind.
struct Run {
    env: Env,
    e1: Service,
    e2: Service,
    key: String,
    opening: i64,
    /// The paused holder's payout, and (scenario 2) the payout the takeover posted meanwhile.
    paused_payout: Payout,
    other_payout: Option<Payout>,
    /// E1's grant (read from lock-server while it was stopped) and E2's first grant on the key.
    e1_token: i64,
    takeover_token: i64,
    e1_exit: ExitStatus,
    e2_exit: ExitStatus,
    /// The account right after the takeover finished and before the paused holder resumed.
    account_before_resume: stack::Account,
    delta: Counters,
    received: stack::RailReceived,
    account: stack::Account,
    reconciliation: Value,
}

// ---------------------------------------------------------------------------------------------
// Scenario 1: paused before the rail submit.

/// E1, stopped at `step` of payout P with its lease lapsed (`e1_token`: the grant it stopped with).
struct Stopped {
    env: Env,
    e1: Service,
    key: String,
    opening: i64,
    payout: Payout,
    e1_token: i64,
    before: Counters,
}

/// Creates an account and payout P, starts E1 with `--pause-at step`, and waits until E1 has
/// stopped itself and its lease has lapsed on the lock-server.
async fn stop_first_holder(env: Env, step: &str) -> Stopped {
    let stack = &env.stack;
    let opening = 100_000;
    let account = stack.create_account(CURRENCY, opening).await.unwrap();
    let payout = stack.create_payout(account, 2_500, CURRENCY).await.unwrap();
    let key = format!("account:{account}");
    let before = Counters::read(stack).await;
    let e1 = stack
        .start_executor(stack.executor_spec("e1").unwrap().args([
            "--enable-fault-injection",
            "--pause-at",
            step,
            "--lease-ttl-ms",
            SHORT_LEASE_MS,
            "--session-ttl-ms",
            LONG_SESSION_MS,
        ]))
        .await
        .unwrap();
    wait_stopped(&e1).await;
    let e1_token = paused_token(&e1);
    wait_lapsed(stack, &key, e1_token).await;
    let held = payout_state(stack, payout.payout_id).await;
    assert_eq!(held.claim_token, Some(e1_token), "{held:?}");
    Stopped {
        env,
        e1,
        key,
        opening,
        payout,
        e1_token,
        before,
    }
}

impl Stopped {
    /// Runs E2 in batch mode on `e2_payout` to the end, then resumes E1 and waits for it; collects
    /// what both left behind. `other` is a second payout of the account, if the scenario made one.
    async fn takeover_then_resume(self, e2_payout: Uuid, other: Option<Payout>) -> Run {
        let Stopped {
            env,
            mut e1,
            key,
            opening,
            payout,
            e1_token,
            before,
        } = self;
        let stack = &env.stack;
        let mut e2 = stack
            .start_executor(
                stack
                    .executor_spec("e2")
                    .unwrap()
                    .args(["--payout-id".to_owned(), e2_payout.to_string()]),
            )
            .await
            .unwrap();
        let e2_exit = wait_exit(&mut e2).await;
        let account_before_resume = stack.account(payout.account_id).await.unwrap();

        e1.resume().unwrap();
        let e1_exit = wait_exit(&mut e1).await;

        let takeover_token = *acquired_tokens(&e2, &key)
            .first()
            .unwrap_or_else(|| panic!("e2 never acquired {key}; log {}", e2.log.display()));
        let delta = Counters::read(stack).await.minus(before);
        let received = stack.rail_received().await.unwrap();
        let account = stack.account(payout.account_id).await.unwrap();
        let reconciliation = stack.reconciliation().await.unwrap();
        Run {
            e1,
            e2,
            key,
            opening,
            paused_payout: payout,
            other_payout: other,
            e1_token,
            takeover_token,
            e1_exit,
            e2_exit,
            account_before_resume,
            delta,
            received,
            account,
            reconciliation,
            env,
        }
    }
}

/// E1 takes P, moves it to RAIL_SUBMITTED and stops itself right before the rail submit; its lease
/// lapses; E2 adopts P and completes it; E1 resumes and submits with its stale token.
async fn paused_before_rail_submit(env: Env) -> Run {
    let stopped = stop_first_holder(env, "before_rail_submit").await;
    let stack = &stopped.env.stack;
    let p = stopped.payout.payout_id;
    let held = payout_state(stack, p).await;
    assert_eq!(held.state, PayoutState::RailSubmitted, "{held:?}");
    assert_eq!(stack.rail_received().await.unwrap().received(p), 0);
    stopped.takeover_then_resume(p, None).await
}

/// What must hold in every run, fenced or not: the executors ended cleanly, the rail was paid once
/// per payout, and every payout was debited exactly once.
async fn assert_paid_once(run: &Run) {
    let stack = &run.env.stack;
    assert!(
        run.e1_exit.success(),
        "e1 exited {}; log {}",
        run.e1_exit,
        run.e1.log.display()
    );
    assert!(
        run.e2_exit.success(),
        "e2 exited {}; log {}",
        run.e2_exit,
        run.e2.log.display()
    );
    let mut debited = 0;
    for p in std::iter::once(&run.paused_payout).chain(run.other_payout.as_ref()) {
        assert_eq!(
            run.received.received(p.payout_id),
            1,
            "rail requests for {}",
            p.payout_id
        );
        assert_eq!(
            run.received.paid(p.payout_id),
            1,
            "rail payments for {}",
            p.payout_id
        );
        let now = payout_state(stack, p.payout_id).await;
        assert_eq!(now.state, PayoutState::Posted, "{now:?}");
        debited += p.amount_minor;
    }
    assert!(
        run.received.paid_twice.is_empty(),
        "{:?}",
        run.received.paid_twice
    );
    assert_eq!(
        run.account.balance_minor,
        run.opening - debited,
        "{:?}",
        run.account
    );
}

async fn paused_holder_is_fenced_at_rail_proxy(backend: LockBackend) {
    let run = paused_before_rail_submit(env("rail-fenced", backend, |_| {}).await).await;
    assert_paid_once(&run).await;
    assert!(
        run.takeover_token > run.e1_token,
        "takeover token {} must be strictly higher than the paused holder's {}",
        run.takeover_token,
        run.e1_token
    );
    // E2 finished P before E1 came back.
    let p = payout_state(&run.env.stack, run.paused_payout.payout_id).await;
    assert_eq!(p.claimed_by.as_deref(), Some("e2-w1"));
    assert_eq!(
        run.account_before_resume.balance_minor,
        run.opening - p.amount_minor
    );

    // E1's stale submit was refused by rail-proxy's high-water mark (d), not forwarded.
    assert_eq!(run.delta.rail_duplicate_attempted, 1.0, "{:?}", run.delta);
    assert_eq!(run.delta.rail_fenced, 1.0, "{:?}", run.delta);
    assert_eq!(run.delta.rail_duplicate_attempt_refusals, 0.0, "{:?}", run.delta);
    assert_eq!(
        (
            run.delta.account_fenced,
            run.delta.ledger_fenced,
            run.delta.payout_fenced
        ),
        (0.0, 0.0, 0.0)
    );
    let fenced = fenced_events(&run.e1);
    assert_eq!(fenced.len(), 1, "{fenced:?}");
    assert_eq!(fenced[0]["resource"], "rail");
    assert_eq!(fenced[0]["presented"], run.e1_token);
    assert_eq!(fenced[0]["stored"], run.takeover_token);
    assert!(fenced_events(&run.e2).is_empty());
    let submissions = run.env.stack.rail_submissions(p.payout_id).await.unwrap();
    let outcomes: Vec<(i64, String)> = submissions["submissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["presentedToken"].as_i64().unwrap(),
                s["outcome"].as_str().unwrap_or("NULL").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (run.takeover_token, "ACKED".to_owned()),
            (run.e1_token, "FENCED".to_owned())
        ]
    );
    assert_eq!(run.reconciliation["clean"], true, "{}", run.reconciliation);
    assert_eq!(run.account.fence, run.takeover_token);
}

// ---------------------------------------------------------------------------------------------
// Scenario 2: paused before the post.

/// What the takeover E2 works on while E1 is stopped before its post of P1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takeover {
    /// A second payout P2 of the same account: the newer grant writes the account, P1 stays
    /// RAIL_ACKED, and E1's stale post meets the account fence (a).
    OtherPayout,
    /// P1 itself: E2 adopts and posts it, and E1's stale post meets an already-POSTED payout.
    SamePayout,
}

/// E1 takes P1, submits it (ACKED), moves it to RAIL_ACKED and stops itself right before the post;
/// its lease lapses; E2 takes the account over (see [`Takeover`]); E1 resumes and posts P1 with its
/// stale token.
///
/// Why the account fence needs [`Takeover::OtherPayout`]: payment-resource answers a post of an
/// already-POSTED payout with an idempotent 200 whatever the token (its T-021 case 6 test), so a
/// stale holder returning to a payout the takeover already posted is never compared with the
/// account fence. The fence decides when the newer grant has written the account and the stale
/// holder's payout is still RAIL_ACKED — the hazard of T-021 case 8.
async fn paused_before_post(env: Env, takeover: Takeover) -> Run {
    let stopped = stop_first_holder(env, "before_post").await;
    let stack = &stopped.env.stack;
    let p1 = stopped.payout.clone();
    let held = payout_state(stack, p1.payout_id).await;
    assert_eq!(held.state, PayoutState::RailAcked, "{held:?}");
    assert_eq!(stack.rail_received().await.unwrap().paid(p1.payout_id), 1);
    let p2 = match takeover {
        Takeover::OtherPayout => Some(stack.create_payout(p1.account_id, 4_000, CURRENCY).await.unwrap()),
        Takeover::SamePayout => None,
    };
    let e2_payout = p2.as_ref().map_or(p1.payout_id, |p| p.payout_id);
    stopped.takeover_then_resume(e2_payout, p2).await
}

async fn paused_holder_is_fenced_at_payment_resource(backend: LockBackend) {
    let run = paused_before_post(env("post-fenced", backend, |_| {}).await, Takeover::OtherPayout).await;
    assert_paid_once(&run).await;
    assert!(
        run.takeover_token > run.e1_token,
        "{} vs {}",
        run.takeover_token,
        run.e1_token
    );
    let p2 = run.other_payout.as_ref().unwrap();
    // Before E1 returned: only P2 was debited, by the takeover's grant.
    assert_eq!(
        run.account_before_resume.balance_minor,
        run.opening - p2.amount_minor
    );
    assert_eq!(run.account_before_resume.fence, run.takeover_token);

    // E1's stale post was refused at (a): the account's fence had moved past its token.
    assert_eq!(run.delta.account_fenced, 1.0, "{:?}", run.delta);
    assert_eq!(
        (run.delta.ledger_fenced, run.delta.payout_fenced),
        (0.0, 0.0),
        "{:?}",
        run.delta
    );
    assert_eq!(
        (run.delta.rail_fenced, run.delta.rail_duplicate_attempted),
        (0.0, 0.0)
    );
    let fenced = fenced_events(&run.e1);
    assert_eq!(fenced.len(), 1, "{fenced:?}");
    assert_eq!(fenced[0]["resource"], "account");
    assert_eq!(fenced[0]["presented"], run.e1_token);
    assert_eq!(fenced[0]["stored"], run.takeover_token);

    // A later, independent pass of E1 took P1 up again with a new, higher grant and posted it once.
    let e1_grants = acquired_tokens(&run.e1, &run.key);
    assert_eq!(e1_grants.len(), 2, "{e1_grants:?}");
    assert_eq!(e1_grants[0], run.e1_token);
    assert!(e1_grants[1] > run.takeover_token, "{e1_grants:?}");
    let p1 = payout_state(&run.env.stack, run.paused_payout.payout_id).await;
    assert_eq!(p1.claim_token, Some(e1_grants[1]));
    assert_eq!(run.account.fence, e1_grants[1]);
    assert_eq!(run.reconciliation["clean"], true, "{}", run.reconciliation);
}

/// The takeover adopted and posted P1 itself; the stale post that follows changes nothing. It is not
/// refused with 409 either: payment-resource answers a post of an already-POSTED payout with an
/// idempotent 200 (checked before (a), whatever the token), so no fence counter moves.
async fn paused_holder_returning_to_a_payout_the_takeover_posted_changes_nothing(backend: LockBackend) {
    let run = paused_before_post(env("post-same", backend, |_| {}).await, Takeover::SamePayout).await;
    assert_paid_once(&run).await;
    assert!(
        run.takeover_token > run.e1_token,
        "{} vs {}",
        run.takeover_token,
        run.e1_token
    );
    let p1 = payout_state(&run.env.stack, run.paused_payout.payout_id).await;
    assert_eq!(p1.claimed_by.as_deref(), Some("e2-w1"));
    assert_eq!(p1.claim_token, Some(run.takeover_token));
    let adopted = log_events(&run.e2.log, "payout_adopted");
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert_eq!(adopted[0]["state"], "RAIL_ACKED");
    // Nothing changed when E1 came back.
    assert_eq!(run.account, run.account_before_resume);
    let idempotent = log_events(&run.e1.log, "payout_already_posted");
    assert_eq!(idempotent.len(), 1, "{idempotent:?}");
    assert_eq!(idempotent[0]["fencing_token"], run.e1_token);
    assert!(log_events(&run.e1.log, "payout_posted").is_empty());
    assert_eq!(run.delta, Counters::default());
    assert_eq!(run.account.fence, run.takeover_token);
    assert_eq!(run.reconciliation["clean"], true, "{}", run.reconciliation);
}

// ---------------------------------------------------------------------------------------------
// 3. Batch: two executors, two workers each, no faults.

async fn batch_of_two_executors_posts_every_payout_exactly_once(backend: LockBackend) {
    let env = env("batch", backend, |_| {}).await;
    let stack = &env.stack;
    let opening = 1_000_000;
    let mut accounts = Vec::new();
    let mut payouts = Vec::new();
    for a in 0..4 {
        let account = stack.create_account(CURRENCY, opening).await.unwrap();
        for n in 0..5 {
            payouts.push(
                stack
                    .create_payout(account, 100 * (a + 1) + n, CURRENCY)
                    .await
                    .unwrap(),
            );
        }
        accounts.push(account);
    }
    let before = Counters::read(stack).await;
    let mut e1 = stack
        .start_executor(stack.executor_spec("e1").unwrap().args(["--workers", "2"]))
        .await
        .unwrap();
    let mut e2 = stack
        .start_executor(stack.executor_spec("e2").unwrap().args(["--workers", "2"]))
        .await
        .unwrap();
    let (s1, s2) = (wait_exit(&mut e1).await, wait_exit(&mut e2).await);
    assert!(
        s1.success() && s2.success(),
        "{s1} {s2}; logs in {}",
        stack.log_dir.display()
    );

    let received = stack.rail_received().await.unwrap();
    assert_eq!(received.requests.len(), payouts.len());
    assert!(received.paid_twice.is_empty());
    for p in &payouts {
        assert_eq!(
            (received.received(p.payout_id), received.paid(p.payout_id)),
            (1, 1)
        );
        assert_eq!(payout_state(stack, p.payout_id).await.state, PayoutState::Posted);
    }
    for account in &accounts {
        let debited: i64 = payouts
            .iter()
            .filter(|p| p.account_id == *account)
            .map(|p| p.amount_minor)
            .sum();
        let now = stack.account(*account).await.unwrap();
        assert_eq!(now.balance_minor, opening - debited);
        assert!(now.consistent, "{now:?}");
        // A worker visits an account and re-enters its key between two payouts: each payout was
        // still claimed with a grant of its own.
        let mut claims = Vec::new();
        for p in payouts.iter().filter(|p| p.account_id == *account) {
            claims.push(payout_state(stack, p.payout_id).await.claim_token);
        }
        let mut distinct: Vec<i64> = claims.iter().flatten().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 5, "claim tokens {claims:?}");
    }
    // Each payout was posted by exactly one executor, once.
    let mut posted: Vec<String> = [&e1, &e2]
        .iter()
        .flat_map(|e| log_events(&e.log, "payout_posted"))
        .filter_map(|e| e["payout_id"].as_str().map(str::to_owned))
        .collect();
    posted.sort();
    let mut expected: Vec<String> = payouts.iter().map(|p| p.payout_id.to_string()).collect();
    expected.sort();
    assert_eq!(posted, expected);
    // Nothing was stale: every must-be-zero counter stayed at zero.
    assert_eq!(Counters::read(stack).await.minus(before), Counters::default());
    assert!(fenced_events(&e1).is_empty() && fenced_events(&e2).is_empty());
    assert_eq!(stack.reconciliation().await.unwrap()["clean"], true);
}

// ---------------------------------------------------------------------------------------------
// 4. A killed executor: the other finishes its payout after the lease lapses, paying once.

async fn killed_executor_payout_is_finished_by_the_other_without_paying_twice(backend: LockBackend) {
    let env = env("killed", backend, |_| {}).await;
    let stack = &env.stack;
    let opening = 500_000;
    let mut payouts = Vec::new();
    for a in 0..3 {
        let account = stack.create_account(CURRENCY, opening).await.unwrap();
        for n in 0..3 {
            payouts.push(
                stack
                    .create_payout(account, 1_000 + 10 * a + n, CURRENCY)
                    .await
                    .unwrap(),
            );
        }
    }
    let before = Counters::read(stack).await;
    let mut e1 = stack
        .start_executor(stack.executor_spec("e1").unwrap().args([
            "--enable-fault-injection",
            "--pause-at",
            "before_post",
            "--lease-ttl-ms",
            SHORT_LEASE_MS,
        ]))
        .await
        .unwrap();
    wait_stopped(&e1).await;
    let pause = log_events(&e1.log, "fault_pause");
    let held: Uuid = pause[0]["payout_id"].as_str().unwrap().parse().unwrap();
    let held_before = payout_state(stack, held).await;
    assert_eq!(held_before.state, PayoutState::RailAcked);
    let e1_token = held_before.claim_token.unwrap();

    // E2 works the batch by listing PENDING and in-flight payouts (that is how it finds the dead
    // holder's RAIL_ACKED one); E1 dies mid-batch, holding a lock.
    let mut e2 = stack
        .start_executor(stack.executor_spec("e2").unwrap().args(["--workers", "2"]))
        .await
        .unwrap();
    stack::kill_hard(e1.pid()).unwrap();
    let e1_exit = wait_exit(&mut e1).await;
    assert!(!e1_exit.success(), "{e1_exit}");
    let e2_exit = wait_exit(&mut e2).await;
    assert!(e2_exit.success(), "{e2_exit}; log {}", e2.log.display());

    let received = stack.rail_received().await.unwrap();
    assert!(received.paid_twice.is_empty());
    assert_eq!(received.requests.len(), payouts.len());
    for p in &payouts {
        assert_eq!(
            (received.received(p.payout_id), received.paid(p.payout_id)),
            (1, 1)
        );
        assert_eq!(payout_state(stack, p.payout_id).await.state, PayoutState::Posted);
    }
    let held_after = payout_state(stack, held).await;
    assert_eq!(
        held_after.claimed_by.as_deref().map(|o| o.starts_with("e2-")),
        Some(true)
    );
    assert!(held_after.claim_token.unwrap() > e1_token);
    let adopted: Vec<Value> = log_events(&e2.log, "payout_adopted")
        .into_iter()
        .filter(|e| e["payout_id"] == held.to_string())
        .collect();
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert_eq!(adopted[0]["state"], "RAIL_ACKED");
    let mut accounts: Vec<Uuid> = payouts.iter().map(|p| p.account_id).collect();
    accounts.dedup();
    for account in accounts {
        let debited: i64 = payouts
            .iter()
            .filter(|p| p.account_id == account)
            .map(|p| p.amount_minor)
            .sum();
        assert_eq!(
            stack.account(account).await.unwrap().balance_minor,
            opening - debited
        );
    }
    assert_eq!(Counters::read(stack).await.minus(before), Counters::default());
    assert_eq!(stack.reconciliation().await.unwrap()["clean"], true);
}

// ---------------------------------------------------------------------------------------------
// 5(i). Negative controls: the kill switches off.

/// Scenario 1 with `rail.proxy.fencing.enabled=false`: (d) is skipped, so the stale submit is NOT
/// fenced at the rail — the rail counters stay at 0, which is exactly the assertion of scenario 1
/// that fails. What still stops the stale holder: C1's `rail_submission_attempt_uidx` (one
/// forwardable attempt per payout) makes rail-proxy answer 409 DUPLICATE_ATTEMPT without forwarding,
/// and E1's next step is no longer a paused write: it checks its lease, finds it lost, and abandons
/// the section (`lock_lost`). No resource fence acts at all. The rail is still paid once — for this
/// payout; the index cannot stop a stale holder from submitting a payout nobody has submitted yet.
async fn negative_control_rail_fencing_off_stale_submit_is_not_fenced_at_the_rail(backend: LockBackend) {
    let run =
        paused_before_rail_submit(env("rail-unfenced", backend, |o| o.rail_fencing = false).await).await;
    assert_paid_once(&run).await;
    // The fence of scenario 1 did not act; nothing was fenced anywhere.
    assert_eq!(run.delta.rail_fenced, 0.0, "{:?}", run.delta);
    assert_eq!(run.delta.rail_duplicate_attempted, 0.0, "{:?}", run.delta);
    assert_eq!(
        (
            run.delta.account_fenced,
            run.delta.ledger_fenced,
            run.delta.payout_fenced
        ),
        (0.0, 0.0, 0.0),
        "{:?}",
        run.delta
    );
    assert!(fenced_events(&run.e1).is_empty());
    // The uniqueness backstop did: refused, not forwarded (the rail saw one request), no audit row.
    assert_eq!(run.delta.rail_duplicate_attempt_refusals, 1.0, "{:?}", run.delta);
    let submissions = run
        .env
        .stack
        .rail_submissions(run.paused_payout.payout_id)
        .await
        .unwrap();
    let rows = submissions["submissions"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{submissions}");
    assert_eq!(rows[0]["presentedToken"], run.takeover_token);
    assert_eq!(log_events(&run.e1.log, "rail_attempt_exists").len(), 1);
    // Then E1's own lease check ended the section.
    let lost = log_events(&run.e1.log, "lock_lost");
    assert!(
        lost.iter()
            .any(|e| e["payout_id"] == run.paused_payout.payout_id.to_string()),
        "{lost:?}"
    );
    assert_eq!(run.reconciliation["clean"], true, "{}", run.reconciliation);
}

/// Scenario 2 with `payment.fencing.enabled=false`: (a)(b)(c) run without their fence predicates, so
/// the stale post is NOT fenced — the account counter stays at 0, the assertion of scenario 2 that
/// fails. The stale write lands: P1 is posted by the paused holder's old grant after the newer grant
/// had written the account, and the account's fence is dragged back to the stale token. No backstop
/// stops it (P1 was still RAIL_ACKED, so neither the state check nor ledger_leg_uq applies); the
/// balance is not debited twice only because P1 had not been posted by anyone else. Reconciliation
/// catches it as FENCE_REGRESSED, attributed to the stale grant.
async fn negative_control_payment_fencing_off_stale_post_lands_and_regresses_the_fence(backend: LockBackend) {
    let run = paused_before_post(
        env("post-unfenced", backend, |o| o.payment_fencing = false).await,
        Takeover::OtherPayout,
    )
    .await;
    assert_paid_once(&run).await;
    assert_eq!(run.delta, Counters::default(), "nothing was fenced anywhere");
    assert!(fenced_events(&run.e1).is_empty());
    // The stale grant's post was accepted as a fresh posting.
    let posted: Vec<Value> = log_events(&run.e1.log, "payout_posted");
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(posted[0]["fencing_token"], run.e1_token);
    assert_eq!(acquired_tokens(&run.e1, &run.key), vec![run.e1_token]);
    let p1 = payout_state(&run.env.stack, run.paused_payout.payout_id).await;
    assert_eq!(p1.claim_token, Some(run.e1_token));
    // The fence went backwards: a write by an older grant after a newer one.
    assert_eq!(run.account_before_resume.fence, run.takeover_token);
    assert_eq!(run.account.fence, run.e1_token);
    assert!(run.account.fence < run.takeover_token);
    let recon = &run.reconciliation;
    assert_eq!(recon["clean"], false, "{recon}");
    let account = recon["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["accountId"] == run.paused_payout.account_id.to_string())
        .unwrap_or_else(|| panic!("account not reported: {recon}"));
    let regressed = account["breaks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["kind"] == "FENCE_REGRESSED")
        .unwrap_or_else(|| panic!("no FENCE_REGRESSED: {account}"));
    assert_eq!(regressed["staleFence"], run.e1_token);
}

// ---------------------------------------------------------------------------------------------
// 5(ii). Negative control: the broken acquire (no nextval in DO UPDATE; on etcd the per-key version
// as the token), lock-server in-process.

/// C1 §1.3 acquire without `fencing_token = nextval('fencing_token_seq')` in the DO UPDATE branch:
/// a takeover keeps the dead holder's token (Warning 1). Test code only.
const BROKEN_ACQUIRE: &str = "\
INSERT INTO lock_entry (lock_key, owner_id, session_id, fencing_token, acquired_at, expires_at)
VALUES ($1, $2, $3, nextval('fencing_token_seq'),
        now(), now() + make_interval(secs => $4))
ON CONFLICT (lock_key) DO UPDATE
   SET owner_id      = EXCLUDED.owner_id,
       session_id    = EXCLUDED.session_id,
       acquired_at   = now(),
       expires_at    = now() + make_interval(secs => $4)
 WHERE lock_entry.expires_at <= now()
    OR (lock_entry.owner_id = EXCLUDED.owner_id AND lock_entry.session_id = EXCLUDED.session_id)
RETURNING fencing_token, owner_id, session_id, acquired_at, expires_at";

/// Which acquire the in-process lock-server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acquire {
    /// The contract's: C1 §1.3 on PostgreSQL, the grant key's `mod_revision` on etcd.
    Correct,
    /// The broken one that hands a takeover the lapsed holder's token. PostgreSQL:
    /// [`BROKEN_ACQUIRE`]. etcd: the token is the key's per-key `version` (C1 §1.7's per-row
    /// counter, [`lock_server::EtcdFaults::token_from_version`]); the lapsed lease deleted the key,
    /// so the takeover recreates it at version 1 — the paused holder's token again.
    Broken,
}

/// The stack against a lock-server running in this process on `backend` with `acquire`.
async fn in_process_env(
    name: &str,
    backend: LockBackend,
    acquire: Acquire,
) -> (Env, lock_server::RunningServer) {
    let broken = acquire == Acquire::Broken;
    let mut opts = StackOptions::new(log_dir(&format!("{name}-{backend}")));
    // The in-process lock-server signs with the key the stack's resources trust.
    let signing = Some(opts.grant_key.clone());
    let (server, lockdb, etcd) = match backend {
        LockBackend::Postgres => {
            let lockdb = dlock_testkit::lockdb().await;
            let statements = lock_server::Statements {
                acquire: if broken {
                    BROKEN_ACQUIRE
                } else {
                    lock_server::sql::ACQUIRE
                },
                ..lock_server::Statements::C1
            };
            let server = lock_server::spawn_with_statements(
                lock_server::Config::new(lockdb.app_url()).with_signing_key(signing),
                statements,
            )
            .await
            .unwrap();
            (server, Some(lockdb), None)
        }
        LockBackend::Etcd => {
            // On the test's thread (see Stack::start: PR_SET_PDEATHSIG is per thread).
            let etcd = EtcdCluster::single().unwrap_or_else(|e| panic!("start etcd: {e}"));
            let prefix = lock_server::config::DEFAULT_ETCD_PREFIX;
            let repo = lock_server::EtcdRepo::connect(&etcd.endpoints(), prefix)
                .await
                .unwrap();
            let faults = lock_server::EtcdFaults {
                token_from_version: broken,
                ..lock_server::EtcdFaults::NONE
            };
            let repo = lock_server::EtcdRepo::with_client(repo.client(), prefix, faults);
            let server = lock_server::spawn_with_backend(
                lock_server::Config::etcd(etcd.endpoints(), prefix).with_signing_key(signing),
                lock_server::Backend::Etcd(repo),
            )
            .await
            .unwrap();
            (server, None, Some(etcd))
        }
    };
    let paydb = dlock_testkit::paydb().await;
    opts.lock_backend = backend;
    opts.lock_server_url = Some(server.base_url());
    let lockdb_url = lockdb.as_ref().map(TestDb::app_url).unwrap_or_default();
    let stack = Stack::start(&lockdb_url, &paydb.app_url(), &opts)
        .await
        .unwrap_or_else(|e| panic!("start the stack: {e:#}"));
    let env = Env {
        stack,
        _lockdb: lockdb,
        _paydb: paydb,
        _etcd: etcd,
    };
    (env, server)
}

/// Scenario 1 against a lock-server running in this process on `backend` with `acquire`.
async fn scenario_one_in_process(name: &str, backend: LockBackend, acquire: Acquire) -> Run {
    let (env, server) = in_process_env(name, backend, acquire).await;
    let run = paused_before_rail_submit(env).await;
    server.shutdown().await.unwrap();
    run
}

/// What the takeover got from a broken acquire: its grants on the key, its fenced-out events, and
/// the payout fence counter's delta, next to the paused holder's token.
struct Refused {
    e1_token: i64,
    takeover_grants: Vec<i64>,
    e2_fenced: Vec<Value>,
    payout_fenced: f64,
}

impl Refused {
    fn of(run: &Run) -> Self {
        Self {
            e1_token: run.e1_token,
            takeover_grants: acquired_tokens(&run.e2, &run.key),
            e2_fenced: fenced_events(&run.e2),
            payout_fenced: run.delta.payout_fenced,
        }
    }
}

/// Scenario 1 up to the takeover's refusals, on etcd with the broken token. Every acquire recreates
/// the lapsed key, so every grant is version 1 again — the paused holder's token — and the takeover
/// is refused at the payout claim on every pass: it never finishes, and neither would the resumed
/// holder. So the takeover is stopped (SIGTERM) once it has been refused, and the paused holder is
/// left stopped.
async fn etcd_broken_takeover(name: &str) -> Refused {
    let (env, server) = in_process_env(name, LockBackend::Etcd, Acquire::Broken).await;
    let stopped = stop_first_holder(env, "before_rail_submit").await;
    let stack = &stopped.env.stack;
    let p = stopped.payout.payout_id;
    let mut e2 = stack
        .start_executor(
            stack
                .executor_spec("e2")
                .unwrap()
                .args(["--payout-id".to_owned(), p.to_string()]),
        )
        .await
        .unwrap();
    eventually("the takeover to be fenced out", LIMIT, || async {
        (!fenced_events(&e2).is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log {}", e2.log.display()));
    sigterm(&e2);
    let status = wait_exit(&mut e2).await;
    assert!(status.success(), "{status}; log {}", e2.log.display());
    let refused = Refused {
        e1_token: stopped.e1_token,
        takeover_grants: acquired_tokens(&e2, &stopped.key),
        e2_fenced: fenced_events(&e2),
        payout_fenced: Counters::read(stack).await.minus(stopped.before).payout_fenced,
    };
    // Nothing reached the rail: the paused holder never resumed, the takeover never got past the claim.
    assert_eq!(stack.rail_received().await.unwrap().received(p), 0);
    server.shutdown().await.unwrap();
    refused
}

async fn negative_control_broken_acquire_hands_the_takeover_the_paused_holders_token(backend: LockBackend) {
    // Control: the same harness with the contract's acquire keeps scenario 1's property.
    let good = scenario_one_in_process("acquire-c1", backend, Acquire::Correct).await;
    assert_paid_once(&good).await;
    assert!(good.takeover_token > good.e1_token);
    assert_eq!(good.delta.rail_fenced, 1.0);
    assert_eq!(good.delta.payout_fenced, 0.0);

    let broken = match backend {
        LockBackend::Postgres => {
            Refused::of(&scenario_one_in_process("acquire-broken", backend, Acquire::Broken).await)
        }
        LockBackend::Etcd => etcd_broken_takeover("acquire-broken").await,
    };
    // The violation: the takeover was granted the dead holder's token, not a strictly higher one.
    let takeover_token = *broken
        .takeover_grants
        .first()
        .expect("the takeover acquired the key");
    assert_eq!(
        takeover_token, broken.e1_token,
        "the broken acquire must reissue the paused holder's token"
    );
    // Downstream, the strict comparisons saw an equal token and refused the *new* holder: its adopt
    // of P was fenced at payment-resource's payout claim (claim_token < :token is false for equal
    // tokens). Scenario 1 asserts the takeover is never fenced; here it is.
    let e2_fenced = &broken.e2_fenced;
    match backend {
        // Once: its next pass re-inserts the released row, and the INSERT branch still draws
        // nextval, so it is granted a higher token and adopts P.
        LockBackend::Postgres => assert_eq!(e2_fenced.len(), 1, "{e2_fenced:?}"),
        // On every pass (it was stopped after the first ones): each re-created key is version 1
        // again, so every grant is the paused holder's token and every adopt is refused alike.
        LockBackend::Etcd => {
            assert!(!e2_fenced.is_empty());
            assert!(
                broken.takeover_grants.iter().all(|t| *t == broken.e1_token),
                "{:?}",
                broken.takeover_grants
            );
            assert!(
                e2_fenced.iter().all(|f| f["resource"] == "payout"
                    && f["presented"] == broken.e1_token
                    && f["stored"] == broken.e1_token),
                "{e2_fenced:?}"
            );
        }
    }
    assert_eq!(e2_fenced[0]["resource"], "payout");
    assert_eq!(e2_fenced[0]["presented"], broken.e1_token);
    assert_eq!(e2_fenced[0]["stored"], broken.e1_token);
    assert_eq!(
        broken.payout_fenced,
        e2_fenced.len() as f64,
        "every refusal was counted by payment-resource"
    );
    assert!(fenced_events(&good.e2).is_empty());
}

// ---------------------------------------------------------------------------------------------
// The executor as a service: metrics, health, graceful SIGTERM; the ambiguous and rejected paths;
// bad configuration.

fn sigterm(svc: &Service) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &svc.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

async fn executor_serves_metrics_and_stops_gracefully_on_sigterm(backend: LockBackend) {
    let env = env("service", backend, |_| {}).await;
    let stack = &env.stack;
    let account = stack.create_account(CURRENCY, 50_000).await.unwrap();
    let mut executor = stack
        .start_executor(
            stack
                .service_executor_spec("svc")
                .unwrap()
                .args(["--poll-interval-ms", "50"]),
        )
        .await
        .unwrap();
    let url = executor.url();
    let http = reqwest::Client::new();
    for path in ["/healthz", "/readyz"] {
        let r = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }

    let p = stack.create_payout(account, 1_234, CURRENCY).await.unwrap();
    eventually("the long-running executor to post the payout", LIMIT, || async {
        let now = stack.payout(p.payout_id).await.ok()?;
        (now.state == PayoutState::Posted).then_some(())
    })
    .await
    .unwrap();
    let m = |name: &'static str, labels: &'static [(&'static str, &'static str)]| {
        let url = url.clone();
        async move { stack.metric(&url, name, labels).await.unwrap() }
    };
    // The executor counts the attempt after its post returned and its lock was released.
    eventually("the executor to count the posted payout", LIMIT, || async {
        (m("payouts_processed_total", &[("outcome", "posted")]).await == 1.0).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(m("payout_duration_seconds_count", &[]).await, 1.0);
    assert!(m("lock_acquire_duration_seconds_count", &[("result", "granted")]).await >= 1.0);
    let text = stack.metrics(&url).await.unwrap();
    for resource in ["account", "ledger", "payout", "rail"] {
        assert_eq!(
            dlock_testkit::metrics::metric_value(
                &text,
                "lock_fenced_out_observed_total",
                &[("resource", resource)]
            ),
            Some(0.0),
            "{resource}: the must-be-zero series is exported, at zero"
        );
    }

    // SIGTERM: the workers stop, close their sessions, and the process exits 0.
    sigterm(&executor);
    let status = wait_exit(&mut executor).await;
    assert!(status.success(), "{status}");
    let stopped = log_events(&executor.log, "worker_stopped");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    assert_eq!(stopped[0]["exit"], "Shutdown");
    assert_eq!(log_events(&executor.log, "session_closed").len(), 1);
    let key = format!("account:{account}");
    let lock = stack.lock_status(&key).await.unwrap();
    assert_eq!(lock.state, LockState::Free, "released after the payout: {lock:?}");
}

async fn ambiguous_timeout_is_resolved_by_asking_the_rail_and_a_rejection_fails_the_payout(
    backend: LockBackend,
) {
    let env = env("ambiguous", backend, |o| {
        o.rail_stub_test_mode = true;
        o.rail_timeout_ms = 300;
    })
    .await;
    let stack = &env.stack;
    let opening = 80_000;
    let account = stack.create_account(CURRENCY, opening).await.unwrap();

    // The rail pays, then answers too late: TIMEOUT → RAIL_AMBIGUOUS → resolve → ACKED → POSTED.
    stack.set_rail_behaviour("timeout").await.unwrap();
    let late = stack.create_payout(account, 3_000, CURRENCY).await.unwrap();
    let mut e1 = stack
        .start_executor(stack.executor_spec("e1").unwrap())
        .await
        .unwrap();
    assert!(wait_exit(&mut e1).await.success(), "log {}", e1.log.display());
    assert_eq!(
        payout_state(stack, late.payout_id).await.state,
        PayoutState::Posted
    );
    let submitted = log_events(&e1.log, "rail_submitted");
    assert_eq!(submitted.len(), 1, "{submitted:?}");
    assert_eq!(submitted[0]["outcome"], "Some(Timeout)");
    let resolved = log_events(&e1.log, "rail_resolved");
    assert_eq!(resolved.len(), 1, "{resolved:?}");
    assert_eq!(resolved[0]["outcome"], "Some(Acked)");
    let transitions: Vec<(String, String)> = log_events(&e1.log, "payout_transitioned")
        .iter()
        .map(|e| {
            (
                e["from"].as_str().unwrap().to_owned(),
                e["to"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let edge = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        transitions,
        vec![
            edge("CLAIMED", "RAIL_SUBMITTED"),
            edge("RAIL_SUBMITTED", "RAIL_AMBIGUOUS"),
            edge("RAIL_AMBIGUOUS", "RAIL_ACKED"),
        ]
    );

    // The rail refuses: FAILED, nothing debited.
    stack.set_rail_behaviour("reject").await.unwrap();
    let refused = stack.create_payout(account, 5_000, CURRENCY).await.unwrap();
    let mut e2 = stack
        .start_executor(stack.executor_spec("e2").unwrap())
        .await
        .unwrap();
    assert!(wait_exit(&mut e2).await.success(), "log {}", e2.log.display());
    assert_eq!(
        payout_state(stack, refused.payout_id).await.state,
        PayoutState::Failed
    );
    assert_eq!(log_events(&e2.log, "payout_failed").len(), 1);

    // Each was sent to the rail once (never resubmitted); only the first was paid.
    let received = stack.rail_received().await.unwrap();
    assert_eq!(
        (received.received(late.payout_id), received.paid(late.payout_id)),
        (1, 1)
    );
    assert_eq!(
        (
            received.received(refused.payout_id),
            received.paid(refused.payout_id)
        ),
        (1, 0)
    );
    assert_eq!(
        stack.account(account).await.unwrap().balance_minor,
        opening - 3_000
    );
    assert_eq!(stack.reconciliation().await.unwrap()["clean"], true);
}

async fn bad_configuration_is_refused_and_nothing_is_written(backend: LockBackend) {
    let env = env("bad-config", backend, |_| {}).await;
    let stack = &env.stack;
    let account = stack.create_account(CURRENCY, 10_000).await.unwrap();
    let p = stack.create_payout(account, 500, CURRENCY).await.unwrap();
    let bad: &[&[&str]] = &[
        // Fault injection is refused unless explicitly enabled.
        &["--pause-at", "before_post"],
        &["--enable-fault-injection", "--pause-at", "sometime"],
        &["--workers", "0"],
        &["--workers", "-1"],
        &["--lease-ttl-ms", "5"],
        &["--lease-ttl-ms", "abc"],
        &["--session-ttl-ms", "0"],
        &["--payout-id", "not-a-uuid"],
        &["--owner-id", " spaced "],
        &["--page-size", "100000"],
    ];
    for (n, args) in bad.iter().enumerate() {
        let spec = stack
            .executor_spec(&format!("bad{n}"))
            .unwrap()
            .args(args.iter().copied());
        let mut svc = stack.start_executor(spec).await.unwrap();
        let status = wait_exit(&mut svc).await;
        assert_eq!(
            status.code(),
            Some(2),
            "{args:?}: {status}; log {}",
            svc.log.display()
        );
    }
    // Nothing was claimed, submitted or posted.
    let now = payout_state(stack, p.payout_id).await;
    assert_eq!(
        (now.state, now.claim_token, now.attempt_count),
        (PayoutState::Pending, None, 0)
    );
    assert!(stack.rail_received().await.unwrap().requests.is_empty());
    assert_eq!(stack.account(account).await.unwrap().balance_minor, 10_000);
    let lock = stack.lock_status(&format!("account:{account}")).await.unwrap();
    assert_eq!(lock.state, LockState::Free);
}

/// Three payouts of 400 against an account holding 1,000, driven by one executor. With the
/// reservation only two are covered: the rail receives exactly those two, the third ends FAILED with
/// its reason before anything was submitted for it, and everything the rail paid is posted.
/// `bypass` is the negative control: the payouts are put in flight as if no funds check existed
/// before the rail (RAIL_SUBMITTED holding their amounts without the account's agreement).
async fn overdraw(name: &str, backend: LockBackend, bypass: bool) -> Result<(), String> {
    let env = env(name, backend, |_| {}).await;
    let stack = &env.stack;
    let account = stack.create_account(CURRENCY, 1_000).await.unwrap();
    let mut payouts = Vec::new();
    for _ in 0..3 {
        payouts.push(stack.create_payout(account, 400, CURRENCY).await.unwrap());
    }
    if bypass {
        let admin = env._paydb.admin_pool().await;
        sqlx::query(
            "UPDATE payout SET state = 'RAIL_SUBMITTED', claimed_by = 'no-funds-check', claim_token = 1,
                               reserved_minor = amount_minor
              WHERE account_id = $1",
        )
        .bind(account)
        .execute(&admin)
        .await
        .unwrap();
    }
    let mut e1 = stack
        .start_executor(stack.executor_spec("e1").unwrap().args(["--workers", "1"]))
        .await
        .unwrap();
    let _ = wait_exit(&mut e1).await;

    let received = stack.rail_received().await.unwrap();
    let mut reached = 0;
    for p in &payouts {
        let now = payout_state(stack, p.payout_id).await;
        let paid = received.paid(p.payout_id);
        ensure_that(
            paid == 0 || now.state == PayoutState::Posted,
            format!("the rail paid {} but it is {}", p.payout_id, now.state),
        )?;
        if received.received(p.payout_id) > 0 {
            reached += 1;
        } else {
            ensure_that(
                now.state == PayoutState::Failed
                    && now.failure_reason.as_deref() == Some("INSUFFICIENT_FUNDS"),
                format!(
                    "uncovered payout {} ended {} ({:?})",
                    p.payout_id, now.state, now.failure_reason
                ),
            )?;
            let subs = stack.rail_submissions(p.payout_id).await.unwrap();
            ensure_that(
                subs["submissions"].as_array().is_some_and(Vec::is_empty),
                format!("an uncovered payout was submitted: {subs}"),
            )?;
        }
    }
    ensure_that(
        reached == 2,
        format!("the rail received {reached} of the 3 payouts, expected the 2 covered"),
    )?;
    let a = stack.account(account).await.unwrap();
    ensure_that(a.balance_minor == 200, format!("balance {}", a.balance_minor))?;
    let recon = stack.reconciliation().await.unwrap();
    ensure_that(recon["clean"] == true, format!("reconciliation: {recon}"))?;
    Ok(())
}

fn ensure_that(cond: bool, msg: String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(msg) }
}

async fn payouts_exceeding_the_balance_reach_the_rail_only_when_covered(backend: LockBackend) {
    overdraw("overdraw", backend, false).await.unwrap();
}

async fn negative_control_without_a_funds_check_before_the_rail_the_rail_pays_what_the_ledger_cannot_debit(
    backend: LockBackend,
) {
    let violation = overdraw("overdraw-bypass", backend, true)
        .await
        .expect_err("without the reservation the rail must receive an uncovered payout");
    assert!(
        violation.contains("the rail paid") || violation.contains("the rail received 3"),
        "{violation}"
    );
}

/// The crash between recording the attempt and forwarding it: rail-proxy exits right after its
/// attempt row commits (fault injection), the rail never hears of the payout. A fresh rail-proxy and
/// executor ask the rail with bounded retries and backoff; once the deadline has passed the attempt
/// is abandoned and the payout ends ABANDONED (reason recorded, hold released), and its owner can
/// create it again.
async fn a_crash_between_recording_the_attempt_and_forwarding_it_ends_abandoned(backend: LockBackend) {
    let mut env = env("crash-after-attempt", backend, |o| {
        o.rail_timeout_ms = 300;
        o.rail_abandon_after_ms = Some(2_000);
        o.rail_proxy_args = vec![
            "--enable-fault-injection".into(),
            "--fault".into(),
            "exit-after-attempt".into(),
        ];
    })
    .await;
    let account = env.stack.create_account(CURRENCY, 10_000).await.unwrap();
    let p = env.stack.create_payout(account, 700, CURRENCY).await.unwrap();
    let mut e1 = env
        .stack
        .start_executor(env.stack.service_executor_spec("e1").unwrap())
        .await
        .unwrap();
    let exit = env
        .stack
        .rail_proxy
        .wait_exit(LIMIT)
        .await
        .expect("rail-proxy exits at the fault");
    assert_eq!(
        exit.code(),
        Some(75),
        "log {}",
        env.stack.rail_proxy.log.display()
    );
    e1.stop();
    let admin = env._paydb.admin_pool().await;
    let (outcome, resolved): (Option<String>, bool) =
        sqlx::query_as("SELECT outcome, resolved_at IS NOT NULL FROM rail_submission WHERE payout_id = $1")
            .bind(p.payout_id)
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(
        (outcome, resolved),
        (None, false),
        "the attempt committed, unanswered"
    );
    assert_eq!(env.stack.rail_received().await.unwrap().received(p.payout_id), 0);

    env.stack.restart_rail_proxy(true, &[]).await.unwrap();
    let stack = &env.stack;
    let mut e2 = stack
        .start_executor(stack.executor_spec("e2").unwrap())
        .await
        .unwrap();
    assert!(wait_exit(&mut e2).await.success(), "log {}", e2.log.display());
    let now = payout_state(stack, p.payout_id).await;
    assert_eq!(
        (now.state, now.failure_reason.as_deref(), now.reserved_minor),
        (PayoutState::Abandoned, Some("RAIL_NEVER_RECEIVED"), 0)
    );
    assert!(
        !log_events(&e2.log, "rail_resolve_retry").is_empty(),
        "asked more than once, with backoff"
    );
    assert_eq!(log_events(&e2.log, "payout_abandoned").len(), 1);
    let subs = stack.rail_submissions(p.payout_id).await.unwrap();
    let attempt = &subs["submissions"][0];
    assert!(attempt["abandonedAt"].is_string(), "{subs}");
    assert_eq!(attempt["outcome"], "TIMEOUT");
    assert_eq!(
        stack
            .metric(
                &stack.rail_proxy.url(),
                "rail_proxy_attempts_abandoned_total",
                &[]
            )
            .await
            .unwrap(),
        1.0
    );
    let a = stack.account(account).await.unwrap();
    assert_eq!(a.balance_minor, 10_000, "nothing was debited");
    assert_eq!(stack.reconciliation().await.unwrap()["clean"], true);

    // Its owner re-creates it (a new idempotency key): paid and posted once.
    let again = stack.create_payout(account, 700, CURRENCY).await.unwrap();
    let mut e3 = stack
        .start_executor(stack.executor_spec("e3").unwrap())
        .await
        .unwrap();
    assert!(wait_exit(&mut e3).await.success(), "log {}", e3.log.display());
    assert_eq!(
        payout_state(stack, again.payout_id).await.state,
        PayoutState::Posted
    );
    let received = stack.rail_received().await.unwrap();
    assert_eq!(
        (received.received(p.payout_id), received.paid(again.payout_id)),
        (0, 1)
    );
    assert_eq!(stack.account(account).await.unwrap().balance_minor, 9_300);
    assert_eq!(stack.reconciliation().await.unwrap()["clean"], true);
}
