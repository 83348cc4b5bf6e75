//! The submission flow: (d), the one attempt, the one forward, the recorded outcome; and the
//! resolution of ambiguous attempts by asking the rail. The fencing token is always a parameter.

use dlock_common::FencingToken;
use dlock_common::fencing::FencedOutDetails;
use dlock_common::grant::{GrantGate, Presented};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::{Fault, RailFence};
use crate::error::ProxyError;
use crate::metrics::{Metrics, SubmissionOutcome};
use crate::rail::{Forwarded, Lookup, Rail};
use crate::sql::{self, Outcome, Payout, Submission};

/// The exit code of the `exit_after_attempt` fault.
pub const FAULT_EXIT_CODE: i32 = 75;

#[derive(Debug)]
pub struct Proxy {
    pub pool: PgPool,
    pub rail: Rail,
    pub fence: RailFence,
    /// Signed-grant verification of submissions and resolutions, and its refusal counter.
    pub grants: GrantGate,
    pub metrics: Metrics,
    /// How old an attempt the rail has never seen must be before it is abandoned.
    pub abandon_after: std::time::Duration,
    /// Fault injection (tests and demos only; off unless `--enable-fault-injection`).
    pub fault: Option<Fault>,
}

impl Proxy {
    async fn payout(&self, payout_id: Uuid) -> Result<Payout, ProxyError> {
        sql::select_payout(&self.pool, payout_id)
            .await?
            .ok_or(ProxyError::UnknownPayout(payout_id))
    }

    /// `POST /v1/submissions`. Forwards at most once per payout, and only past (d).
    ///
    /// `payout.claim_token` is deliberately not compared with `token`: it is written by
    /// payment-resource, and this enforcement point must not depend on the other one's state
    /// (C1 §1.5). The per-account mark (d) and the one-attempt index are the whole check — for a
    /// token whose grant is for this payout's account: the payout read that (d) needs anyway tells
    /// the account, and a grant for another one records nothing (before (d) could raise the mark).
    pub async fn submit(
        &self,
        payout_id: Uuid,
        presented: impl Into<Presented>,
    ) -> Result<Submission, ProxyError> {
        let Presented { token, granted } = presented.into();
        let payout = self.payout(payout_id).await?;
        granted.check_account(payout.account_id)?;
        match self.fence {
            RailFence::Enforced { statement } => self.check_high_water(statement, &payout, token).await?,
            RailFence::Disabled => {}
        }

        let Some(attempt) = sql::insert_attempt(&self.pool, &payout, token.get()).await? else {
            // An attempt exists (it may be in flight, answered, or ambiguous: never a second
            // forward), or the payout does not hold its funds reservation (never a first one).
            let existing = sql::select_attempt(&self.pool, payout_id).await?;
            let Some(existing) = existing else {
                let now = self.payout(payout_id).await?;
                self.metrics.submission(SubmissionOutcome::not_reserved);
                tracing::warn!(
                    event = "rail_submission_not_reserved",
                    payout_id = %payout_id,
                    account_id = %now.account_id,
                    presented = token.get(),
                    state = %now.state,
                    reserved_minor = now.reserved_minor,
                    "payout does not hold its funds reservation; not forwarding"
                );
                return Err(ProxyError::NotReserved {
                    payout_id,
                    state: now.state,
                });
            };
            self.metrics.submission(SubmissionOutcome::duplicate_attempt);
            tracing::warn!(
                event = "rail_attempt_exists",
                payout_id = %payout_id,
                account_id = %payout.account_id,
                presented = token.get(),
                existing_submission_id = %existing.submission_id,
                existing_outcome = existing.outcome.as_deref().unwrap_or("NULL"),
                "payout already has a rail attempt; not forwarding"
            );
            return Err(ProxyError::DuplicateAttempt(Box::new(existing)));
        };

        // Compiled only into builds with the `fault-injection` feature (never the release image).
        #[cfg(feature = "fault-injection")]
        if self.fault == Some(Fault::ExitAfterAttempt) {
            // The crash between recording the attempt and forwarding it: the attempt row is committed
            // with no outcome and the rail never hears of it.
            tracing::error!(
                event = "fault_exit_after_attempt",
                payout_id = %payout_id,
                submission_id = %attempt.submission_id,
                "fault injection: exiting after the attempt row committed, before forwarding"
            );
            std::process::exit(FAULT_EXIT_CODE);
        }
        let forwarded = self.rail.forward(&payout).await;
        let (outcome, reference) = match &forwarded {
            Forwarded::Acked { rail_reference } => (Outcome::Acked, Some(rail_reference.as_str())),
            Forwarded::Rejected { .. } => (Outcome::Rejected, None),
            Forwarded::Ambiguous { .. } => (Outcome::Timeout, None),
        };
        self.log_forwarded(&payout, token, &forwarded);
        self.metrics.submission(match outcome {
            Outcome::Acked => SubmissionOutcome::acked,
            Outcome::Rejected => SubmissionOutcome::rejected,
            Outcome::Timeout => SubmissionOutcome::timeout,
        });
        // If this write fails the attempt stays NULL: the caller sees an error, a retry gets
        // DUPLICATE_ATTEMPT, and resolve asks the rail. Nothing is ever forwarded twice.
        match sql::record_forward_outcome(&self.pool, attempt.submission_id, outcome, reference).await? {
            Some(recorded) => Ok(recorded),
            // A resolution recorded the rail's answer first; that record stands.
            None => sql::select_attempt(&self.pool, payout_id)
                .await?
                .ok_or(ProxyError::Db(sqlx::Error::RowNotFound)),
        }
    }

