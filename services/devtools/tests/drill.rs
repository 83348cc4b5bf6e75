//! `dlock-dev drill restore` end to end: the built `dlock-dev` binary against real PostgreSQL 16 servers and
//! the real service processes, once as shipped and once with the fast-forward skipped (the negative
//! control: the restored sequence alone must not let the payouts resume).
//!
//! The service binaries come from the workspace build: `cargo test --workspace` builds them; for this
//! crate alone first run `cargo build --workspace --bins`.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{Run, dlock_dev};

/// A whole drill takes well under a minute once built; this only bounds a hung run.
const LIMIT: Duration = Duration::from_secs(600);

/// Each drill starts two PostgreSQL servers and a dozen processes: one at a time, so that the two
/// runs do not slow each other into their own timeouts.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn drill(extra: &[&str]) -> Run {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let args: Vec<&str> = ["drill", "restore"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    dlock_dev(&args, LIMIT)
}

/// The check line that starts with `what`, with its mark.
fn check_line<'a>(stdout: &'a str, what: &str) -> &'a str {
    stdout
        .lines()
        .map(str::trim)
        .find(|l| l.get(4..).is_some_and(|rest| rest.starts_with(what)))
        .unwrap_or_else(|| panic!("no check line {what:?} in the drill's output"))
}

fn held(stdout: &str, what: &str) -> bool {
    check_line(stdout, what).starts_with('✔')
}

#[test]
fn restore_drill_rewinds_fences_out_fast_forwards_and_resumes() {
    let run = drill(&[]);
    assert_eq!(run.code, Some(0), "the drill's verdict was not PASS");
    assert!(run.stdout.contains("Verdict: PASS"));
    for what in [
        "batch 1:",
        "batch 2:",
        "the restore rewound the sequence",
        "every new grant is fenced out",
        "batch 3 makes no progress",
        "nothing double-paid",
        "the sequence is past every token",
        "payouts resume",
        "every payout POSTED exactly once",
        "ledger balanced and reconciliation clean",
    ] {
        assert!(held(&run.stdout, what), "check {what:?} did not hold");
    }
}

#[test]
fn without_the_fast_forward_payouts_do_not_resume() {
    let run = drill(&["--skip-fast-forward"]);
    assert_eq!(
        run.code,
        Some(2),
        "skipping the fast-forward must make the drill report failure"
    );
    assert!(run.stdout.contains("Verdict: FAIL"));
    assert!(
        !held(&run.stdout, "payouts resume"),
        "the payouts resumed without the fast-forward"
    );
    // The stall is safe all the same: the resources refused the stale grants and nothing was paid
    // twice — what failed is liveness, not safety.
    for what in [
        "the restore rewound the sequence",
        "every new grant is fenced out",
        "batch 3 makes no progress",
        "nothing double-paid",
    ] {
        assert!(held(&run.stdout, what), "check {what:?} did not hold");
    }
    assert!(
        !run.stdout.contains("the sequence is past every token"),
        "the fast-forward ran although it was skipped"
    );
}
