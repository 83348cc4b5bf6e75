//! `dlock-dev demo` end to end: the built `dlock-dev` binary against real PostgreSQL 16 servers and the real
//! service processes. The product's columns must come out clean (fencing on; the lockdb failover
//! with lock-server's sequence jump), and the negative controls must show the harm their switch
//! lets through, read back from the databases and the rail (both kill switches off: the stale post
//! lands and the account's fence goes back; the failover with the jump switched off: the stale
//! holder's payout is paid and the ledger does not show it).
//!
//! The service binaries come from the workspace build: `cargo test --workspace` builds them; for this
//! crate alone first run `cargo build --workspace --bins`.

mod common;

use std::time::Duration;

use common::{Run, dlock_dev};

/// The demo takes a few minutes once built; this only bounds a hung run.
const LIMIT: Duration = Duration::from_secs(900);

fn demo() -> Run {
    dlock_dev(&["demo"], LIMIT)
}

/// The verdict of one column: the line `<label>: <VERDICT> — …` and the indented lines that
/// continue it, joined with spaces.
fn verdict(stdout: &str, label: &str) -> String {
    let prefix = format!("{label}: ");
    let mut lines = stdout.lines().skip_while(|l| {
        let l = l.trim();
        !(l.starts_with(&prefix) && l.contains(" — "))
    });
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no verdict line for {label:?} in the demo's output"));
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with("    ")))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_demo_shows_fencing_and_the_failover_and_what_each_switch_lets_through() {
    let run = demo();
    assert_eq!(run.code, Some(0), "the demo's verdict was not PASS");
    assert!(run.stdout.contains("Verdict: PASS"));

    // Payments, fencing on: the stale post refused, every payout paid and booked once.
    let on = verdict(&run.stdout, "fencing on");
    assert!(on.starts_with("fencing on: CLEAN"), "{on}");
    // Both kill switches off: the stale post lands and the record shows it.
    let off = verdict(&run.stdout, "kill switches off");
    assert!(off.starts_with("kill switches off: CORRUPTED"), "{off}");
    assert!(off.contains("FENCE_REGRESSED"), "{off}");

    // The lockdb failover, the sequence jump on: every token after it new, the stale holder refused.
    let jump = verdict(&run.stdout, "jump on");
    assert!(jump.starts_with("jump on: CLEAN"), "{jump}");
    // The jump switched off: a reissued token, the stale holder's payout paid, the ledger short.
    let no_jump = verdict(&run.stdout, "jump off");
    assert!(no_jump.starts_with("jump off: HARM"), "{no_jump}");
    assert!(no_jump.contains("LANDED"), "{no_jump}");
}