    /// (d) in its own transaction, together with the FENCED audit row it decides.
    async fn check_high_water(
        &self,
        statement: &'static str,
        payout: &Payout,
        token: FencingToken,
    ) -> Result<(), ProxyError> {
        let mut tx = self.pool.begin().await?;
        if sql::high_water(&mut *tx, statement, payout.account_id, token.get())
            .await?
            .is_some()
        {
            tx.commit().await?;
            return Ok(());
        }
        let highest = sql::select_high_water(&mut *tx, payout.account_id)
            .await?
            .unwrap_or(token.get());
        let fenced = sql::insert_fenced(&mut *tx, payout, token.get()).await?;
        tx.commit().await?;

        let details = FencedOutDetails {
            presented: token.get(),
            highest,
            resource_type: "rail".to_owned(),
            resource_id: payout.account_id.to_string(),
            owner_id: payout.claimed_by.clone().unwrap_or_default(),
        };
        self.metrics.fenced();
        tracing::warn!(
            event = "duplicate_rail_submission_attempted",
            payout_id = %payout.payout_id,
            account_id = %payout.account_id,
            presented = details.presented,
            highest = details.highest,
            owner_id = %details.owner_id,
            submission_id = %fenced.submission_id,
            "a token not above the rail high-water mark tried to submit; not forwarded"
        );
        Err(ProxyError::FencedOut {
            details,
            submission: Box::new(fenced),
        })
    }

    fn log_forwarded(&self, payout: &Payout, token: FencingToken, forwarded: &Forwarded) {
        match forwarded {
            Forwarded::Acked { rail_reference } => tracing::info!(
                event = "rail_submission_acked",
                payout_id = %payout.payout_id,
                account_id = %payout.account_id,
                presented = token.get(),
                rail_reference = %rail_reference
            ),
            Forwarded::Rejected { reason } => tracing::info!(
                event = "rail_submission_rejected",
                payout_id = %payout.payout_id,
                account_id = %payout.account_id,
                presented = token.get(),
                reason = %reason
            ),
            Forwarded::Ambiguous { detail } => tracing::warn!(
                event = "rail_submission_ambiguous",
                payout_id = %payout.payout_id,
                account_id = %payout.account_id,
                presented = token.get(),
                detail = %detail,
                "recorded TIMEOUT; resolve by asking the rail, never by resubmitting"
            ),
        }
    }

