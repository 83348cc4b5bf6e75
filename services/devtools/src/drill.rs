//! `dlock-dev drill restore`: the restore fast-forward (C1 §1.7) rehearsed on loopback, without
//! Kubernetes, on the same PostgreSQL 16 servers and service processes as `dlock-dev demo`.
//!
//! A restored lockdb hands out tokens the resources have already seen, so every new grant is fenced
//! out: safe (nothing is paid twice) but nothing is paid at all. The drill takes a real physical
//! snapshot of lockdb, keeps paying, puts the snapshot back, shows the stall and its safety, runs the
//! fast-forward the operator runs (`dlock_fastforward`), and shows payouts resume.

use std::cell::RefCell;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dlock_fastforward::{HighWater, advance, read_high_water, read_sequence};
use dlock_testkit::History;
use dlock_testkit::stack::{Stack, StackOptions};
use dlock_testkit::wait::eventually;
use payout_executor::model::Payout;
use serde_json::Value;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::lockapi::Api;
use crate::stack::{Database, RunDir, step};

/// Seeded customer accounts used by the drill (R__seed_synthetic_accounts.sql: …0001 to …0020).
const ACCOUNTS: u32 = 8;
const PAYOUTS_PER_ACCOUNT: i64 = 4;
/// Grants on other keys between the snapshot and the restore. A real backup is hours old and the
/// sequence is global, so every account's fence ends up far above the snapshot's sequence; without
/// this gap a stalled executor would climb past a fence within a few attempts and the window in
/// which new grants are fenced out would be too short to observe.
const OTHER_GRANTS: usize = 1_500;
const OTHER_CLIENTS: usize = 4;
/// Added to the highest token any resource has seen (the operator's default margin).
const MARGIN: i64 = dlock_fastforward::DEFAULT_MARGIN;
const LIMIT: Duration = Duration::from_secs(90);

/// How the drill runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Negative control: restore, then try to resume without the fast-forward.
    pub skip_fast_forward: bool,
}

/// Refusals counted by the resources themselves (`lock_fenced_out_total{resource}`).
#[derive(Debug, Clone, Copy, Default)]
struct Fenced {
    account: u64,
    ledger: u64,
    payout: u64,
    rail: u64,
}

impl Fenced {
    fn total(&self) -> u64 {
        self.account + self.ledger + self.payout + self.rail
    }

    fn since(&self, before: &Fenced) -> Fenced {
        Fenced {
            account: self.account.saturating_sub(before.account),
            ledger: self.ledger.saturating_sub(before.ledger),
            payout: self.payout.saturating_sub(before.payout),
            rail: self.rail.saturating_sub(before.rail),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} (payment-resource: account {}, ledger {}, payout {}; rail-proxy: {})",
            self.total(),
            self.account,
            self.ledger,
            self.payout,
            self.rail
        )
    }
}

/// What the rail and payment-resource say about a set of payouts.
#[derive(Debug, Default)]
struct Tally {
    posted: usize,
    received: u64,
    received_twice: usize,
    paid_twice: usize,
}

fn seeded_account(n: u32) -> Result<Uuid> {
    Ok(format!("00000000-0000-4000-8000-{n:012}").parse()?)
}

/// Prints ✔/✘ lines and remembers whether all held.
struct Checks {
    ok: bool,
}

impl Checks {
    fn check(&mut self, what: impl AsRef<str>, held: bool) {
        println!("    {} {}", if held { "✔" } else { "✘" }, what.as_ref());
        self.ok &= held;
    }
}

struct Drill {
    stack: Stack,
    http: reqwest::Client,
    /// lockdb as its owner (`postgres`): advancing the sequence needs more than lockapp's USAGE.
    lockdb_owner_url: String,
    /// paydb as payapp, which may read every high-water table (the operator's Job uses the same).
    paydb_url: String,
}

