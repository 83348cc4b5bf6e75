//! Reconciliation (FR-26): checks the accounting invariants of docs/accounting.md over one snapshot
//! and attributes every break to the grants (ledger `fence` values) that wrote the legs involved.
//! It sees the rail too: every ACKED rail submission needs a POSTED payout with its two legs, every
//! POSTED payout exactly one ACKED submission; and it reports payouts not terminal after a threshold.
//!
//! Work is bounded: accounts and payouts are read in keyset pages (`pageSize`), each page checked and
//! dropped; the report lists at most [`MAX_LISTED`] breaks of each list (the counts are complete).
//!
//! The rules are pure functions over what [`crate::repo::recon`] fetched, so they can be read and
//! unit-tested without a database.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::PaymentError;
use crate::model::{Account, AccountKind, Direction, PayoutState};
use crate::repo::recon::{self, LedgerGroup, PayoutLegs, PostedTotal};
use crate::sql;

/// Default and bounds of `stuckAfterSeconds` (defined with the configuration, which bounds the
/// periodic run's threshold the same way).
pub use crate::config::{DEFAULT_STUCK_AFTER_SECONDS, MAX_STUCK_AFTER_SECONDS};
/// Default and bounds of `pageSize`.
pub const DEFAULT_PAGE_SIZE: i64 = 500;
pub const MAX_PAGE_SIZE: i64 = 5_000;
/// At most this many breaks are listed per list (accounts, payouts); `truncated` says when more exist.
pub const MAX_LISTED: usize = 1_000;
/// The break-count key of payouts not terminal after the threshold.
pub const STUCK: &str = "STUCK";

/// How one run reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub stuck_after_seconds: i64,
    pub page_size: i64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            stuck_after_seconds: DEFAULT_STUCK_AFTER_SECONDS,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }
}

