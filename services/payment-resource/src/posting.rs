//! The posting component: the one transaction of (a) → (b) DEBIT → (b) CREDIT → (c), and what a zero-row
//! result of each means (C1 §1.6, T-021 §4). It never retries after zero rows: every branch either
//! commits once or rolls back and reports a terminal outcome.

use std::sync::Arc;

use dlock_common::fencing::FencedOutDetails;
use dlock_common::grant::{Granted, Presented};
use dlock_common::metrics::Resource;
use futures::future::BoxFuture;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::error::PaymentError;
use crate::metrics::{Metrics, PostingOutcome, report_fenced_out};
use crate::model::{Direction, Payout, PayoutState};
use crate::repo::ledger::Leg;
use crate::repo::{account, ledger, payout};
use crate::sql::Statements;

/// Points inside the posting transaction where a [`PostingHook`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// (a) has debited and stamped the fence; no leg written yet.
    BetweenAAndB,
    /// The DEBIT leg is written; the CREDIT leg is not.
    BetweenLegs,
    /// Both legs written; (c) not yet run.
    BeforeC,
}

/// A test seam: code run inside the posting transaction, on its connection, at a [`Stage`].
/// Production never installs one.
pub trait PostingHook: Send + Sync {
    fn at<'a>(&'a self, stage: Stage, tx: &'a mut PgConnection) -> BoxFuture<'a, ()>;
}

pub use dlock_wire::payment::Posted;

#[derive(Clone)]
pub struct Posting {
    pool: PgPool,
    statements: Statements,
    metrics: Arc<Metrics>,
    hook: Option<Arc<dyn PostingHook>>,
}

impl std::fmt::Debug for Posting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Posting")
            .field("statements", &self.statements)
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}

impl Posting {
    /// `statements` is [`Statements::for_fencing`] in production; tests may pass a broken set.
    pub fn new(pool: PgPool, statements: Statements, metrics: Arc<Metrics>) -> Self {
        Self {
            pool,
            statements,
            metrics,
            hook: None,
        }
    }

