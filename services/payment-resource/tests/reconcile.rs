//! Reconciliation over real paydb data (HTTP and the `reconcile` subcommand), and the binary itself:
//! JSON logs, the kill-switch WARN, graceful stop on SIGTERM, exit codes.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{EUR_SETTLEMENT, fixture, tok};
use payment_resource::reconcile::{self, AccountBreakKind, PayoutBreakKind};
use payment_resource::sql::Statements;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_payment-resource");

/// Runs `payment-resource reconcile`; returns (exit code, parsed stdout).
async fn reconcile_cli(database_url: &str) -> (i32, Value) {
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["reconcile", "--database-url", database_url])
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("run payment-resource reconcile");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json)
}

#[tokio::test]
async fn reconciliation_is_clean_after_fenced_postings_and_the_cli_exits_zero() {
    let f = fixture().await;
    let posting = f.posting(Statements::FENCED);
    let mut expected_credit = 0;
    for (opening, amount, token) in [(10_000, 2_500, 3), (5_000, 5_000, 4), (800, 1, 5)] {
        let acct = f.customer(opening).await;
        let p = f.acked(acct, amount, token).await;
        posting.post(p.payout_id, tok(token)).await.unwrap();
        expected_credit += amount;
    }
    // A refused stale posting and a funds rejection leave the books clean too.
    let acct = f.customer(1_000).await;
    let stale = f.acked(acct, 100, 6).await;
    let newer = f.acked(acct, 100, 7).await;
    posting.post(newer.payout_id, tok(7)).await.unwrap();
    assert!(posting.post(stale.payout_id, tok(6)).await.is_err());
    let unfunded = f.acked_unreserved(acct, 5_000, 8).await;
    assert!(posting.post(unfunded.payout_id, tok(8)).await.is_err());
    expected_credit += 100;

    let report = reconcile::run(&f.pool).await.unwrap();
    assert!(report.clean, "{report:?}");
    assert_eq!(report.payouts_checked, 6);
    let settlement = f.accounts.get(EUR_SETTLEMENT).await.unwrap();
    assert_eq!(settlement.ledger_credit_minor, expected_credit);
    assert!(settlement.consistent);

    let (code, json) = reconcile_cli(&f.db.app_url()).await;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["clean"], true);
    assert_eq!(json["payoutsChecked"], 6);
}

#[tokio::test]
async fn reconciliation_reports_the_stale_fence_after_a_kill_switch_run() {
    let f = fixture().await;
    let server = payment_resource::spawn(
        payment_resource::Config::ephemeral(f.db.app_url())
            .with_fencing(payment_resource::Fencing::Disabled)
            .with_credentials(common::credentials())
            .with_grants(common::grants()),
    )
    .await
    .unwrap();
    let acct = f.customer(10_000).await;
    let stale = f.acked(acct, 700, 5).await;
    let newer = f.acked(acct, 1_200, 9).await;
    let client = reqwest::Client::new();
    for (p, t) in [(newer.payout_id, 9), (stale.payout_id, 5)] {
        let resp = client
            .post(format!("{}/v1/payouts/{p}/post", server.url()))
            .bearer_auth(common::EXECUTOR_TOKEN)
            .header("X-Fencing-Token", t.to_string())
            .header("X-Fencing-Grant", common::grant(acct, t))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }

    let v: Value = client
        .get(format!("{}/v1/reconciliation", server.url()))
        .bearer_auth(common::ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["clean"], false, "{v}");
    let accounts = v["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 1, "{v}");
    let a = &accounts[0];
    assert_eq!(a["accountId"], acct.to_string());
    assert_eq!(a["storedFence"], 5);
    assert_eq!(a["storedBalanceMinor"], 10_000 - 1_200 - 700);
    let brk = &a["breaks"][0];
    assert_eq!(brk["kind"], "FENCE_REGRESSED");
    assert_eq!(brk["staleFence"], 5);
    assert_eq!(brk["fences"], serde_json::json!([5, 9]));
    assert_eq!(brk["payoutIds"], serde_json::json!([stale.payout_id]));
    server.shutdown().await.unwrap();

    let (code, json) = reconcile_cli(&f.db.app_url()).await;
    assert_eq!(code, 1, "not clean must exit 1: {json}");
    assert_eq!(json["accounts"][0]["breaks"][0]["staleFence"], 5);
}

#[tokio::test]
async fn reconciliation_attributes_tampered_rows_to_the_grants_that_wrote_the_legs() {
    let f = fixture().await;
    let posting = f.posting(Statements::FENCED);
    let acct = f.customer(10_000).await;
    let p = f.acked(acct, 2_500, 7).await;
    posting.post(p.payout_id, tok(7)).await.unwrap();
    let pending = f.pending(acct, 300).await;

    // Out-of-band edits as superuser (payapp cannot UPDATE/DELETE ledger_entry at all).
    sqlx::query("UPDATE account SET balance_minor = balance_minor + 1 WHERE account_id = $1")
        .bind(acct)
        .execute(&f.admin)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence)
         VALUES ($1, $2, $3, 'CREDIT', 300, 11)",
    )
    .bind(Uuid::new_v4())
    .bind(pending.payout_id)
    .bind(EUR_SETTLEMENT)
    .execute(&f.admin)
    .await
    .unwrap();

    let report = reconcile::run(&f.pool).await.unwrap();
    assert!(!report.clean);
    let customer = report.accounts.iter().find(|a| a.account_id == acct).unwrap();
    assert_eq!(customer.expected_balance_minor, Some(7_500));
    assert_eq!(customer.stored_balance_minor, 7_501);
    assert_eq!(customer.breaks[0].kind, AccountBreakKind::BalanceMismatch);
    assert_eq!(customer.breaks[0].fences, vec![7]);
    let settlement = report
        .accounts
        .iter()
        .find(|a| a.account_id == EUR_SETTLEMENT)
        .unwrap();
    assert_eq!(settlement.breaks[0].kind, AccountBreakKind::SettlementMismatch);
    assert_eq!(settlement.breaks[0].fences, vec![7, 11]);
    assert_eq!(report.payouts.len(), 1);
    assert_eq!(report.payouts[0].payout_id, pending.payout_id);
    assert_eq!(report.payouts[0].kind, PayoutBreakKind::UnexpectedLegs);
    assert_eq!(report.payouts[0].fences, vec![11]);
}

