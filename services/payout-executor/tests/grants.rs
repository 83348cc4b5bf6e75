//! Signed grants across real processes (lock-server on lockdb or etcd, payment-resource, rail-proxy,
//! rail-stub, a payout-executor), with lock-server's own grants: the attack of the issue and what
//! stops it.
//!
//! The rightful holder of `account:B` (an executor) stops itself right before its rail submission,
//! holding B's payout with its token. An attacker acquires `account:A` — a real grant, with a higher
//! token — and presents it to adopt B's payout; it also tries a bare forged integer. The holder
//! resumes. With verification on (the default) both attempts are refused (403, counted, logged,
//! paydb unchanged) and the holder posts its payout with its own token, never fenced out. The
//! negative control runs the same with verification off: the attacker's claim is taken and the
//! rightful holder is fenced out of its own account — the attack is real, and the check fails.
//!
//! Binaries come from the workspace build (`cargo test --workspace` builds them).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_client::{Fence, FencingToken, LockClient};
use dlock_common::grant::account_key;
use dlock_testkit::TestDb;
use dlock_testkit::procs::Service;
use dlock_testkit::stack::{LockBackend, Stack, StackOptions, log_events, process_state};
use dlock_testkit::wait::eventually;
use payout_executor::model::PayoutState;
use serde_json::Value;
use uuid::Uuid;

const LIMIT: Duration = Duration::from_secs(60);
const CURRENCY: &str = "EUR";
/// The holder's lease outlives the attack while it is stopped: it still holds the lock when the
/// attacker writes, so whatever refuses the attacker, it is not an expired lease.
const HOLDER_LEASE_MS: &str = "30000";

static NEXT: AtomicU32 = AtomicU32::new(0);

fn log_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "payout-grants-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

struct Env {
    stack: Stack,
    _lockdb: Option<TestDb>,
    paydb: TestDb,
}

async fn env(name: &str, backend: LockBackend, verification: bool) -> Env {
    let lockdb = match backend {
        LockBackend::Postgres => Some(dlock_testkit::lockdb().await),
        LockBackend::Etcd => None,
    };
    let paydb = dlock_testkit::paydb().await;
    let mut opts = StackOptions::new(log_dir(&format!("{name}-{backend}")));
    opts.lock_backend = backend;
    opts.grant_verification = verification;
    let lockdb_url = lockdb.as_ref().map(TestDb::app_url).unwrap_or_default();
    let stack = Stack::start(&lockdb_url, &paydb.app_url(), &opts)
        .await
        .unwrap_or_else(|e| panic!("start the stack (logs in {}): {e:#}", opts.log_dir.display()));
    Env {
        stack,
        _lockdb: lockdb,
        paydb,
    }
}

