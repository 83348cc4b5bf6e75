//! Check 5, **ends**: every payout ended (POSTED, FAILED, ABANDONED), soon enough after the last
//! fault healed, and payment-resource's own reconciliation is clean.

use std::collections::HashMap;

use uuid::Uuid;

use crate::history::F;
use crate::state::FinalState;

use super::TERMINAL;
use super::ops::{Op, secs};
use super::report::{CheckResult, Violation};

pub(super) fn check_ends(ops: &[Op<'_>], state: &FinalState) -> CheckResult {
    let mut c = CheckResult::new(
        "ends",
        "every payout ended, in time after the last heal; reconciliation clean",
    );
    for p in &state.payouts {
        if TERMINAL.contains(&p.state.as_str()) {
            continue;
        }
        c.count("stuck", 1);
        c.push(
            Violation::new(
                "STUCK",
                format!(
                    "payout {} ({} {}, account {}) is {} at the end: reserved {}, claim token {}",
                    p.payout_id,
                    p.amount_minor,
                    p.currency,
                    p.account_id,
                    p.state,
                    p.reserved_minor,
                    p.claim_token.map_or("none".to_owned(), |t| t.to_string())
                ),
            )
            .payout(p.payout_id)
            .account(p.account_id)
            .tokens(&p.claim_token.into_iter().collect::<Vec<_>>()),
        );
    }

    // Slow to end: a terminal payout's last accepted write is due within the settle bound after
    // the last heal — or after it was created, for one created later than that.
    let mut created: HashMap<Uuid, u64> = HashMap::new();
    let mut last_write: HashMap<Uuid, u64> = HashMap::new();
    for o in ops {
        match o.f {
            F::Create => {
                if let (Some(p), Some(inv)) = (o.answered(|v| v.payout), o.invoke) {
                    let e = created.entry(p).or_insert(inv.time_ns);
                    *e = (*e).min(inv.time_ns);
                }
            }
            F::Claim | F::Transition | F::Post | F::Submit | F::Resolve if o.is_ok() => {
                if let Some(p) = o.asked(|v| v.payout) {
                    let e = last_write.entry(p).or_insert(0);
                    *e = (*e).max(o.end());
                }
            }
            _ => {}
        }
    }
    let run = &state.run;
    for p in state
        .payouts
        .iter()
        .filter(|p| TERMINAL.contains(&p.state.as_str()))
    {
        let Some(&last) = last_write.get(&p.payout_id) else {
            continue;
        };
        let from = run
            .last_heal_ns
            .max(created.get(&p.payout_id).copied().unwrap_or(0));
        let due = from.saturating_add(run.settle_bound_ns);
        if last > due {
            c.count("slow", 1);
            c.push(
                Violation::new(
                    "SLOW_TO_END",
                    format!(
                        "payout {} ended {} with its last write at {}, after {} (= {} + settle bound {})",
                        p.payout_id,
                        p.state,
                        secs(last),
                        secs(due),
                        secs(from),
                        secs(run.settle_bound_ns)
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .times(&[last, due]),
            );
        }
    }

    let r = &state.reconciliation;
    if r.get("clean").and_then(serde_json::Value::as_bool) != Some(true) {
        c.push(Violation::new(
            "RECONCILIATION_NOT_CLEAN",
            format!("payment-resource's reconciliation is not clean: {}", brief(r)),
        ));
    }
    c.finish()
}

/// The reconciliation report in a line: its break counts and the start of each non-empty list.
pub(super) fn brief(r: &serde_json::Value) -> String {
    const MAX: usize = 300;
    let mut parts = Vec::new();
    if let Some(counts) = r.get("breakCounts") {
        parts.push(format!("breakCounts {counts}"));
    }
    if let Some(obj) = r.as_object() {
        for (k, v) in obj {
            if let Some(list) = v.as_array()
                && !list.is_empty()
            {
                let mut text = serde_json::Value::Array(list.clone()).to_string();
                if text.len() > MAX {
                    let cut = (0..=MAX).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                    text.truncate(cut);
                    text.push('…');
                }
                parts.push(format!("{k} ({}): {text}", list.len()));
            }
        }
    }
    if parts.is_empty() {
        let mut text = r.to_string();
        if text.len() > MAX {
            let cut = (0..=MAX).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            text.truncate(cut);
            text.push('…');
        }
        parts.push(text);
    }
    parts.join("; ")
}