#[tokio::test]
async fn reconcile_cli_rejects_a_bad_database_url() {
    let (code, json) = reconcile_cli("not a url").await;
    assert_eq!((code, json), (2, Value::Null));
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["serve", "--database-url", "postgres://x@127.0.0.1:1/x"])
        .args(["--payment-fencing-enabled", "maybe"])
        .env_remove("PAYMENT_FENCING_ENABLED")
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a bad kill-switch value must not start the server"
    );
}

/// Grant verification is on by default; on with no public key configured, `serve` refuses to start
/// (exit 2) and says which settings to give.
#[tokio::test]
async fn serve_refuses_to_start_with_grant_verification_on_and_no_keys() {
    let out = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args(["serve", "--database-url", "postgres://x@127.0.0.1:1/x"])
        .env_remove("PAYMENT_GRANT_VERIFICATION_ENABLED")
        .env_remove("DLOCK_GRANT_PUBLIC_KEYS")
        .env_remove("DLOCK_GRANT_PUBLIC_KEYS_FILE")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config_invalid")
            && err.contains("DLOCK_GRANT_PUBLIC_KEYS")
            && err.contains("PAYMENT_GRANT_VERIFICATION_ENABLED=false"),
        "{err}"
    );
}

#[tokio::test]
async fn binary_logs_json_warns_when_fencing_is_off_and_stops_on_sigterm() {
    let f = fixture().await;
    let mut child = Command::new(BIN)
        .env("DLOCK_PLAINTEXT", "true")
        .args([
            "serve",
            "--database-url",
            &f.db.app_url(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env("PAYMENT_FENCING_ENABLED", "false")
        .env("PAYMENT_GRANT_VERIFICATION_ENABLED", "false")
        .env_remove("DLOCK_LOG_FORMAT")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut warned = false;
    let mut grants_off = false;
    let mut addr = None;
    // Read the start-up log until the server reports its address (bounded by a deadline).
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
            if v["event"] == "fencing_disabled" {
                assert_eq!(v["level"], "WARN", "{v}");
                warned = true;
            }
            if v["event"] == "grant_verification_disabled" {
                assert_eq!(
                    (&v["level"], &v["key"]),
                    (&json!("WARN"), &json!("PAYMENT_GRANT_VERIFICATION_ENABLED")),
                    "{v}"
                );
                grants_off = true;
            }
            if v["event"] == "listening" {
                addr = v["addr"].as_str().map(str::to_owned);
                break;
            }
        }
    })
    .await
    .expect("server did not report listening");
    assert!(warned, "no WARN when payment.fencing.enabled=false");
    assert!(grants_off, "no WARN when grant verification is off");
    let addr = addr.expect("listening addr");
    let health = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    assert_eq!(health.status().as_u16(), 200);

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().await.unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("no exit after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "graceful shutdown exits 0");
    let mut stopped = false;
    while let Some(line) = lines.next_line().await.unwrap() {
        stopped |= line.contains("\"stopped\"");
    }
    assert!(stopped, "no stopped event after SIGTERM");
}

/// Every break kind's gauge after the last completed periodic run, or `None` while one is missing.
fn break_gauges(text: &str) -> Option<Vec<(&'static str, f64)>> {
    reconcile::break_kinds()
        .map(|kind| {
            dlock_testkit::metrics::metric_value(text, "payment_reconciliation_breaks", &[("kind", kind)])
                .map(|v| (kind, v))
        })
        .collect()
}

async fn scrape(server: &payment_resource::RunningServer) -> String {
    dlock_testkit::metrics::scrape(&server.url())
        .await
        .expect("scrape /metrics")
}

/// A schedule that runs both checks every 100 ms.
fn fast_checks() -> payment_resource::config::Schedule {
    payment_resource::config::Schedule {
        reconcile_every: Some(Duration::from_millis(100)),
        payout_stats_every: Some(Duration::from_millis(100)),
        ..payment_resource::config::Schedule::default()
    }
}

/// The periodic reconciliation exports every break kind: all zero over a clean ledger, and a break
/// planted behind the service's back — a balance moved without a leg, and a posted payout whose
/// rail submission is no longer acknowledged (the rail comparison) — shows as exactly one of its
/// kind at the next run, the others staying zero.
#[tokio::test]
async fn the_periodic_reconciliation_exports_zero_for_a_clean_ledger_and_counts_a_planted_break() {
    let f = fixture().await;
    let posting = f.posting(Statements::FENCED);
    let acct = f.customer(10_000).await;
    let mut posted = Vec::new();
    for (amount, token) in [(1_000, 3), (2_000, 4)] {
        let p = f.acked(acct, amount, token).await;
        posting.post(p.payout_id, tok(token)).await.unwrap();
        posted.push(p);
    }
    let server = payment_resource::spawn(
        payment_resource::Config::ephemeral(f.db.app_url())
            .with_credentials(common::credentials())
            .with_grants(common::grants())
            .with_monitor(fast_checks()),
    )
    .await
    .unwrap();

    let clean = dlock_testkit::wait::eventually(
        "a clean periodic run",
        dlock_testkit::wait::WAIT_LIMIT,
        || async {
            let text = scrape(&server).await;
            let clean_runs = dlock_testkit::metrics::metric_value(
                &text,
                "payment_reconciliation_runs_total",
                &[("result", "clean")],
            )?;
            (clean_runs >= 1.0).then(|| break_gauges(&text)).flatten()
        },
    )
    .await
    .unwrap();
    assert_eq!(clean.len(), 11, "every kind is exported: {clean:?}");
    assert!(
        clean.iter().all(|(_, v)| *v == 0.0),
        "a clean ledger reads zero: {clean:?}"
    );

    // Behind the service's back, as the database owner: money moved without a leg ...
    sqlx::query("UPDATE account SET balance_minor = balance_minor - 1 WHERE account_id = $1")
        .bind(acct)
        .execute(&f.admin)
        .await
        .unwrap();
    // ... and a posted payout the rail no longer acknowledges.
    sqlx::query("UPDATE rail_submission SET outcome = 'REJECTED' WHERE payout_id = $1")
        .bind(posted[0].payout_id)
        .execute(&f.admin)
        .await
        .unwrap();
    let broken = dlock_testkit::wait::eventually(
        "the planted breaks in the metrics",
        dlock_testkit::wait::WAIT_LIMIT,
        || async {
            let gauges = break_gauges(&scrape(&server).await)?;
            gauges.iter().any(|(_, v)| *v > 0.0).then_some(gauges)
        },
    )
    .await
    .unwrap();
    for (kind, v) in &broken {
        let want = match *kind {
            "BALANCE_MISMATCH" | "POSTED_WITHOUT_RAIL_ACK" => 1.0,
            _ => 0.0,
        };
        assert_eq!(*v, want, "{kind}: {broken:?}");
    }
    let text = scrape(&server).await;
    assert!(
        dlock_testkit::metrics::metric_value(
            &text,
            "payment_reconciliation_runs_total",
            &[("result", "breaks")]
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    // The HTTP report says the same: the metric is the report's counts, not a second opinion.
    let report = reconcile::run(&f.pool).await.unwrap();
    assert_eq!(report.break_count("BALANCE_MISMATCH"), 1, "{report:?}");
    assert_eq!(report.break_count("POSTED_WITHOUT_RAIL_ACK"), 1, "{report:?}");
    server.shutdown().await.unwrap();
}

/// The open payouts by state and the age of the oldest: a PENDING payout counts at once, and a
/// RAIL_SUBMITTED payout unchanged for an hour reads at least 3600 s (what the "stuck" alert reads).
#[tokio::test]
async fn the_open_payouts_are_counted_by_state_with_the_age_of_the_oldest() {
    let f = fixture().await;
    let acct = f.customer(10_000).await;
    f.pending(acct, 100).await;
    let submitted = f.pending(acct, 200).await;
    f.payouts
        .claim(submitted.payout_id, "worker-5", tok(5))
        .await
        .unwrap();
    f.payouts
        .transition(
            submitted.payout_id,
            payment_resource::model::PayoutState::Claimed,
            payment_resource::model::PayoutState::RailSubmitted,
            tok(5),
        )
        .await
        .unwrap();
    sqlx::query("UPDATE payout SET updated_at = now() - interval '1 hour' WHERE payout_id = $1")
        .bind(submitted.payout_id)
        .execute(&f.admin)
        .await
        .unwrap();
    let server = payment_resource::spawn(
        payment_resource::Config::ephemeral(f.db.app_url())
            .with_credentials(common::credentials())
            .with_grants(common::grants())
            .with_monitor(fast_checks()),
    )
    .await
    .unwrap();
    let value = |text: &str, name: &str, state: &str| {
        dlock_testkit::metrics::metric_value(text, name, &[("state", state)])
    };
    let text = dlock_testkit::wait::eventually(
        "the open payouts counted",
        dlock_testkit::wait::WAIT_LIMIT,
        || async {
            let text = scrape(&server).await;
            value(&text, "payment_payouts_open", "PENDING")
                .is_some()
                .then_some(text)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        value(&text, "payment_payouts_open", "PENDING"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "payment_payouts_open", "RAIL_SUBMITTED"),
        Some(1.0),
        "{text}"
    );
    for state in ["CLAIMED", "RAIL_ACKED", "RAIL_AMBIGUOUS"] {
        assert_eq!(
            value(&text, "payment_payouts_open", state),
            Some(0.0),
            "{state}: {text}"
        );
        assert_eq!(
            value(&text, "payment_payouts_open_oldest_age_seconds", state),
            Some(0.0),
            "{state}: {text}"
        );
    }
    let age = value(&text, "payment_payouts_open_oldest_age_seconds", "RAIL_SUBMITTED").unwrap();
    assert!((3600.0..7200.0).contains(&age), "{age}: {text}");
    let pending_age = value(&text, "payment_payouts_open_oldest_age_seconds", "PENDING").unwrap();
    assert!(pending_age < 3600.0, "{pending_age}: {text}");
    assert!(
        !text.contains("payment_payouts_open{state=\"POSTED\"}"),
        "terminal states are not counted: {text}"
    );
    server.shutdown().await.unwrap();
}

/// A reconciliation that cannot run is counted as failed and exports no break counts: "no reading"
/// never looks like a clean ledger.
#[tokio::test]
async fn a_reconciliation_that_cannot_run_is_counted_as_failed_not_as_zero() {
    // Nothing listens on port 1: every run fails to connect.
    let server = payment_resource::spawn(
        payment_resource::Config::ephemeral("postgres://payapp:none@127.0.0.1:1/paydb")
            .with_grants(common::grants())
            .with_monitor(fast_checks()),
    )
    .await
    .unwrap();
    let text = dlock_testkit::wait::eventually(
        "a failed run counted",
        dlock_testkit::wait::WAIT_LIMIT,
        || async {
            let text = scrape(&server).await;
            dlock_testkit::metrics::metric_value(
                &text,
                "payment_reconciliation_runs_total",
                &[("result", "failed")],
            )
            .is_some_and(|n| n >= 1.0)
            .then_some(text)
        },
    )
    .await
    .unwrap();
    assert!(!text.contains("payment_reconciliation_breaks{"), "{text}");
    assert_eq!(
        dlock_testkit::metrics::metric_value(
            &text,
            "payment_reconciliation_runs_total",
            &[("result", "clean")]
        ),
        Some(0.0),
        "{text}"
    );
    server.shutdown().await.unwrap();
}