/// A claim of `payout` at payment-resource with exactly `fence`, as an executor would send it.
async fn claim(stack: &Stack, payout: Uuid, fence: &Fence) -> (u16, Value) {
    let request = reqwest::Client::new()
        .post(format!("{}/v1/payouts/{payout}/claim", stack.payment.url()))
        .bearer_auth(&stack.credentials.executor)
        .json(&serde_json::json!({"ownerId": "attacker"}));
    let response = fence.apply(request).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn wait_stopped(svc: &Service) {
    let pid = svc.pid();
    eventually(&format!("{} to stop itself", svc.name), LIMIT, || async move {
        (process_state(pid) == Some('T')).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}; log: {}", svc.log.display()));
}

/// The attack; `Err` lists what went wrong for the rightful holder.
async fn cross_account_attack(name: &str, backend: LockBackend, verification: bool) -> Result<(), String> {
    let env = env(name, backend, verification).await;
    let stack = &env.stack;
    let a = stack.create_account(CURRENCY, 100_000).await.unwrap();
    let b = stack.create_account(CURRENCY, 100_000).await.unwrap();
    let payout = stack.create_payout(b, 2_500, CURRENCY).await.unwrap().payout_id;

    // The rightful holder of account:B stops itself holding the payout, right before the rail.
    let mut holder = stack
        .start_executor(stack.executor_spec("holder").unwrap().args([
            "--enable-fault-injection",
            "--pause-at",
            "before_rail_submit",
            "--lease-ttl-ms",
            HOLDER_LEASE_MS,
        ]))
        .await
        .unwrap();
    wait_stopped(&holder).await;
    let held_with = log_events(&holder.log, "fault_pause")
        .first()
        .and_then(|e| e["fencing_token"].as_i64())
        .expect("the holder's token");
    let held = stack.payout(payout).await.unwrap();
    assert_eq!(
        (held.state, held.claim_token),
        (PayoutState::RailSubmitted, Some(held_with))
    );

    // The attacker: a real grant of lock-server's, on account:A, with a higher token.
    let attacker = LockClient::new(&stack.lock_url)
        .unwrap()
        .open_session("attacker", Duration::from_secs(60))
        .await
        .unwrap();
    let other = attacker
        .acquire(&account_key(a), Duration::from_secs(60), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(other.token().get() > held_with);
    let mut violations = Vec::new();
    let before = env.paydb.digest().await;
    let (status, body) = claim(stack, payout, &other.fence()).await;
    if status != 403 || body["code"] != "GRANT_WRONG_RESOURCE" {
        violations.push(format!(
            "account A's grant was accepted for B's payout: {status} {body}"
        ));
    }
    // And a forged integer, huge, with no grant at all.
    let forged = Fence {
        token: FencingToken::new(i64::MAX / 2).unwrap(),
        grant: None,
    };
    let (status, body) = claim(stack, payout, &forged).await;
    if status != 403 || body["code"] != "GRANT_INVALID" {
        violations.push(format!(
            "a forged integer was accepted for B's payout: {status} {body}"
        ));
    }
    if env.paydb.digest().await != before {
        violations.push("the refused claims changed paydb".to_owned());
    }

    // The holder carries on with its own token, to the end of its batch — or until it is fenced out
    // (then, after a forged integer was taken as B's claim, it would be for ever: it is stopped).
    holder.resume().unwrap();
    let log = holder.log.clone();
    let pid = holder.pid();
    eventually("the holder to finish or be fenced out", LIMIT, || {
        let log = log.clone();
        async move {
            let exited = process_state(pid).is_none_or(|s| s == 'Z');
            (exited || !log_events(&log, "fenced_out").is_empty()).then_some(())
        }
    })
    .await
    .unwrap();
    let fenced = log_events(&holder.log, "fenced_out");
    if fenced.is_empty() {
        let exit = holder.wait_exit(LIMIT).await.expect("the holder exits when idle");
        assert!(
            exit.success(),
            "holder exited {exit}; log {}",
            holder.log.display()
        );
    } else {
        violations.push(format!(
            "the rightful holder of account B was fenced out: {} (presented {}, stored {})",
            fenced[0]["resource"], fenced[0]["presented"], fenced[0]["stored"]
        ));
        holder.stop();
    }
    let done = stack.payout(payout).await.unwrap();
    if done.state != PayoutState::Posted || done.claim_token != Some(held_with) {
        violations.push(format!(
            "B's payout was not posted by its holder's token {held_with}: {:?} claimed with {:?}",
            done.state, done.claim_token
        ));
    }
    let received = stack.rail_received().await.unwrap();
    assert_eq!(received.paid(payout), 1, "paid exactly once either way");
    if verification {
        // Refusals are counted and logged where they happen.
        let pay = stack.payment.url();
        for code in ["GRANT_WRONG_RESOURCE", "GRANT_INVALID"] {
            let n = stack
                .metric(&pay, "grant_refused_total", &[("code", code)])
                .await
                .unwrap();
            assert_eq!(n, 1.0, "grant_refused_total{{code={code}}}");
        }
        let logged = log_events(&stack.payment.log, "grant_refused");
        assert_eq!(logged.len(), 2, "{logged:?}");
    }
    other.release().await.unwrap();
    attacker.close().await.unwrap();
    if violations.is_empty() {
        let _ = std::fs::remove_dir_all(&stack.log_dir);
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

async fn another_accounts_grant_cannot_fence_the_rightful_holder_out(backend: LockBackend) {
    cross_account_attack("attack", backend, true).await.unwrap();
}

async fn negative_control_with_verification_off_another_accounts_grant_fences_the_holder_out(
    backend: LockBackend,
) {
    let violation = cross_account_attack("attack-off", backend, false)
        .await
        .expect_err("with verification off the attack must succeed");
    assert!(
        violation.contains("was accepted") && violation.contains("fenced out"),
        "{violation}"
    );
}

dlock_testkit::on_both_backends!(
    postgres: super::LockBackend::Postgres, etcd: super::LockBackend::Etcd;
    another_accounts_grant_cannot_fence_the_rightful_holder_out,
    negative_control_with_verification_off_another_accounts_grant_fences_the_holder_out,
);
