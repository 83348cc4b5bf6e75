//! Reconciliation (FR-26): checks the accounting invariants of docs/accounting.md over one snapshot
//! and attributes every break to the grants (ledger `fence` values) that wrote the legs involved.
//!
//! The rules are pure functions over what [`crate::repo::recon`] fetched, so they can be read and
//! unit-tested without a database.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::model::{Account, AccountKind, Direction, PayoutState};
use crate::repo::recon::{self, LedgerGroup, PayoutLegs, PostedTotal};
use crate::sql;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub clean: bool,
    pub accounts_checked: usize,
    pub payouts_checked: usize,
    /// Accounts with at least one break.
    pub accounts: Vec<AccountReport>,
    /// Payouts whose legs do not match their state.
    pub payouts: Vec<PayoutBreak>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountReport {
    pub account_id: Uuid,
    pub currency: String,
    pub kind: AccountKind,
    pub stored_balance_minor: i64,
    pub expected_balance_minor: Option<i64>,
    pub opening_balance_minor: i64,
    pub ledger_debit_minor: i64,
    pub ledger_credit_minor: i64,
    pub stored_fence: i64,
    pub breaks: Vec<AccountBreak>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccountBreakKind {
    /// Customer: balance_minor ≠ opening − Σ DEBIT + Σ CREDIT (INV-03).
    BalanceMismatch,
    /// Customer: the stored fence is below a grant that already wrote legs here, so the grant that
    /// last set it wrote after being superseded — a stale holder (possible only without fencing).
    FenceRegressed,
    /// Customer: one grant debited the account for more than one payout; strict `<` in (a) makes
    /// that impossible, `<=` (or no fence) allows it.
    DuplicateGrant,
    /// Settlement: Σ CREDIT ≠ Σ POSTED payouts of the currency, or it was debited, or its stored
    /// balance moved.
    SettlementMismatch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountBreak {
    pub kind: AccountBreakKind,
    pub message: String,
    /// The grants (ledger `fence` values) that wrote the legs involved.
    pub fences: Vec<i64>,
    /// For FENCE_REGRESSED: the stale grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_fence: Option<i64>,
    /// Payouts whose legs are involved (for FENCE_REGRESSED: those the stale grant wrote).
    pub payout_ids: Vec<Uuid>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PayoutBreakKind {
    /// POSTED without its two legs.
    MissingLegs,
    /// POSTED with legs that are not exactly one DEBIT on its account and one CREDIT on its
    /// currency's settlement account, of its amount, by one grant.
    MalformedLegs,
    /// Not POSTED, yet legs exist.
    UnexpectedLegs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PayoutBreak {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub state: PayoutState,
    pub kind: PayoutBreakKind,
    pub legs: i64,
    /// The grants that wrote this payout's legs.
    pub fences: Vec<i64>,
}

/// opening − debits + credits, or `None` on overflow.
pub fn customer_expected_balance(opening: i64, debit: i64, credit: i64) -> Option<i64> {
    opening.checked_sub(debit)?.checked_add(credit)
}

/// Runs every check over one REPEATABLE READ, READ ONLY snapshot.
pub async fn run(pool: &PgPool) -> Result<Report, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(sql::RECON_SNAPSHOT).execute(&mut *tx).await?;
    let accounts = recon::accounts(&mut *tx).await?;
    let groups = recon::ledger_groups(&mut *tx).await?;
    let posted = recon::posted_by_currency(&mut *tx).await?;
    let payouts = recon::payout_legs(&mut *tx).await?;
    tx.commit().await?;
    Ok(evaluate(&accounts, &groups, &posted, &payouts))
}

/// The checks themselves.
pub fn evaluate(
    accounts: &[Account],
    groups: &[LedgerGroup],
    posted: &[PostedTotal],
    payouts: &[PayoutLegs],
) -> Report {
    let mut by_account: BTreeMap<Uuid, Vec<&LedgerGroup>> = BTreeMap::new();
    for g in groups {
        by_account.entry(g.account_id).or_default().push(g);
    }
    let posted: BTreeMap<&str, i64> = posted
        .iter()
        .map(|p| (p.currency.as_str(), p.amount_minor))
        .collect();

    let account_reports: Vec<AccountReport> = accounts
        .iter()
        .filter_map(|a| {
            let legs = by_account
                .get(&a.account_id)
                .map(Vec::as_slice)
                .unwrap_or_default();
            check_account(a, legs, posted.get(a.currency.as_str()).copied().unwrap_or(0))
        })
        .collect();
    let payout_breaks: Vec<PayoutBreak> = payouts.iter().filter_map(check_payout).collect();

    Report {
        clean: account_reports.is_empty() && payout_breaks.is_empty(),
        accounts_checked: accounts.len(),
        payouts_checked: payouts.len(),
        accounts: account_reports,
        payouts: payout_breaks,
    }
}

fn sum(legs: &[&LedgerGroup], direction: Direction) -> i64 {
    legs.iter()
        .filter(|g| g.direction == direction)
        .fold(0i64, |acc, g| acc.saturating_add(g.amount_minor))
}

fn fences<'a>(legs: impl IntoIterator<Item = &'a &'a LedgerGroup>) -> Vec<i64> {
    legs.into_iter()
        .map(|g| g.fence)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn payout_ids<'a>(legs: impl IntoIterator<Item = &'a &'a LedgerGroup>) -> Vec<Uuid> {
    legs.into_iter()
        .flat_map(|g| g.payout_ids.iter().copied())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn check_account(a: &Account, legs: &[&LedgerGroup], posted_in_currency: i64) -> Option<AccountReport> {
    let debit = sum(legs, Direction::Debit);
    let credit = sum(legs, Direction::Credit);
    let mut breaks = Vec::new();
    let expected = match a.kind {
        AccountKind::Customer => {
            let expected = customer_expected_balance(a.opening_balance_minor, debit, credit);
            if expected != Some(a.balance_minor) {
                breaks.push(AccountBreak {
                    kind: AccountBreakKind::BalanceMismatch,
                    message: format!(
                        "stored balance {} but opening {} - debits {} + credits {} = {}",
                        a.balance_minor,
                        a.opening_balance_minor,
                        debit,
                        credit,
                        expected.map_or_else(|| "overflow".to_owned(), |e| e.to_string())
                    ),
                    fences: fences(legs),
                    stale_fence: None,
                    payout_ids: payout_ids(legs),
                });
            }
            if let Some(highest) = legs.iter().map(|g| g.fence).max()
                && a.fence < highest
            {
                let stale: Vec<&&LedgerGroup> = legs.iter().filter(|g| g.fence == a.fence).collect();
                let involved = legs.iter().filter(|g| g.fence >= a.fence);
                breaks.push(AccountBreak {
                    kind: AccountBreakKind::FenceRegressed,
                    message: format!(
                        "stored fence {} is below grant {} that already wrote legs here: grant {} wrote after it was superseded",
                        a.fence, highest, a.fence
                    ),
                    fences: fences(involved),
                    stale_fence: Some(a.fence),
                    payout_ids: payout_ids(stale),
                });
            }
            for g in legs
                .iter()
                .filter(|g| g.direction == Direction::Debit && g.legs > 1)
            {
                breaks.push(AccountBreak {
                    kind: AccountBreakKind::DuplicateGrant,
                    message: format!("grant {} debited this account for {} payouts", g.fence, g.legs),
                    fences: vec![g.fence],
                    stale_fence: None,
                    payout_ids: g.payout_ids.clone(),
                });
            }
            expected
        }
        AccountKind::Settlement => {
            if debit != 0 || credit != posted_in_currency || a.balance_minor != a.opening_balance_minor {
                breaks.push(AccountBreak {
                    kind: AccountBreakKind::SettlementMismatch,
                    message: format!(
                        "credits {credit} vs posted payouts {posted_in_currency} in {}; debits {debit}; stored balance {} vs opening {}",
                        a.currency, a.balance_minor, a.opening_balance_minor
                    ),
                    fences: fences(legs),
                    stale_fence: None,
                    payout_ids: Vec::new(),
                });
            }
            Some(a.opening_balance_minor)
        }
    };
    if breaks.is_empty() {
        return None;
    }
    Some(AccountReport {
        account_id: a.account_id,
        currency: a.currency.clone(),
        kind: a.kind,
        stored_balance_minor: a.balance_minor,
        expected_balance_minor: expected,
        opening_balance_minor: a.opening_balance_minor,
        ledger_debit_minor: debit,
        ledger_credit_minor: credit,
        stored_fence: a.fence,
        breaks,
    })
}

fn check_payout(p: &PayoutLegs) -> Option<PayoutBreak> {
    let kind = if p.state == PayoutState::Posted {
        if p.legs == 0 {
            PayoutBreakKind::MissingLegs
        } else if p.legs == 2 && p.matching_debits == 1 && p.matching_credits == 1 && p.fences.len() == 1 {
            return None;
        } else {
            PayoutBreakKind::MalformedLegs
        }
    } else if p.legs > 0 {
        PayoutBreakKind::UnexpectedLegs
    } else {
        return None;
    };
    Some(PayoutBreak {
        payout_id: p.payout_id,
        account_id: p.account_id,
        state: p.state,
        kind,
        legs: p.legs,
        fences: p.fences.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn customer(id: Uuid, opening: i64, balance: i64, fence: i64) -> Account {
        Account {
            account_id: id,
            currency: "EUR".into(),
            kind: AccountKind::Customer,
            balance_minor: balance,
            opening_balance_minor: opening,
            fence,
        }
    }

    fn leg(account: Uuid, fence: i64, direction: Direction, amount: i64, payouts: &[Uuid]) -> LedgerGroup {
        LedgerGroup {
            account_id: account,
            fence,
            direction,
            legs: payouts.len() as i64,
            amount_minor: amount,
            payout_ids: payouts.to_vec(),
        }
    }

    #[test]
    fn consistent_customer_is_clean() {
        let a = Uuid::new_v4();
        let p = Uuid::new_v4();
        let r = evaluate(
            &[customer(a, 1000, 700, 5)],
            &[leg(a, 5, Direction::Debit, 300, &[p])],
            &[],
            &[],
        );
        assert!(r.clean, "{r:?}");
    }

    #[test]
    fn balance_mismatch_names_the_grants() {
        let a = Uuid::new_v4();
        let p = Uuid::new_v4();
        let r = evaluate(
            &[customer(a, 1000, 600, 5)],
            &[leg(a, 5, Direction::Debit, 300, &[p])],
            &[],
            &[],
        );
        assert!(!r.clean);
        let b = &r.accounts[0].breaks[0];
        assert_eq!(b.kind, AccountBreakKind::BalanceMismatch);
        assert_eq!(b.fences, vec![5]);
        assert_eq!(r.accounts[0].expected_balance_minor, Some(700));
    }

    #[test]
    fn regressed_fence_names_the_stale_grant() {
        let a = Uuid::new_v4();
        let (p1, p2) = (Uuid::new_v4(), Uuid::new_v4());
        let r = evaluate(
            &[customer(a, 1000, 500, 3)],
            &[
                leg(a, 3, Direction::Debit, 200, &[p1]),
                leg(a, 9, Direction::Debit, 300, &[p2]),
            ],
            &[],
            &[],
        );
        let b = &r.accounts[0].breaks;
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].kind, AccountBreakKind::FenceRegressed);
        assert_eq!(b[0].stale_fence, Some(3));
        assert_eq!(b[0].fences, vec![3, 9]);
        assert_eq!(b[0].payout_ids, vec![p1]);
    }

    #[test]
    fn one_grant_debiting_twice_is_a_duplicate() {
        let a = Uuid::new_v4();
        let (p1, p2) = (Uuid::new_v4(), Uuid::new_v4());
        let r = evaluate(
            &[customer(a, 1000, 500, 4)],
            &[leg(a, 4, Direction::Debit, 500, &[p1, p2])],
            &[],
            &[],
        );
        assert_eq!(r.accounts[0].breaks[0].kind, AccountBreakKind::DuplicateGrant);
    }

    #[test]
    fn payout_leg_shapes() {
        let base = PayoutLegs {
            payout_id: Uuid::new_v4(),
            account_id: Uuid::new_v4(),
            currency: "EUR".into(),
            amount_minor: 10,
            state: PayoutState::Posted,
            legs: 2,
            matching_debits: 1,
            matching_credits: 1,
            fences: vec![7],
        };
        assert!(check_payout(&base).is_none());
        let two_grants = PayoutLegs {
            fences: vec![7, 8],
            ..base.clone()
        };
        assert_eq!(
            check_payout(&two_grants).map(|b| b.kind),
            Some(PayoutBreakKind::MalformedLegs)
        );
        let none = PayoutLegs {
            legs: 0,
            matching_debits: 0,
            matching_credits: 0,
            fences: vec![],
            ..base.clone()
        };
        assert_eq!(
            check_payout(&none).map(|b| b.kind),
            Some(PayoutBreakKind::MissingLegs)
        );
        let acked = PayoutLegs {
            state: PayoutState::RailAcked,
            ..base
        };
        assert_eq!(
            check_payout(&acked).map(|b| b.kind),
            Some(PayoutBreakKind::UnexpectedLegs)
        );
    }
}