impl Drill {
    async fn create_batch(&self, n: i64) -> Result<Vec<Payout>> {
        let mut payouts = Vec::new();
        for a in 1..=ACCOUNTS {
            let id = seeded_account(a)?;
            let account = self
                .stack
                .account(id)
                .await
                .with_context(|| format!("seeded account {id}"))?;
            for k in 0..PAYOUTS_PER_ACCOUNT {
                payouts.push(
                    self.stack
                        .create_payout(id, 1_000 * n + 250 * k, &account.currency)
                        .await?,
                );
            }
        }
        step(format!(
            "batch {n}: {} payouts created PENDING across {ACCOUNTS} seeded accounts",
            payouts.len()
        ));
        Ok(payouts)
    }

    /// Starts `count` batch-mode executors (they exit when nothing is left for them).
    async fn executors(&self, prefix: &str, count: usize) -> Result<Vec<dlock_testkit::procs::Service>> {
        let mut started = Vec::new();
        for i in 1..=count {
            let spec = self
                .stack
                .executor_spec(&format!("{prefix}-{i}"))?
                .args(["--workers", "2"]);
            started.push(self.stack.start_executor(spec).await?);
        }
        Ok(started)
    }

    /// Payouts PENDING and in flight (earlier batches have ended, so these are the current batch's).
    async fn open_counts(&self) -> Result<(usize, usize)> {
        let base = self.stack.payment.url();
        let mut counts = [0usize; 5];
        for (slot, state) in counts.iter_mut().zip([
            "PENDING",
            "CLAIMED",
            "RAIL_SUBMITTED",
            "RAIL_ACKED",
            "RAIL_AMBIGUOUS",
        ]) {
            let v: Value = self
                .http
                .get(format!("{base}/v1/payouts?state={state}&limit=500"))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            *slot = v["items"].as_array().map_or(0, Vec::len);
        }
        Ok((counts[0], counts[1..].iter().sum()))
    }

    /// Waits until no payout is left open, printing progress as it changes, or until a resource
    /// refuses a token when `stop_on_refusal` is given (then returns `false` at once). `false` also
    /// when `LIMIT` passes first.
    async fn drain(&self, total: usize, stop_on_refusal: Option<Fenced>) -> Result<bool> {
        let last = RefCell::new(String::new());
        let outcome = eventually("the batch to end", LIMIT, || {
            let last = &last;
            async move {
                if let Some(before) = stop_on_refusal {
                    let now = self.fenced().await.ok()?.since(&before);
                    if now.total() > 0 {
                        step(format!("refused: {}", now.describe()));
                        return Some(false);
                    }
                }
                let (pending, in_flight) = self.open_counts().await.ok()?;
                let line = format!(
                    "{pending:>3} pending  {in_flight:>3} in flight  {:>3} ended of {total}",
                    total.saturating_sub(pending + in_flight)
                );
                if *last.borrow() != line {
                    step(&line);
                    *last.borrow_mut() = line;
                }
                (pending + in_flight == 0).then_some(true)
            }
        })
        .await;
        match outcome {
            Ok(done) => Ok(done),
            Err(e) => {
                step(format!("{e:#}"));
                Ok(false)
            }
        }
    }

