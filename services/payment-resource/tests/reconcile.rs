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
