//! Short fault campaigns in the test command, on both backends: with a fixed seed (the same
//! schedule every run) and with a fresh seed (printed, so a failure can be replayed with
//! `dlock chaos --seed N`), plus the campaign's positive controls — a campaign that cannot fail
//! proves nothing. The full campaign is `scripts/chaos.sh` (docs/reliability.md).
//!
//! Each run is the whole stack as real processes (two PostgreSQL 16 servers or PostgreSQL + a
//! three-member etcd, two lock-servers, payment-resource, rail-proxy, rail-stub, three executors);
//! the runs take turns (one stack at a time on a two-core machine).

use std::time::Duration;

use dlock_chaos::nemesis::Nemesis;
use dlock_chaos::run::{Options, Outcome, run};
use dlock_testkit::stack::LockBackend;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const FIXED_SEED: u64 = 20_261_201;

fn options(backend: LockBackend, seed: u64, label: &str) -> Options {
    let dir = std::env::temp_dir().join(format!("dlock-chaos-test-{}-{label}-{seed}", std::process::id()));
    let mut o = Options::new(backend, dir);
    o.seed = seed;
    o.payouts = 150;
    o.seconds = 20;
    o.accounts = 12;
    o.settle = Duration::from_secs(45);
    o.progress = false;
    o
}

async fn campaign(o: Options) -> Outcome {
    println!(
        "campaign: backend {} seed {} nemeses {:?} (replay: dlock chaos --backend {} --seed {} --payouts {} --seconds {})",
        o.backend, o.seed, o.nemeses, o.backend, o.seed, o.payouts, o.seconds
    );
    let outcome = match run(&o).await {
        Ok(out) => out,
        Err(e) => panic!(
            "the campaign could not run: {e:#} (its files: {})",
            o.dir.display()
        ),
    };
    println!("{}", outcome.verdict);
    println!("{}", dlock_chaos::report::row(&outcome));
    outcome
}

fn clean_up(o: &Outcome) {
    if o.verdict.ok() {
        let _ = std::fs::remove_dir_all(&o.dir);
    }
}

/// Every check holds, and the run really was under fire: faults ran, payouts posted.
fn assert_clean(o: &Outcome) {
    assert!(
        o.verdict.ok(),
        "checks failed: {:?}; files in {}",
        o.verdict.failed(),
        o.dir.display()
    );
    assert!(!o.state.run.faults.is_empty(), "no fault ran");
    assert!(o.verdict.summary.payouts_posted > 0, "nothing posted");
    assert_eq!(o.verdict.summary.double_payments, 0);
    assert_eq!(o.verdict.summary.stuck_payouts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_seed_on_postgres() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let o = campaign(options(LockBackend::Postgres, FIXED_SEED, "pg")).await;
    assert_clean(&o);
    clean_up(&o);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_seed_on_etcd() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let o = campaign(options(LockBackend::Etcd, FIXED_SEED, "etcd")).await;
    assert_clean(&o);
    clean_up(&o);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fresh_seed_on_both_backends() {
    let _turn = ONE_AT_A_TIME.lock().await;
    for backend in [LockBackend::Postgres, LockBackend::Etcd] {
        let seed: u64 = rand::random::<u32>().into();
        let o = campaign(options(backend, seed, "fresh")).await;
        assert_clean(&o);
        clean_up(&o);
    }
}

/// Positive control: with both kill switches off, stale holders' writes are no longer refused by a
/// fence — the campaign must see it: money moved twice, tokens accepted out of order, or (where
/// C1's unique indexes and state predicates stop the duplicate) each stale write named with what
/// stopped it. And no fence may have refused a stale token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_kill_switches_off_is_caught() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut o = options(LockBackend::Postgres, FIXED_SEED, "unfenced");
    o.payment_fencing = false;
    o.rail_fencing = false;
    // Pauses past the lease (in the gap, too) and late deliveries on few accounts: the classic
    // fencing cases, often.
    o.nemeses = vec![Nemesis::Pause, Nemesis::Partition];
    o.accounts = 4;
    o.payouts = 300;
    o.seconds = 30;
    let out = campaign(o).await;
    assert!(
        !out.verdict.ok(),
        "with the kill switches off the campaign found nothing: it cannot fail"
    );
    let s = &out.verdict.summary;
    assert!(
        s.double_payments > 0 || s.ledger_breaks > 0 || s.non_monotone_tokens > 0 || s.stale_not_fenced > 0,
        "failed, but not for fencing: {:?}",
        out.verdict.failed()
    );
    let refused_by_fence: u64 = ["account", "ledger", "rail"]
        .iter()
        .map(|r| s.fenced_out_by_resource.get(*r).copied().unwrap_or(0))
        .sum();
    assert_eq!(
        refused_by_fence, 0,
        "a fence refused a token with the kill switches off"
    );
    let _ = std::fs::remove_dir_all(&out.dir);
}

/// Positive control: lockdb's sequence rewound mid-run without the fast-forward (a restore done
/// wrong) shows up as grants whose tokens go backwards and as fenced-out writes — never as money
/// lost: nothing paid twice, the books exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_rewound_sequence_is_caught_and_loses_no_money() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut o = options(LockBackend::Postgres, FIXED_SEED, "rewind");
    o.rewind_sequence = true;
    o.nemeses = vec![Nemesis::Pause, Nemesis::Kill];
    o.settle = Duration::from_secs(15);
    let out = campaign(o).await;
    assert!(!out.verdict.ok(), "a rewound sequence went unnoticed");
    assert!(
        out.verdict.failed().contains(&"grants"),
        "the rewind was not seen in the grants: {:?}",
        out.verdict.failed()
    );
    let s = &out.verdict.summary;
    let refused: u64 = s.fenced_out_by_resource.values().sum();
    assert!(refused > 0, "no stale token was refused after the rewind");
    assert_eq!(s.double_payments, 0, "money paid twice");
    assert_eq!(s.ledger_breaks, 0, "the books broke");
    let rail = out.verdict.check("rail").map(|c| c.passed);
    assert_eq!(rail, Some(true), "the rail check failed: money lost");
    let _ = std::fs::remove_dir_all(&out.dir);
}