    async fn fenced(&self) -> Result<Fenced> {
        let pay = self.stack.payment.url();
        let rail = self.stack.rail_proxy.url();
        let count = |v: f64| v.max(0.0) as u64;
        let m = |base: String, resource: &'static str| async move {
            self.stack
                .metric(&base, "lock_fenced_out_total", &[("resource", resource)])
                .await
                .map(count)
        };
        Ok(Fenced {
            account: m(pay.clone(), "account").await?,
            ledger: m(pay.clone(), "ledger").await?,
            payout: m(pay, "payout").await?,
            rail: m(rail, "rail").await?,
        })
    }

    async fn tally(&self, payouts: &[&Payout]) -> Result<Tally> {
        let received = self.stack.rail_received().await?;
        let mut t = Tally::default();
        for p in payouts {
            let now = self.stack.payout(p.payout_id).await?;
            t.posted += usize::from(now.state.as_str() == "POSTED");
            t.received += received.received(p.payout_id);
            t.received_twice += usize::from(received.received(p.payout_id) > 1);
            t.paid_twice += usize::from(received.paid(p.payout_id) > 1);
        }
        Ok(t)
    }

    /// Opening balance minus every POSTED payout, against the balance payment-resource reports;
    /// 0 when the ledger is balanced.
    async fn balance_error(&self, payouts: &[&Payout]) -> Result<i64> {
        let mut error = 0;
        for a in 1..=ACCOUNTS {
            let id = seeded_account(a)?;
            let account = self.stack.account(id).await?;
            let mut spent = 0;
            for p in payouts.iter().filter(|p| p.account_id == id) {
                if self.stack.payout(p.payout_id).await?.state.as_str() == "POSTED" {
                    spent += p.amount_minor;
                }
            }
            error += (account.opening_balance_minor - spent) - account.balance_minor;
        }
        Ok(error)
    }

    async fn sequence(&self) -> Result<i64> {
        Ok(read_sequence(&self.lockdb_owner_url).await?)
    }

    async fn high_water(&self) -> Result<HighWater> {
        Ok(read_high_water("paydb", &self.paydb_url).await?)
    }

    async fn lock_server_ready(&self, what: &str) -> Result<()> {
        let url = format!("{}/readyz", self.stack.lock_url);
        let http = &self.http;
        eventually(what, LIMIT, || {
            let url = &url;
            async move {
                let r = http.get(url.as_str()).send().await.ok()?;
                r.status().is_success().then_some(())
            }
        })
        .await
    }
}

/// Grants and releases on keys no payout uses, from a few clients at once: the lock traffic of the
/// rest of the day. Returns the highest token handed out.
async fn other_traffic(lock_url: &str) -> Result<i64> {
    let mut clients = JoinSet::new();
    for c in 0..OTHER_CLIENTS {
        let url = lock_url.to_owned();
        clients.spawn(async move {
            let api = Api::new(url, None)?;
            let owner = format!("other-{c}");
            let key = format!("other:{c}");
            let session = api.session(&owner).await?;
            let mut highest = 0;
            for _ in 0..OTHER_GRANTS / OTHER_CLIENTS {
                let (status, body) = api.acquire(&key, &session, &owner, 10_000).await?;
                let Some(token) = body["fencingToken"].as_i64() else {
                    bail!("acquire {key}: {status} {body}");
                };
                highest = highest.max(token);
                let (status, body) = api.release(&key, token).await?;
                if body["released"] != true {
                    bail!("release {key}: {status} {body}");
                }
            }
            Ok::<i64, anyhow::Error>(highest)
        });
    }
    let mut highest = 0;
    while let Some(done) = clients.join_next().await {
        highest = highest.max(done.context("a lock client task")??);
    }
    Ok(highest)
}

/// Stops lockdb's postgres cleanly, runs `f` on its PGDATA, starts it again on the same port.
async fn with_lockdb_stopped(
    db: Database,
    f: impl FnOnce(&Path) -> Result<()> + Send + 'static,
) -> Result<Database> {
    // PgServer's stop and start block (they wait on the server's process and pid file).
    let (db, r) = tokio::task::spawn_blocking(move || {
        let mut db = db;
        let r = stopped(&mut db, f);
        (db, r)
    })
    .await
    .context("the lockdb task")?;
    r?;
    Ok(db)
}

fn stopped(db: &mut Database, f: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    db.server.shutdown().context("stop lockdb cleanly")?;
    f(&db.server.pgdata())?;
    db.server.restart().context("start lockdb again")?;
    Ok(())
}

/// `cp -a`: keeps owner and modes, which postgres insists on for PGDATA.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .context("run cp")?;
    if !status.success() {
        bail!("cp -a {} {}: {status}", from.display(), to.display());
    }
    Ok(())
}