    /// `GET /v1/submissions/{payoutId}`: the attempt and every FENCED refusal, oldest first.
    pub async fn submissions(&self, payout_id: Uuid) -> Result<(Payout, Vec<Submission>), ProxyError> {
        let payout = self.payout(payout_id).await?;
        let rows = sql::select_submissions(&self.pool, payout_id).await?;
        Ok((payout, rows))
    }

    /// `POST /v1/submissions/{payoutId}/resolve`: records the rail's real outcome on an ambiguous
    /// or unanswered attempt. Never submits. The token is required and logged but not compared:
    /// resolving only records what the rail already did, so it cannot move money, and an executor
    /// adopting a dead holder's payout must be able to do it. Its grant must still be for the
    /// payout's account.
    pub async fn resolve(
        &self,
        payout_id: Uuid,
        presented: impl Into<Presented>,
    ) -> Result<Submission, ProxyError> {
        let Presented { token, granted } = presented.into();
        let payout = self.payout(payout_id).await?;
        granted.check_account(payout.account_id)?;
        let attempt = sql::select_attempt(&self.pool, payout_id)
            .await?
            .ok_or(ProxyError::NoAttempt(payout_id))?;
        if matches!(attempt.outcome.as_deref(), Some("ACKED" | "REJECTED")) || attempt.abandoned_at.is_some()
        {
            return Ok(attempt);
        }
        let (outcome, reference) = match self.rail.lookup(&payout.idempotency_key).await {
            Lookup::Acked { rail_reference } => (Outcome::Acked, Some(rail_reference)),
            Lookup::Rejected { .. } => (Outcome::Rejected, None),
            Lookup::Unknown => {
                // Ambiguity always ends: past the deadline, "never received" is the answer.
                if let Some(abandoned) = sql::record_abandoned(
                    &self.pool,
                    attempt.submission_id,
                    self.abandon_after.as_secs_f64(),
                )
                .await?
                {
                    self.metrics.abandoned();
                    tracing::warn!(
                        event = "rail_submission_abandoned",
                        payout_id = %payout_id,
                        account_id = %payout.account_id,
                        presented = token.get(),
                        submission_id = %abandoned.submission_id,
                        abandon_after_ms = u64::try_from(self.abandon_after.as_millis()).unwrap_or(u64::MAX),
                        "the rail never received this attempt and the deadline has passed; abandoned"
                    );
                    return Ok(abandoned);
                }
                tracing::warn!(
                    event = "rail_outcome_unknown",
                    payout_id = %payout_id,
                    presented = token.get(),
                    "the rail has no record of this payment; the attempt stays unresolved"
                );
                return Err(ProxyError::RailOutcomeUnknown(Box::new(attempt)));
            }
            Lookup::Unavailable { detail } => return Err(ProxyError::RailUnavailable(detail)),
        };
        let resolved =
            match sql::record_resolution(&self.pool, attempt.submission_id, outcome, reference.as_deref())
                .await?
            {
                Some(r) => r,
                // Resolved concurrently (or the slow forward answered): the stored answer stands.
                None => sql::select_attempt(&self.pool, payout_id)
                    .await?
                    .ok_or(ProxyError::NoAttempt(payout_id))?,
            };
        tracing::info!(
            event = "rail_submission_resolved",
            payout_id = %payout_id,
            account_id = %payout.account_id,
            presented = token.get(),
            previous_outcome = attempt.outcome.as_deref().unwrap_or("NULL"),
            outcome = resolved.outcome.as_deref().unwrap_or("NULL")
        );
        Ok(resolved)
    }

    pub async fn ready(&self) -> Result<(), ProxyError> {
        Ok(sql::ping(&self.pool).await?)
    }
}
