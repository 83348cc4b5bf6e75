//! Account creation (synthetic seeding / admin) and the account read with its ledger recomputed.

use sqlx::PgPool;
use uuid::Uuid;

use crate::error::PaymentError;
use crate::model::{AccountKind, AccountWithLedger};
use crate::reconcile;
use crate::repo::account;
use crate::validate;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccount {
    /// `None` picks a fresh id.
    pub account_id: Option<Uuid>,
    pub currency: String,
    pub opening_balance_minor: i64,
    pub kind: AccountKind,
}

/// An account as the API returns it (defined once, in the wire crate).
pub use dlock_wire::payment::Account as AccountView;

impl From<AccountWithLedger> for AccountView {
    fn from(r: AccountWithLedger) -> Self {
        let a = r.account;
        let (expected, consistent, posted) = match a.kind {
            AccountKind::Customer => {
                let expected = reconcile::customer_expected_balance(
                    a.opening_balance_minor,
                    r.ledger_debit_minor,
                    r.ledger_credit_minor,
                );
                (expected, expected == Some(a.balance_minor), None)
            }
            AccountKind::Settlement => {
                let consistent = r.ledger_debit_minor == 0
                    && r.ledger_credit_minor == r.posted_payouts_minor
                    && a.balance_minor == a.opening_balance_minor;
                (
                    Some(a.opening_balance_minor),
                    consistent,
                    Some(r.posted_payouts_minor),
                )
            }
        };
        AccountView {
            account_id: a.account_id,
            currency: a.currency,
            kind: a.kind,
            balance_minor: a.balance_minor,
            opening_balance_minor: a.opening_balance_minor,
            fence: a.fence,
            reserved_minor: a.reserved_minor,
            available_minor: a.balance_minor.saturating_sub(a.reserved_minor),
            ledger_debit_minor: r.ledger_debit_minor,
            ledger_credit_minor: r.ledger_credit_minor,
            expected_balance_minor: expected,
            posted_payouts_minor: posted,
            consistent,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Accounts {
    pool: PgPool,
}

impl Accounts {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    pub async fn create(&self, req: NewAccount) -> Result<AccountView, PaymentError> {
        validate::currency(&req.currency)?;
        validate::opening_balance(req.opening_balance_minor)?;
        let id = req.account_id.unwrap_or_else(Uuid::new_v4);
        let inserted =
            account::insert(&self.pool, id, &req.currency, req.opening_balance_minor, req.kind).await?;
        if inserted.is_none() {
            // ON CONFLICT DO NOTHING covers both unique rules; tell them apart by reading.
            return Err(match account::by_id(&self.pool, id).await? {
                Some(_) => PaymentError::AccountExists(id),
                None => PaymentError::SettlementExists(req.currency),
            });
        }
        tracing::info!(event = "account_created", account_id = %id, kind = req.kind.as_str());
        self.get(id).await
    }

    pub async fn get(&self, account_id: Uuid) -> Result<AccountView, PaymentError> {
        account::with_ledger(&self.pool, account_id)
            .await?
            .map(AccountView::from)
            .ok_or(PaymentError::UnknownAccount(account_id))
    }
}
