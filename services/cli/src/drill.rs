//! `dlock drill restore`: the restore hazard of C1 §1.7 and its fix, on loopback, without Kubernetes.
//!
//! Payouts run; lockdb is snapshotted; payouts go on (the resources see higher tokens); the snapshot
//! is restored (the sequence rewinds below what the resources have seen); new grants are fenced out
//! by the resources while nothing is paid twice; the fast-forward (the same library the operator's
//! Jobs run) moves the sequence past the high-water; payouts resume. Every number is printed.
//!
//! The snapshot is a file-level copy of the database made by the server itself
//! (`CREATE DATABASE … TEMPLATE lockdb`, with lock-server stopped so nothing is connected), and the
//! restore drops lockdb and recreates it from that copy: the same effect on `fencing_token_seq` as
//! restoring a data-directory backup.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dlock_testkit::History;
use dlock_testkit::procs::{Service, Spec};
use payout_executor::stack::{Stack, StackOptions};
use sqlx::Connection;
use uuid::Uuid;

use crate::stack::{Database, step};

const ACCOUNTS: u32 = 4;
const LIMIT: Duration = Duration::from_secs(90);
const MARGIN: i64 = 1000;

/// lock-server on a fixed port, so executors keep one URL across its restarts.
struct LockServer {
    spec: Spec,
    svc: Option<Service>,
    dir: std::path::PathBuf,
}

impl LockServer {
    async fn start(db: &Database, dir: &Path) -> Result<LockServer> {
        let spec = Spec::new("lock-server", "lock-server")?.args([
            "--database-url",
            &db.app_url(),
            "--listen",
            "127.0.0.1:{port}",
        ]);
        let mut ls = LockServer {
            spec,
            svc: None,
            dir: dir.to_path_buf(),
        };
        ls.up().await?;
        Ok(ls)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.spec.port)
    }

    async fn up(&mut self) -> Result<()> {
        let mut spec = self.spec.clone();
        spec.name = format!("lock-server-{}", self.spec.port);
        self.svc = Some(Service::start(spec, &self.dir).await?);
        Ok(())
    }

    fn down(&mut self) {
        if let Some(mut s) = self.svc.take() {
            s.stop();
        }
    }
}

async fn on_server(db: &Database, sql: &str) -> Result<()> {
    let mut c = sqlx::PgConnection::connect(&db.server.url("postgres", "postgres")).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(())
}

fn admin_url(db: &Database) -> String {
    db.server.url("postgres", db.history.name())
}

/// One batch: `per_account` payouts on each of the first accounts, run by a batch executor until it
/// is idle. Returns the payout ids.
async fn batch(stack: &Stack, name: &str, per_account: i64) -> Result<Vec<Uuid>> {
    let mut ids = Vec::new();
    for n in 1..=ACCOUNTS {
        let account: Uuid = format!("00000000-0000-4000-8000-{n:012}").parse()?;
        let currency = stack.account(account).await?.currency;
        for k in 0..per_account {
            ids.push(stack.create_payout(account, 500 + 100 * k, &currency).await?.payout_id);
        }
    }
    let spec = stack.executor_spec(name)?.args(["--workers", "2"]);
    let mut e = stack.start_executor(spec).await?;
    if e.wait_exit(LIMIT).await.is_none() {
        e.stop();
        bail!("{name} did not finish within {}s", LIMIT.as_secs());
    }
    Ok(ids)
}

async fn states(stack: &Stack, ids: &[Uuid]) -> Result<std::collections::BTreeMap<String, usize>> {
    let mut out = std::collections::BTreeMap::new();
    for id in ids {
        *out.entry(stack.payout(*id).await?.state.as_str().to_owned()).or_insert(0) += 1;
    }
    Ok(out)
}

fn show(m: &std::collections::BTreeMap<String, usize>) -> String {
    m.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
}

async fn numbers(lockdb: &Database, paydb: &Database) -> Result<(i64, dlock_fastforward::HighWater)> {
    let seq = dlock_fastforward::read_sequence(&admin_url(lockdb)).await?;
    let hw = dlock_fastforward::read_high_water("paydb", &admin_url(paydb)).await?;
    Ok((seq, hw))
}

fn print_numbers(label: &str, seq: i64, hw: &dlock_fastforward::HighWater) {
    step(format!(
        "{label}: fencing_token_seq {seq}; paydb high-water {} (rail {}, account {}, ledger {}, claim {}){}",
        hw.highest,
        hw.rail_high_water,
        hw.account_fence,
        hw.ledger_fence,
        hw.claim_token,
        if seq < hw.highest { "  ← BEHIND: new grants are fenced out" } else { "" }
    ));
}

