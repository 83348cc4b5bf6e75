//! Check 1, **rail**: the rail paid every payout at most once, and paid exactly the payouts that
//! ended POSTED (rail-stub's ground truth against paydb).

use std::collections::BTreeSet;

use uuid::Uuid;

use crate::state::FinalState;

use super::ops::Index;
use super::report::{CheckResult, Violation};

pub(super) fn check_rail(state: &FinalState, ix: &Index<'_>) -> CheckResult {
    let mut c = CheckResult::new("rail", "each payout paid at most once, exactly the POSTED ones");
    let rail = &state.rail;
    c.count("rail_requests", rail.requests.len() as u64);
    c.count(
        "payouts_paid",
        rail.per_payout.values().filter(|p| p.paid > 0).count() as u64,
    );

    // Paid more than once: by the per-payout count, or listed by the stub itself.
    let mut twice: BTreeSet<Uuid> = rail
        .per_payout
        .iter()
        .filter(|(_, n)| n.paid > 1)
        .map(|(p, _)| *p)
        .collect();
    twice.extend(rail.paid_twice.iter().copied());
    for p in &twice {
        let n = rail.paid(*p);
        let keys = rail
            .per_payout
            .get(p)
            .map(|c| c.keys.join(", "))
            .unwrap_or_default();
        let mut v = Violation::new(
            "PAID_TWICE",
            format!(
                "payout {p} paid {n} times by the rail (keys: {keys}; state {})",
                ix.state_of(*p)
            ),
        )
        .payout(*p);
        if let Some(row) = ix.payouts.get(p) {
            v = v.account(row.account_id);
        }
        c.push(v);
    }
    c.count("paid_twice", twice.len() as u64);

    // Paid, but not POSTED: the money left and the books do not say so.
    for (p, n) in rail.per_payout.iter().filter(|(_, n)| n.paid > 0) {
        let posted = ix.payouts.get(p).is_some_and(|r| r.state == "POSTED");
        if !posted {
            let mut v = Violation::new(
                "PAID_NOT_RECORDED",
                format!(
                    "payout {p} paid {} time(s) by the rail but {} at the end",
                    n.paid,
                    ix.state_of(*p)
                ),
            )
            .payout(*p);
            if let Some(row) = ix.payouts.get(p) {
                v = v
                    .account(row.account_id)
                    .tokens(&row.claim_token.into_iter().collect::<Vec<_>>());
            }
            c.push(v);
            c.count("paid_not_recorded", 1);
        }
    }

    // POSTED, but the rail never paid it.
    for p in state.payouts.iter().filter(|p| p.state == "POSTED") {
        c.count("posted", 1);
        if rail.paid(p.payout_id) == 0 {
            c.push(
                Violation::new(
                    "RECORDED_NOT_PAID",
                    format!(
                        "payout {} ({} {}) is POSTED but the rail never paid it (received {})",
                        p.payout_id,
                        p.amount_minor,
                        p.currency,
                        rail.received(p.payout_id)
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id),
            );
            c.count("recorded_not_paid", 1);
        }
    }
    c.finish()
}