pub async fn restore(run_dir: &RunDir, options: Options) -> Result<bool> {
    let started = Instant::now();
    let mut checks = Checks { ok: true };
    println!("dlock-dev drill restore — lockdb restored from a snapshot, then the fast-forward (C1 §1.7)");
    if options.skip_fast_forward {
        println!("(negative control: --skip-fast-forward, the drill must fail its \"payouts resume\" check)");
    }
    println!();
    println!("Starting lockdb, paydb and the payments stack on loopback:");
    let lockdb = Database::start(History::Lockdb).await?;
    let paydb = Database::start(History::Paydb).await?;
    let drill_dir = run_dir.path().join("drill");
    let opts = StackOptions::new(drill_dir.join("logs"));
    let stack = Stack::start(&lockdb.app_url(), &paydb.app_url(), &opts).await?;
    step(format!(
        "lock-server {}, payment-resource {}, rail-proxy {}, rail-stub {}",
        stack.lock_url,
        stack.payment.url(),
        stack.rail_proxy.url(),
        stack.rail_stub.url()
    ));
    let drill = Drill {
        stack,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?,
        lockdb_owner_url: lockdb.server.url("postgres", "lockdb"),
        paydb_url: paydb.app_url(),
    };

    println!();
    println!("1. Batch 1, two executors.");
    let batch1 = drill.create_batch(1).await?;
    let mut running = drill.executors("executor-b1", 2).await?;
    let drained = drill.drain(batch1.len(), None).await?;
    running.iter_mut().for_each(dlock_testkit::procs::Service::stop);
    let t1 = drill.tally(&batch1.iter().collect::<Vec<_>>()).await?;
    checks.check(
        format!("batch 1: {} of {} POSTED", t1.posted, batch1.len()),
        drained && t1.posted == batch1.len(),
    );

    println!();
    println!("2. Snapshot lockdb: stop its postgres cleanly, copy PGDATA, start it again.");
    let at_snapshot = drill.sequence().await?;
    let snapshot = drill_dir.join("lockdb-snapshot");
    let lockdb = {
        let snapshot = snapshot.clone();
        with_lockdb_stopped(lockdb, move |pgdata| {
            // A rerun in the same --run-dir: cp would copy into the old snapshot, not replace it.
            if snapshot.exists() {
                std::fs::remove_dir_all(&snapshot)
                    .with_context(|| format!("remove {}", snapshot.display()))?;
            }
            copy_dir(pgdata, &snapshot)
        })
        .await?
    };
    step(format!(
        "snapshot of lockdb at sequence {at_snapshot} in {} (postgres back on 127.0.0.1:{}, pid {})",
        snapshot.display(),
        lockdb.server.port,
        lockdb.server.pid
    ));
    drill
        .lock_server_ready("lock-server to answer /readyz after lockdb's restart")
        .await?;

    println!();
    println!("3. Life goes on: {OTHER_GRANTS} grants on other keys, then batch 2.");
    let other = other_traffic(&drill.stack.lock_url).await?;
    step(format!(
        "other lock traffic: {OTHER_GRANTS} grants, the highest token {other}"
    ));
    let batch2 = drill.create_batch(2).await?;
    let mut running = drill.executors("executor-b2", 2).await?;
    let drained = drill.drain(batch2.len(), None).await?;
    running.iter_mut().for_each(dlock_testkit::procs::Service::stop);
    let t2 = drill.tally(&batch2.iter().collect::<Vec<_>>()).await?;
    checks.check(
        format!("batch 2: {} of {} POSTED", t2.posted, batch2.len()),
        drained && t2.posted == batch2.len(),
    );
    let before_restore = drill.sequence().await?;
    let hw = drill.high_water().await?;
    step(format!(
        "lockdb's sequence {before_restore}; paydb's high-water {} (rail {}, account {}, ledger {}, claim {})",
        hw.highest, hw.rail_high_water, hw.account_fence, hw.ledger_fence, hw.claim_token
    ));
    checks.check(
        format!(
            "the resources have seen tokens above the snapshot's sequence ({} > {at_snapshot})",
            hw.highest
        ),
        hw.highest > at_snapshot,
    );

    println!();
    println!(
        "4. Restore lockdb from the snapshot: stop it, put the copied PGDATA back, start it on the same port."
    );
    let port = lockdb.server.port;
    let lockdb = {
        let snapshot = snapshot.clone();
        with_lockdb_stopped(lockdb, move |pgdata| {
            std::fs::remove_dir_all(pgdata).with_context(|| format!("remove {}", pgdata.display()))?;
            copy_dir(&snapshot, pgdata)
        })
        .await?
    };
    drill
        .lock_server_ready("lock-server to answer /readyz against the restored lockdb")
        .await?;
    let restored = drill.sequence().await?;
    step(format!(
        "lockdb back on 127.0.0.1:{} (pid {}); lock-server reconnected",
        lockdb.server.port, lockdb.server.pid
    ));
    step(format!(
        "sequence before the restore {before_restore}, after {restored}"
    ));
    // lock-server jumps on the restored history (a restarted postmaster) before its first grant, but
    // the snapshot lacks the jump it made when lockdb restarted after the copy, and two jumps minutes
    // apart are 2^32 each above what they find: the restored sequence lands below the tokens handed
    // out since (docs/design.md, "Never a reused token"). The fast-forward is what covers a restore.
    checks.check(
        format!(
            "the restore rewound the sequence ({before_restore} → {restored}; the snapshot's {at_snapshot}, jumped by lock-server), below the high-water {}",
            hw.highest
        ),
        lockdb.server.port == port && restored < before_restore && restored < hw.highest,
    );

    println!();
    println!(
        "5. Batch 3 with the rewound sequence: every new grant carries a token the resources have seen."
    );
    let batch3 = drill.create_batch(3).await?;
    let before = drill.fenced().await?;
    let target = batch3.len() as u64;
    let mut stalled = drill.executors("executor-b3", 1).await?;
    let refused = eventually("the resources to refuse the stale grants", LIMIT, || async {
        let now = drill.fenced().await.ok()?.since(&before);
        (now.total() >= target).then_some(())
    })
    .await;
    // Frozen while the evidence is read, so the window cannot move underneath it.
    for e in &stalled {
        e.pause()?;
    }
    let refusals = drill.fenced().await?.since(&before);
    let t3 = drill.tally(&batch3.iter().collect::<Vec<_>>()).await?;
    let during = drill.sequence().await?;
    stalled.iter_mut().for_each(dlock_testkit::procs::Service::stop);
    step(format!(
        "refusals while the sequence is behind: {}",
        refusals.describe()
    ));
    step(format!(
        "batch 3: {} POSTED, {} submissions reached the rail; the sequence is at {during}, still below the high-water {}",
        t3.posted, t3.received, hw.highest
    ));
    checks.check(
        format!(
            "every new grant is fenced out: {} refusals for {target} payouts",
            refusals.total()
        ),
        refused.is_ok() && refusals.total() >= target,
    );
    checks.check(
        "batch 3 makes no progress: nothing POSTED, nothing sent to the rail",
        t3.posted == 0 && t3.received == 0,
    );
    checks.check(
        format!(
            "the window was real: the sequence ({during}) never passed the high-water ({})",
            hw.highest
        ),
        during < hw.highest,
    );
    let so_far: Vec<&Payout> = batch1.iter().chain(&batch2).chain(&batch3).collect();
    let t = drill.tally(&so_far).await?;
    let balance = drill.balance_error(&so_far).await?;
    let clean = drill.stack.reconciliation().await?["clean"] == true;
    checks.check(
        format!(
            "nothing double-paid: {} payouts received twice at the rail, {} paid twice; balance error {balance}; reconciliation {}",
            t.received_twice,
            t.paid_twice,
            if clean { "clean" } else { "BREAKS" }
        ),
        t.received_twice == 0 && t.paid_twice == 0 && balance == 0 && clean,
    );

    println!();
    println!(
        "6. Fast-forward: read every high-water, advance the sequence to max + {MARGIN}, never lowering it."
    );
    if options.skip_fast_forward {
        step(format!(
            "SKIPPED (--skip-fast-forward): the sequence stays at {}, below the high-water {}",
            drill.sequence().await?,
            hw.highest
        ));
    } else {
        let hw = drill.high_water().await?;
        let seq = drill.sequence().await?;
        step(format!(
            "read: lockdb's sequence {seq}; paydb's high-water {} (rail {}, account {}, ledger {}, claim {})",
            hw.highest, hw.rail_high_water, hw.account_fence, hw.ledger_fence, hw.claim_token
        ));
        let at_least = hw.highest + MARGIN;
        let moved = advance(&drill.lockdb_owner_url, at_least).await?;
        step(format!(
            "advance --at-least {at_least}: sequence {} → {}",
            moved.before, moved.after
        ));
        checks.check(
            format!(
                "the sequence is past every token a resource has seen ({} > {}) and was not lowered ({} ≥ {})",
                moved.after, hw.highest, moved.after, moved.before
            ),
            moved.after >= at_least && moved.after > hw.highest && moved.after >= moved.before,
        );
    }

    println!();
    println!("7. Batch 3 again, two executors.");
    let before = drill.fenced().await?;
    let mut running = drill.executors("executor-b3-resume", 2).await?;
    let drained = drill.drain(batch3.len(), Some(before)).await?;
    running.iter_mut().for_each(dlock_testkit::procs::Service::stop);
    let refusals = drill.fenced().await?.since(&before);
    let t3 = drill.tally(&batch3.iter().collect::<Vec<_>>()).await?;
    checks.check(
        format!(
            "payouts resume: batch 3 {} of {} POSTED, {} refusals after step 6",
            t3.posted,
            batch3.len(),
            refusals.total()
        ),
        drained && t3.posted == batch3.len() && refusals.total() == 0,
    );

    println!();
    println!("8. Ground truth: the rail's record and the books.");
    let all: Vec<&Payout> = batch1.iter().chain(&batch2).chain(&batch3).collect();
    let t = drill.tally(&all).await?;
    let balance = drill.balance_error(&all).await?;
    let report = drill.stack.reconciliation().await?;
    let clean = report["clean"] == true;
    step(format!(
        "{} of {} payouts POSTED; the rail received {} submissions, {} payouts twice, paid {} twice; balance error {balance} minor units; reconciliation {}",
        t.posted,
        all.len(),
        t.received,
        t.received_twice,
        t.paid_twice,
        if clean { "clean" } else { "BREAKS" }
    ));
    checks.check(
        format!("every payout POSTED exactly once ({} of {})", t.posted, all.len()),
        t.posted == all.len() && t.received_twice == 0 && t.paid_twice == 0,
    );
    checks.check("ledger balanced and reconciliation clean", balance == 0 && clean);

    println!();
    println!(
        "Sequence: {at_snapshot} at the snapshot, {before_restore} before the restore, {restored} after it; high-water {}.",
        hw.highest
    );
    println!(
        "Verdict: {} — {} ({:.0} s in all)",
        if checks.ok { "PASS" } else { "FAIL" },
        if checks.ok {
            "the restore rewound the sequence, the resources fenced every new grant out and nothing was paid twice; \
             after the fast-forward the payouts resumed"
        } else {
            "a check above failed (✘)"
        },
        started.elapsed().as_secs_f64()
    );
    drop(drill);
    drop(lockdb);
    drop(paydb);
    Ok(checks.ok)
}