/// Runs the drill; `Ok(true)` when every expectation held.
pub async fn restore(run_dir: &Path) -> Result<bool> {
    println!("Restore drill (C1 §1.7): data and logs in {}", run_dir.display());
    let lockdb = Database::start(History::Lockdb).await?;
    let paydb = Database::start(History::Paydb).await?;
    let mut ls = LockServer::start(&lockdb, run_dir).await?;
    let mut opts = StackOptions::new(run_dir.join("stack"));
    opts.lock_server_url = Some(ls.url());
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts).await?;
    step(format!("lock-server {}, payment-resource {}, rail-proxy {}", ls.url(), stack.payment.url(), stack.rail_proxy.url()));
    let mut ok = true;

    println!("\n1. Payouts run");
    let b1 = batch(&stack, "executor-1", 2).await?;
    step(format!("batch 1: {}", show(&states(&stack, &b1).await?)));
    let (seq, hw) = numbers(&lockdb, &paydb).await?;
    print_numbers("after batch 1", seq, &hw);

    println!("\n2. lockdb is backed up (lock-server stopped, file-level copy of the database)");
    ls.down();
    on_server(&lockdb, "CREATE DATABASE lockdb_snapshot TEMPLATE lockdb").await?;
    ls.up().await?;
    let snapshot_seq = seq;
    step(format!("snapshot taken at fencing_token_seq {snapshot_seq}"));

    println!("\n3. Payouts go on after the backup");
    let b2 = batch(&stack, "executor-2", 3).await?;
    step(format!("batch 2: {}", show(&states(&stack, &b2).await?)));
    let (seq, hw_before_restore) = numbers(&lockdb, &paydb).await?;
    print_numbers("after batch 2", seq, &hw_before_restore);
    let rail_before = stack.rail_received().await?;

    println!("\n4. lockdb is restored from the backup: the sequence rewinds");
    ls.down();
    on_server(&lockdb, "DROP DATABASE lockdb WITH (FORCE)").await?;
    on_server(&lockdb, "CREATE DATABASE lockdb TEMPLATE lockdb_snapshot").await?;
    ls.up().await?;
    let (seq, hw) = numbers(&lockdb, &paydb).await?;
    print_numbers("after the restore", seq, &hw);
    if seq != snapshot_seq || seq >= hw.highest {
        step(format!("UNEXPECTED: the sequence should be back at {snapshot_seq}, below {}", hw.highest));
        ok = false;
    }

    println!("\n5. New grants reuse tokens the resources have already seen");
    let fenced_rail_0 = stack.metric(&stack.rail_proxy.url(), "lock_fenced_out_total", &[("resource", "rail")]).await.unwrap_or(0.0);
    let fenced_acc_0 = stack.metric(&stack.payment.url(), "lock_fenced_out_total", &[("resource", "account")]).await.unwrap_or(0.0);
    let b3 = batch(&stack, "executor-3", 1).await?;
    let s3 = states(&stack, &b3).await?;
    let fenced_rail = stack.metric(&stack.rail_proxy.url(), "lock_fenced_out_total", &[("resource", "rail")]).await.unwrap_or(0.0) - fenced_rail_0;
    let fenced_acc = stack.metric(&stack.payment.url(), "lock_fenced_out_total", &[("resource", "account")]).await.unwrap_or(0.0) - fenced_acc_0;
    let rail_after = stack.rail_received().await?;
    step(format!("batch 3 with the rewound sequence: {}", show(&s3)));
    step(format!(
        "fenced out: {fenced_rail} at rail-proxy, {fenced_acc} at payment-resource; rail received {} new request(s); payouts paid twice: {}",
        rail_after.requests.len().saturating_sub(rail_before.requests.len()),
        rail_after.paid_twice.len()
    ));
    if s3.get("POSTED").copied().unwrap_or(0) > 0 || !rail_after.paid_twice.is_empty() {
        step("UNEXPECTED: a rewound token got through");
        ok = false;
    }

    println!("\n6. Restore fast-forward: gate, read the high-water, advance, resume");
    ls.down();
    step("gate: lock-server stopped, no grant can be issued");
    let (_, hw) = numbers(&lockdb, &paydb).await?;
    let target = hw.highest + MARGIN;
    let a = dlock_fastforward::advance(&admin_url(&lockdb), target).await?;
    step(format!(
        "high-water {} + margin {MARGIN}: fencing_token_seq {} → {} (setval GREATEST, never lower)",
        hw.highest, a.before, a.after
    ));
    ls.up().await?;
    step("resume: lock-server started");

    println!("\n7. Payouts resume");
    let b4 = batch(&stack, "executor-4", 1).await?;
    step(format!("batch 4: {}", show(&states(&stack, &b4).await?)));
    step(format!("batch 3 after the fast-forward: {}", show(&states(&stack, &b3).await?)));
    let (seq, hw) = numbers(&lockdb, &paydb).await?;
    print_numbers("after the fast-forward", seq, &hw);
    let s4 = states(&stack, &b4).await?;
    if s4.get("POSTED").copied().unwrap_or(0) != b4.len() {
        step("UNEXPECTED: not every new payout was posted");
        ok = false;
    }
    let rail_end = stack.rail_received().await?;
    let recon = stack.reconciliation().await?;
    step(format!("payouts paid twice: {}; reconciliation: {recon}", rail_end.paid_twice.len()));
    if !rail_end.paid_twice.is_empty() {
        ok = false;
    }
    ls.down();
    println!("\nverdict: {}", if ok { "the drill held: nothing double-paid, fenced while rewound, resumed after the fast-forward" } else { "UNEXPECTED RESULTS (see above)" });
    Ok(ok)
}