impl Options {
    /// Checked values from a request; out of range is a 400, never clamped.
    pub fn checked(stuck_after_seconds: Option<i64>, page_size: Option<i64>) -> Result<Self, PaymentError> {
        let stuck = stuck_after_seconds.unwrap_or(DEFAULT_STUCK_AFTER_SECONDS);
        if !(1..=MAX_STUCK_AFTER_SECONDS).contains(&stuck) {
            return Err(PaymentError::invalid(
                "INVALID_STUCK_AFTER",
                format!("stuckAfterSeconds must be between 1 and {MAX_STUCK_AFTER_SECONDS}, got {stuck}"),
            ));
        }
        let page = page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(1..=MAX_PAGE_SIZE).contains(&page) {
            return Err(PaymentError::invalid(
                "INVALID_LIMIT",
                format!("pageSize must be between 1 and {MAX_PAGE_SIZE}, got {page}"),
            ));
        }
        Ok(Self {
            stuck_after_seconds: stuck,
            page_size: page,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub clean: bool,
    pub accounts_checked: usize,
    pub payouts_checked: usize,
    /// Accounts with at least one break.
    pub accounts: Vec<AccountReport>,
    /// Payouts whose legs or rail attempts do not match their state, and payouts stuck.
    pub payouts: Vec<PayoutBreak>,
    /// Every break found, by kind (complete even when the lists are truncated).
    pub break_counts: BTreeMap<String, u64>,
    /// More breaks exist than the lists show.
    pub truncated: bool,
    pub stuck_after_seconds: i64,
}

impl Report {
    pub fn break_count(&self, kind: &str) -> u64 {
        self.break_counts.get(kind).copied().unwrap_or(0)
    }

    /// Adds one page's findings.
    fn absorb(&mut self, page: Report) {
        self.accounts_checked += page.accounts_checked;
        self.payouts_checked += page.payouts_checked;
        for (k, n) in page.break_counts {
            *self.break_counts.entry(k).or_default() += n;
        }
        for a in page.accounts {
            if self.accounts.len() < MAX_LISTED {
                self.accounts.push(a);
            } else {
                self.truncated = true;
            }
        }
        for p in page.payouts {
            if self.payouts.len() < MAX_LISTED {
                self.payouts.push(p);
            } else {
                self.truncated = true;
            }
        }
        self.clean = self.break_counts.values().all(|n| *n == 0);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
    /// The account's held amount (`reserved_minor`) ≠ Σ holds of its payouts in flight.
    ReservationMismatch,
}

impl AccountBreakKind {
    pub const ALL: [AccountBreakKind; 5] = [
        AccountBreakKind::BalanceMismatch,
        AccountBreakKind::FenceRegressed,
        AccountBreakKind::DuplicateGrant,
        AccountBreakKind::SettlementMismatch,
        AccountBreakKind::ReservationMismatch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AccountBreakKind::BalanceMismatch => "BALANCE_MISMATCH",
            AccountBreakKind::FenceRegressed => "FENCE_REGRESSED",
            AccountBreakKind::DuplicateGrant => "DUPLICATE_GRANT",
            AccountBreakKind::SettlementMismatch => "SETTLEMENT_MISMATCH",
            AccountBreakKind::ReservationMismatch => "RESERVATION_MISMATCH",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PayoutBreakKind {
    /// POSTED without its two legs.
    MissingLegs,
    /// POSTED with legs that are not exactly one DEBIT on its account and one CREDIT on its
    /// currency's settlement account, of its amount, by one grant.
    MalformedLegs,
    /// Not POSTED, yet legs exist.
    UnexpectedLegs,
    /// The rail acknowledged (paid) it, yet it is not POSTED and no longer on its way there
    /// (PENDING, CLAIMED, FAILED or ABANDONED): money left that the ledger does not record.
    RailPaidNotPosted,
    /// POSTED, but not exactly one ACKED rail submission: recorded as paid, not paid by the rail.
    PostedWithoutRailAck,
    /// Not terminal after the run's threshold (`stuckAfterSeconds`).
    Stuck,
}

impl PayoutBreakKind {
    pub const ALL: [PayoutBreakKind; 6] = [
        PayoutBreakKind::MissingLegs,
        PayoutBreakKind::MalformedLegs,
        PayoutBreakKind::UnexpectedLegs,
        PayoutBreakKind::RailPaidNotPosted,
        PayoutBreakKind::PostedWithoutRailAck,
        PayoutBreakKind::Stuck,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PayoutBreakKind::MissingLegs => "MISSING_LEGS",
            PayoutBreakKind::MalformedLegs => "MALFORMED_LEGS",
            PayoutBreakKind::UnexpectedLegs => "UNEXPECTED_LEGS",
            PayoutBreakKind::RailPaidNotPosted => "RAIL_PAID_NOT_POSTED",
            PayoutBreakKind::PostedWithoutRailAck => "POSTED_WITHOUT_RAIL_ACK",
            PayoutBreakKind::Stuck => STUCK,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PayoutBreak {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub state: PayoutState,
    pub kind: PayoutBreakKind,
    pub legs: i64,
    /// The grants that wrote this payout's legs (for the rail and STUCK kinds with no legs: the
    /// grant that holds its claim, if any).
    pub fences: Vec<i64>,
    /// ACKED rail submissions of this payout.
    pub acked_submissions: i64,
}

/// The name of every kind of break a report can count (the keys of `breakCounts`).
pub fn break_kinds() -> impl Iterator<Item = &'static str> {
    AccountBreakKind::ALL
        .into_iter()
        .map(AccountBreakKind::name)
        .chain(PayoutBreakKind::ALL.into_iter().map(PayoutBreakKind::name))
}

/// opening − debits + credits, or `None` on overflow.
pub fn customer_expected_balance(opening: i64, debit: i64, credit: i64) -> Option<i64> {
    opening.checked_sub(debit)?.checked_add(credit)
}

/// Runs every check with the default [`Options`].
pub async fn run(pool: &PgPool) -> Result<Report, sqlx::Error> {
    run_with(pool, &Options::default()).await
}

/// Runs every check over one REPEATABLE READ, READ ONLY snapshot, page by page.
pub async fn run_with(pool: &PgPool, options: &Options) -> Result<Report, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(sql::RECON_SNAPSHOT).execute(&mut *tx).await?;
    let posted = recon::posted_by_currency(&mut *tx).await?;
    let mut report = Report {
        clean: true,
        accounts_checked: 0,
        payouts_checked: 0,
        accounts: Vec::new(),
        payouts: Vec::new(),
        break_counts: BTreeMap::new(),
        truncated: false,
        stuck_after_seconds: options.stuck_after_seconds,
    };
    let mut after = Uuid::nil();
    loop {
        let page = recon::accounts_page(&mut *tx, after, options.page_size).await?;
        let Some(last) = page.last() else { break };
        after = last.account.account_id;
        let ids: Vec<Uuid> = page.iter().map(|r| r.account.account_id).collect();
        let groups = recon::ledger_groups(&mut *tx, &ids).await?;
        let accounts: Vec<Account> = page.iter().map(|r| r.account.clone()).collect();
        let mut found = evaluate(&accounts, &groups, &posted, &[]);
        for r in &page {
            check_holds(&mut found, r);
        }
        recount(&mut found);
        let full = i64::try_from(page.len()).is_ok_and(|n| n == options.page_size);
        report.absorb(found);
        if !full {
            break;
        }
    }
    let mut after = Uuid::nil();
    loop {
        let page =
            recon::payouts_page(&mut *tx, after, options.page_size, options.stuck_after_seconds).await?;
        let Some(last) = page.last() else { break };
        after = last.payout_id;
        let full = i64::try_from(page.len()).is_ok_and(|n| n == options.page_size);
        report.absorb(evaluate(&[], &[], &posted, &page));
        if !full {
            break;
        }
    }
    tx.commit().await?;
    if report.break_count(STUCK) > 0 {
        tracing::warn!(
            event = "payouts_stuck",
            count = report.break_count(STUCK),
            stuck_after_seconds = options.stuck_after_seconds,
            "payouts are not terminal after the threshold"
        );
    }
    Ok(report)
}

/// RESERVATION_MISMATCH: the account's held amount against the holds of its payouts.
fn check_holds(report: &mut Report, r: &recon::ReconAccount) {
    let a = &r.account;
    if a.reserved_minor == r.held_minor {
        return;
    }
    let brk = AccountBreak {
        kind: AccountBreakKind::ReservationMismatch,
        message: format!(
            "account holds {} minor units for payouts in flight, its payouts hold {}",
            a.reserved_minor, r.held_minor
        ),
        fences: Vec::new(),
        stale_fence: None,
        payout_ids: Vec::new(),
    };
    match report.accounts.iter_mut().find(|x| x.account_id == a.account_id) {
        Some(existing) => existing.breaks.push(brk),
        None => report.accounts.push(AccountReport {
            account_id: a.account_id,
            currency: a.currency.clone(),
            kind: a.kind,
            stored_balance_minor: a.balance_minor,
            expected_balance_minor: None,
            opening_balance_minor: a.opening_balance_minor,
            ledger_debit_minor: 0,
            ledger_credit_minor: 0,
            stored_fence: a.fence,
            breaks: vec![brk],
        }),
    }
}

/// Recomputes `break_counts` and `clean` from the lists (one page, before truncation).
fn recount(report: &mut Report) {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for a in &report.accounts {
        for b in &a.breaks {
            *counts.entry(b.kind.name().to_owned()).or_default() += 1;
        }
    }
    for p in &report.payouts {
        *counts.entry(p.kind.name().to_owned()).or_default() += 1;
    }
    report.clean = counts.is_empty();
    report.break_counts = counts;
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
    let payout_breaks: Vec<PayoutBreak> = payouts
        .iter()
        .flat_map(|p| [check_payout(p), check_rail(p), check_stuck(p)])
        .flatten()
        .collect();

    let mut report = Report {
        clean: true,
        accounts_checked: accounts.len(),
        payouts_checked: payouts.len(),
        accounts: account_reports,
        payouts: payout_breaks,
        break_counts: BTreeMap::new(),
        truncated: false,
        stuck_after_seconds: DEFAULT_STUCK_AFTER_SECONDS,
    };
    recount(&mut report);
    report
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
    Some(payout_break(p, kind))
}

fn payout_break(p: &PayoutLegs, kind: PayoutBreakKind) -> PayoutBreak {
    let fences = if p.fences.is_empty() {
        p.claim_token.into_iter().collect()
    } else {
        p.fences.clone()
    };
    PayoutBreak {
        payout_id: p.payout_id,
        account_id: p.account_id,
        state: p.state,
        kind,
        legs: p.legs,
        fences,
        acked_submissions: p.acked_submissions,
    }
}

/// The rail against the payout: paid but not (on its way to being) posted, or posted but not paid.
fn check_rail(p: &PayoutLegs) -> Option<PayoutBreak> {
    let kind = match p.state {
        PayoutState::Posted if p.acked_submissions != 1 => PayoutBreakKind::PostedWithoutRailAck,
        PayoutState::Pending | PayoutState::Claimed | PayoutState::Failed | PayoutState::Abandoned
            if p.acked_submissions > 0 =>
        {
            PayoutBreakKind::RailPaidNotPosted
        }
        _ => return None,
    };
    Some(payout_break(p, kind))
}

fn check_stuck(p: &PayoutLegs) -> Option<PayoutBreak> {
    p.stuck.then(|| payout_break(p, PayoutBreakKind::Stuck))
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
            reserved_minor: 0,
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

    /// A POSTED payout as reconciliation expects it: two matching legs under its claim's grant, one
    /// ACKED submission.
    fn posted_payout() -> PayoutLegs {
        PayoutLegs {
            payout_id: Uuid::new_v4(),
            account_id: Uuid::new_v4(),
            currency: "EUR".into(),
            amount_minor: 10,
            state: PayoutState::Posted,
            legs: 2,
            matching_debits: 1,
            matching_credits: 1,
            fences: vec![7],
            acked_submissions: 1,
            stuck: false,
            claim_token: Some(7),
        }
    }

    #[test]
    fn the_rail_against_the_payouts() {
        let base = posted_payout();
        assert!(evaluate(&[], &[], &[], std::slice::from_ref(&base)).clean);
        let unpaid = PayoutLegs {
            acked_submissions: 0,
            ..base.clone()
        };
        assert_eq!(
            check_rail(&unpaid).map(|b| b.kind),
            Some(PayoutBreakKind::PostedWithoutRailAck)
        );
        let paid_but_failed = PayoutLegs {
            state: PayoutState::Failed,
            legs: 0,
            fences: vec![],
            ..base.clone()
        };
        let b = check_rail(&paid_but_failed).expect("break");
        assert_eq!(b.kind, PayoutBreakKind::RailPaidNotPosted);
        assert_eq!(b.fences, vec![7], "attributed to the claim's grant");
        let in_flight = PayoutLegs {
            state: PayoutState::RailAcked,
            legs: 0,
            fences: vec![],
            ..base.clone()
        };
        assert!(check_rail(&in_flight).is_none());
        let stuck = PayoutLegs {
            stuck: true,
            ..in_flight
        };
        let r = evaluate(&[], &[], &[], &[stuck]);
        assert_eq!(r.break_count(STUCK), 1);
        assert!(!r.clean);
    }

    #[test]
    fn payout_leg_shapes() {
        let base = posted_payout();
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