    pub fn with_hook(mut self, hook: Arc<dyn PostingHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    pub fn statements(&self) -> Statements {
        self.statements
    }

    /// Posts a RAIL_ACKED payout with the caller's grant `token` (under a verified grant, only a
    /// payout of the grant's account: checked on the payout's first read, before (a)).
    pub async fn post(
        &self,
        payout_id: Uuid,
        presented: impl Into<Presented>,
    ) -> Result<Posted, PaymentError> {
        let Presented { token, granted } = presented.into();
        let result = self.run(payout_id, token.get(), granted).await;
        let outcome = match &result {
            Ok(p) if p.idempotent => Some(PostingOutcome::idempotent),
            Ok(_) => Some(PostingOutcome::posted),
            Err(PaymentError::FencedOut(_)) => Some(PostingOutcome::fenced_out),
            Err(PaymentError::InsufficientFunds { .. }) => Some(PostingOutcome::insufficient_funds),
            Err(PaymentError::NotPostable { .. }) => Some(PostingOutcome::not_postable),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            self.metrics.posting(outcome);
        }
        result
    }

    async fn run(&self, payout_id: Uuid, token: i64, granted: Granted) -> Result<Posted, PaymentError> {
        let stmts = self.statements;
        let mut tx = self.pool.begin().await?;

        // Row-lock the payout first so that two postings of one payout serialise. The same read
        // tells the payout's account: a grant for another account writes nothing.
        let p = payout::for_update(&mut tx, payout_id)
            .await?
            .ok_or(PaymentError::UnknownPayout(payout_id))?;
        if let Err(refused) = granted.check_account(p.account_id) {
            tx.rollback().await?;
            return Err(refused.into());
        }
        match p.state {
            PayoutState::RailAcked => {}
            PayoutState::Posted => {
                tx.rollback().await?;
                return self.already_posted(p).await;
            }
            state => {
                tx.rollback().await?;
                return Err(PaymentError::NotPostable { payout_id, state });
            }
        }
        let settlement = account::settlement_id(&mut *tx, &p.currency)
            .await?
            .ok_or_else(|| PaymentError::NoSettlementAccount(p.currency.clone()))?;

        // The hold the reservation made becomes the debit: give it back first, so that (a) can take the
        // amount from the balance without the hold exceeding it (account_reserved_ck). A rollback
        // below restores it.
        if p.reserved_minor > 0 {
            account::release(&mut tx, p.account_id, p.reserved_minor)
                .await?
                .ok_or(PaymentError::UnknownAccount(p.account_id))?;
            payout::clear_reservation(&mut tx, payout_id).await?;
        }

        // (a)
        let debited = account::debit(
            &mut tx,
            stmts.account_debit,
            p.account_id,
            &p.currency,
            p.amount_minor,
            token,
        )
        .await?;
        let Some(debited) = debited else {
            tx.rollback().await?;
            return Err(self.classify_refused_debit(&p, token).await?);
        };
        self.hook(Stage::BetweenAAndB, &mut tx).await;

        // (b), DEBIT then CREDIT: two statements, never collapsed, so each leg is fenced on its own.
        let legs = [
            (Direction::Debit, p.account_id, Stage::BetweenLegs),
            (Direction::Credit, settlement, Stage::BeforeC),
        ];
        for (direction, leg_account, next_stage) in legs {
            let leg = Leg {
                entry_id: Uuid::new_v4(),
                payout_id,
                account_id: leg_account,
                direction,
                amount_minor: p.amount_minor,
                token,
                fenced_account_id: p.account_id,
            };
            if ledger::insert_leg(&mut tx, stmts.ledger_leg, leg)
                .await?
                .is_none()
            {
                return Err(self.refused_leg(tx, &p, token).await?);
            }
            self.hook(next_stage, &mut tx).await;
        }

        // (c)
        if payout::mark_posted(&mut tx, stmts.payout_post, payout_id, token)
            .await?
            .is_none()
        {
            tx.rollback().await?;
            return self.refused_transition(payout_id, token).await;
        }
        let posted = payout::by_id(&mut *tx, payout_id)
            .await?
            .ok_or(PaymentError::UnknownPayout(payout_id))?;
        tx.commit().await?;
        tracing::info!(
            event = "payout_posted",
            payout_id = %payout_id,
            account_id = %p.account_id,
            amount_minor = p.amount_minor,
            token,
            balance_minor = debited.balance_minor,
        );
        Ok(Posted {
            payout: posted,
            balance_minor: debited.balance_minor,
            fence: debited.fence,
            idempotent: false,
        })
    }

    async fn hook(&self, stage: Stage, tx: &mut Transaction<'static, Postgres>) {
        if let Some(hook) = &self.hook {
            hook.at(stage, &mut *tx).await;
        }
    }

    /// Zero rows at (a), after the rollback: one diagnostic read on a fresh connection decides
    /// between fenced out and a funds rejection. No retry in either branch.
    async fn classify_refused_debit(&self, p: &Payout, token: i64) -> Result<PaymentError, PaymentError> {
        let Some(now) = account::fence_and_balance(&self.pool, p.account_id).await? else {
            return Ok(PaymentError::UnknownAccount(p.account_id));
        };
        if now.fence >= token {
            return Ok(self.fenced_out(Resource::account, p, token, now.fence));
        }
        // Not a fence: a business rejection. The payout fails (fenced by its claim like (c)); the
        // fenced-out counter is untouched so that it stays a must-be-zero signal.
        let state = match crate::payouts::end_payout(
            &self.pool,
            p.payout_id,
            PayoutState::RailAcked,
            PayoutState::Failed,
            token,
            crate::payouts::INSUFFICIENT_FUNDS,
            // Checked against this payout at the top of the posting transaction.
            Granted::Unverified,
        )
        .await?
        {
            Some(failed) => failed.state,
            None => payout::by_id(&self.pool, p.payout_id)
                .await?
                .map_or(p.state, |now| now.state),
        };
        self.metrics.funds_rejected();
        tracing::info!(
            event = "funds_rejected",
            stage = "posting",
            payout_id = %p.payout_id,
            account_id = %p.account_id,
            amount_minor = p.amount_minor,
            balance_minor = now.balance_minor,
            token,
            payout_state = %state,
        );
        Ok(PaymentError::InsufficientFunds {
            payout_id: p.payout_id,
            account_id: p.account_id,
            balance_minor: now.balance_minor,
            amount_minor: p.amount_minor,
            payout_state: state,
        })
    }

    /// Zero rows at (b): the fence moved past our token after (a). The whole transaction goes, so no
    /// partial leg set can commit.
    async fn refused_leg(
        &self,
        mut tx: Transaction<'static, Postgres>,
        p: &Payout,
        token: i64,
    ) -> Result<PaymentError, PaymentError> {
        // The fence (b) saw, read before the rollback discards the transaction's view.
        let seen = account::fence_and_balance(&mut *tx, p.account_id).await?;
        tx.rollback().await?;
        let highest = seen.map_or(token, |s| s.fence);
        Ok(self.fenced_out(Resource::ledger, p, token, highest))
    }

    /// Zero rows at (c), after the rollback: re-read the payout. Already POSTED means another holder
    /// finished the work: succeed without posting again.
    async fn refused_transition(&self, payout_id: Uuid, token: i64) -> Result<Posted, PaymentError> {
        let now = payout::by_id(&self.pool, payout_id)
            .await?
            .ok_or(PaymentError::UnknownPayout(payout_id))?;
        if now.state == PayoutState::Posted {
            return self.already_posted(now).await;
        }
        if let Some(claim) = now.claim_token
            && claim > token
        {
            return Err(self.fenced_out(Resource::payout, &now, token, claim));
        }
        Err(PaymentError::NotPostable {
            payout_id,
            state: now.state,
        })
    }

    async fn already_posted(&self, p: Payout) -> Result<Posted, PaymentError> {
        let now = account::fence_and_balance(&self.pool, p.account_id)
            .await?
            .ok_or(PaymentError::UnknownAccount(p.account_id))?;
        tracing::info!(event = "payout_already_posted", payout_id = %p.payout_id);
        Ok(Posted {
            payout: p,
            balance_minor: now.balance_minor,
            fence: now.fence,
            idempotent: true,
        })
    }

    fn fenced_out(&self, resource: Resource, p: &Payout, presented: i64, highest: i64) -> PaymentError {
        let resource_id = match resource {
            Resource::payout => p.payout_id.to_string(),
            _ => p.account_id.to_string(),
        };
        let details = FencedOutDetails {
            presented,
            highest,
            resource_type: resource_name(resource).to_owned(),
            resource_id,
            owner_id: p.claimed_by.clone().unwrap_or_default(),
        };
        report_fenced_out(
            &self.metrics,
            resource,
            &dlock_common::grant::account_key(p.account_id),
            &details,
        );
        PaymentError::FencedOut(details)
    }
}

/// The `resourceType` of a fenced-out answer, as the metric label spells it.
pub(crate) fn resource_name(resource: Resource) -> &'static str {
    match resource {
        Resource::account => "account",
        Resource::ledger => "ledger",
        Resource::payout => "payout",
        Resource::rail => "rail",
    }
}
