//! The checker: reads a run's history ([`crate::history`]) and its final state ([`crate::state`])
//! and decides whether the run kept every promise the project makes.
//!
//! Six checks, each able to fail on its own:
//!
//! 1. **rail** — the rail paid every payout at most once, and paid exactly the payouts that ended
//!    POSTED (rail-stub's ground truth against paydb).
//! 2. **books** — per account, the balance is the opening balance minus the debits plus the credits
//!    and minus the posted payouts; reservations add up; every POSTED payout has its two legs and no
//!    other payout has any.
//! 3. **tokens** — every fenced resource accepted strictly increasing tokens: the ledger's fences
//!    and rail-proxy's attempts in the final state, and in the history no `ok` write after (in real
//!    time) an `ok` write with a higher token to the same resource.
//! 4. **grants** — the lock service's tokens are unique and strictly increasing across all keys,
//!    and no two sessions provably held one key at once.
//! 5. **ends** — every payout ended (POSTED, FAILED, ABANDONED), soon enough after the last fault
//!    healed, and payment-resource's own reconciliation is clean.
//! 6. **creates** — one idempotency key, one payout.
//!
//! Every check is sound: a violation is reported only when the record proves it. Indeterminate
//! operations (`info`) never count as writes, and a lower bound of the truth is used wherever the
//! history cannot see everything (unseen renews only extend a lease). The work is linear in the
//! history plus one sort per group (n log n).
//!
//! One module per check ([`rail`], [`books`], [`tokens`], [`grants`], [`ends`], [`creates`]), over
//! the paired history and the state's index ([`ops`]); the verdict and its summary are [`report`].

mod books;
mod creates;
mod ends;
mod grants;
mod ops;
mod rail;
mod report;
mod tokens;

use std::path::Path;

use anyhow::Context as _;

use crate::history::Event;
use crate::state::FinalState;

use books::check_books;
use creates::check_creates;
use ends::check_ends;
use grants::check_grants;
use ops::{Index, pair};
use rail::check_rail;
use report::summarize;
use tokens::{check_fences, check_tokens};

pub use report::{CheckResult, OpCounts, SHOWN_PER_CHECK, Summary, Verdict, Violation};

/// Payout states in which the payout holds its reservation (docs/accounting.md).
const RESERVING: [&str; 3] = ["RAIL_SUBMITTED", "RAIL_ACKED", "RAIL_AMBIGUOUS"];
/// Payout states a payout never leaves.
const TERMINAL: [&str; 3] = ["POSTED", "FAILED", "ABANDONED"];

/// Reads a history file: one [`Event`] a line (blank lines skipped).
pub fn read_history(path: &Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut events = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Event = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a history event", path.display(), n + 1))?;
        events.push(e);
    }
    Ok(events)
}

/// Reads a final-state file (one [`FinalState`] JSON document).
pub fn read_final_state(path: &Path) -> anyhow::Result<FinalState> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a final state", path.display()))
}

/// Reads both files and checks them.
pub fn check_files(history: &Path, state: &Path) -> anyhow::Result<Verdict> {
    Ok(check(&read_history(history)?, &read_final_state(state)?))
}

/// Checks a run.
pub fn check(history: &[Event], state: &FinalState) -> Verdict {
    let ops = pair(history);
    let ix = Index::new(state);
    let rail = check_rail(state, &ix);
    let books = check_books(state, &ix);
    let tokens = check_tokens(&ops, state, &ix);
    let fences = check_fences(&ops, &ix);
    let grants = check_grants(&ops, state);
    let ends = check_ends(&ops, state);
    let creates = check_creates(&ops, state);
    let mut summary = summarize(&ops, state, &rail, &books, &tokens, &grants, &ends);
    summary.stale_not_fenced = fences.violations.len() as u64;
    Verdict {
        checks: vec![rail, books, tokens, fences, grants, ends, creates],
        summary,
    }
}
