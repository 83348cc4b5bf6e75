//! Check 2, **books**: per account, the balance is the opening balance minus the debits plus the
//! credits and minus the posted payouts; reservations add up; every POSTED payout has its two legs
//! and no other payout has any.

use std::collections::HashMap;

use uuid::Uuid;

use crate::state::FinalState;

use super::RESERVING;
use super::ops::Index;
use super::report::{CheckResult, Violation};

pub(super) fn check_books(state: &FinalState, ix: &Index<'_>) -> CheckResult {
    let mut c = CheckResult::new(
        "books",
        "balance = opening - debits + credits = opening - posted; reservations; two legs per POSTED",
    );

    // Sums in i128: a sum of i64 amounts cannot overflow it, so a break is a break, not a wrap.
    #[derive(Default)]
    struct Sums {
        debit: i128,
        credit: i128,
        posted: i128,
        reserved: i128,
    }
    let mut sums: HashMap<Uuid, Sums> = HashMap::new();
    let mut posted_by_currency: HashMap<&str, i128> = HashMap::new();
    for l in &state.ledger {
        let s = sums.entry(l.account_id).or_default();
        match l.direction.as_str() {
            "DEBIT" => s.debit += i128::from(l.amount_minor),
            "CREDIT" => s.credit += i128::from(l.amount_minor),
            other => c.push(
                Violation::new(
                    "BAD_LEG",
                    format!("ledger entry {} has direction {other}", l.entry_id),
                )
                .payout(l.payout_id)
                .account(l.account_id),
            ),
        }
    }
    for p in &state.payouts {
        let s = sums.entry(p.account_id).or_default();
        if p.state == "POSTED" {
            s.posted += i128::from(p.amount_minor);
            *posted_by_currency.entry(p.currency.trim()).or_default() += i128::from(p.amount_minor);
        }
        if RESERVING.contains(&p.state.as_str()) {
            s.reserved += i128::from(p.reserved_minor);
        } else if p.reserved_minor != 0 {
            c.push(
                Violation::new(
                    "RESERVATION_LEFT",
                    format!(
                        "payout {} is {} but still holds {} reserved (token {:?})",
                        p.payout_id, p.state, p.reserved_minor, p.reserved_token
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .tokens(&p.reserved_token.into_iter().collect::<Vec<_>>()),
            );
        }
    }

    for a in &state.accounts {
        let s = sums.remove(&a.account_id).unwrap_or_default();
        let opening = i128::from(a.opening_balance_minor);
        let balance = i128::from(a.balance_minor);
        if a.kind == "SETTLEMENT" {
            c.count("settlement_accounts", 1);
            let posted = posted_by_currency
                .get(a.currency.trim())
                .copied()
                .unwrap_or_default();
            if s.credit != posted || s.debit != 0 || balance != opening {
                c.push(
                    Violation::new(
                        "SETTLEMENT_MISMATCH",
                        format!(
                            "settlement account {} ({}): credits {} vs posted payouts {}, debits {}, balance {} vs opening {}",
                            a.account_id, a.currency, s.credit, posted, s.debit, balance, opening
                        ),
                    )
                    .account(a.account_id),
                );
            }
            continue;
        }
        c.count("customer_accounts", 1);
        let by_legs = opening - s.debit + s.credit;
        if balance != by_legs {
            c.push(
                Violation::new(
                    "BALANCE_MISMATCH",
                    format!(
                        "account {}: balance {} but opening {} - debits {} + credits {} = {} (off by {})",
                        a.account_id,
                        balance,
                        opening,
                        s.debit,
                        s.credit,
                        by_legs,
                        balance - by_legs
                    ),
                )
                .account(a.account_id),
            );
        }
        let by_payouts = opening - s.posted;
        if balance != by_payouts {
            c.push(
                Violation::new(
                    "POSTED_MISMATCH",
                    format!(
                        "account {}: balance {} but opening {} - posted payouts {} = {} (off by {})",
                        a.account_id,
                        balance,
                        opening,
                        s.posted,
                        by_payouts,
                        balance - by_payouts
                    ),
                )
                .account(a.account_id),
            );
        }
        if balance < 0 {
            c.push(
                Violation::new(
                    "NEGATIVE_BALANCE",
                    format!("account {}: balance {balance}", a.account_id),
                )
                .account(a.account_id),
            );
        }
        if i128::from(a.reserved_minor) != s.reserved {
            c.push(
                Violation::new(
                    "RESERVATION_MISMATCH",
                    format!(
                        "account {}: reserved {} but its payouts in flight hold {}",
                        a.account_id, a.reserved_minor, s.reserved
                    ),
                )
                .account(a.account_id),
            );
        }
        if a.reserved_minor < 0 || a.reserved_minor > a.balance_minor {
            c.push(
                Violation::new(
                    "RESERVATION_OUT_OF_RANGE",
                    format!(
                        "account {}: reserved {} outside 0..=balance {}",
                        a.account_id, a.reserved_minor, a.balance_minor
                    ),
                )
                .account(a.account_id),
            );
        }
    }
    // Legs on accounts the state does not list.
    for (id, _) in sums.into_iter().filter(|(_, s)| s.debit != 0 || s.credit != 0) {
        c.push(
            Violation::new(
                "LEG_ON_UNKNOWN_ACCOUNT",
                format!("ledger legs on account {id}, which is not in the account table"),
            )
            .account(id),
        );
    }

    // Per payout: its legs.
    let mut legs: HashMap<Uuid, Vec<&crate::state::LedgerRow>> = HashMap::new();
    for l in &state.ledger {
        legs.entry(l.payout_id).or_default().push(l);
    }
    for p in &state.payouts {
        let mine = legs.remove(&p.payout_id).unwrap_or_default();
        let fences: Vec<i64> = mine.iter().map(|l| l.fence).collect();
        if p.state != "POSTED" {
            if !mine.is_empty() {
                c.push(
                    Violation::new(
                        "UNEXPECTED_LEGS",
                        format!(
                            "payout {} is {} but has {} ledger leg(s), fences {:?}",
                            p.payout_id,
                            p.state,
                            mine.len(),
                            fences
                        ),
                    )
                    .payout(p.payout_id)
                    .account(p.account_id)
                    .tokens(&fences),
                );
            }
            continue;
        }
        let debits: Vec<_> = mine.iter().filter(|l| l.direction == "DEBIT").collect();
        let credits: Vec<_> = mine.iter().filter(|l| l.direction == "CREDIT").collect();
        if mine.is_empty() {
            c.push(
                Violation::new(
                    "MISSING_LEGS",
                    format!("payout {} is POSTED but has no ledger legs", p.payout_id),
                )
                .payout(p.payout_id)
                .account(p.account_id),
            );
            continue;
        }
        if debits.len() > 1 {
            let f: Vec<i64> = debits.iter().map(|l| l.fence).collect();
            c.push(
                Violation::new(
                    "DOUBLE_POSTING",
                    format!(
                        "payout {} has {} DEBIT legs (fences {:?}): posted more than once",
                        p.payout_id,
                        debits.len(),
                        f
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .tokens(&f),
            );
            continue;
        }
        let settlement = ix
            .settlement
            .get(p.currency.trim())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let well_formed = mine.len() == 2
            && debits.len() == 1
            && credits.len() == 1
            && debits[0].account_id == p.account_id
            && settlement.contains(&credits[0].account_id)
            && debits[0].amount_minor == p.amount_minor
            && credits[0].amount_minor == p.amount_minor
            && debits[0].fence == credits[0].fence;
        if !well_formed {
            let shape: Vec<String> = mine
                .iter()
                .map(|l| {
                    format!(
                        "{} {} on {} fence {}",
                        l.direction, l.amount_minor, l.account_id, l.fence
                    )
                })
                .collect();
            c.push(
                Violation::new(
                    "MALFORMED_LEGS",
                    format!(
                        "payout {} (POSTED, {} {} from {}): legs [{}], want one DEBIT on the account and one CREDIT on the {} settlement account, same amount, same fence",
                        p.payout_id,
                        p.amount_minor,
                        p.currency,
                        p.account_id,
                        shape.join("; "),
                        p.currency
                    ),
                )
                .payout(p.payout_id)
                .account(p.account_id)
                .tokens(&fences),
            );
        }
    }
    for (p, l) in legs {
        c.push(
            Violation::new(
                "LEG_FOR_UNKNOWN_PAYOUT",
                format!(
                    "{} ledger leg(s) for payout {p}, which is not in the payout table",
                    l.len()
                ),
            )
            .payout(p),
        );
    }
    c.count("ledger_legs", state.ledger.len() as u64);
    c.finish()
}
