//! The critical section of one payout attempt: everything done while holding `account:<id>` with one
//! grant, from the claim to the last write.
//!
//! It drives the payout from whatever state it is in (C1 §1.5 state machine; DESIGN "Data flow"):
//!
//! ```text
//! PENDING ─claim→ CLAIMED ─reserve→ RAIL_SUBMITTED ─submit→ ACKED    → RAIL_ACKED ─post→ POSTED
//!                       └─(not covered)→ FAILED      ├──→ REJECTED → FAILED
//!                                                    └──→ TIMEOUT  → RAIL_AMBIGUOUS ─resolve→ ACKED / REJECTED
//!                                                              (never received, past the deadline) → ABANDONED
//! ```
//!
//! Funds before the rail: CLAIMED → RAIL_SUBMITTED is the reservation at payment-resource (the
//! account must cover the payout, under its fence); a payout the account cannot cover ends FAILED
//! there, and rail-proxy forwards only a reserved payout. Ambiguity always ends: an ambiguous
//! submission is asked about with bounded retries and backoff; rail-proxy answers "abandoned" once
//! the rail has never received it and its deadline has passed, and the payout ends ABANDONED.
//!
//! A payout found in flight (a dead or paused holder's) is adopted by the claim and resumed: a
//! RAIL_SUBMITTED payout is resumed from the attempt rail-proxy recorded, never resubmitted while one
//! exists (`rail_submission_attempt_uidx` allows one forwardable attempt per payout).
//!
//! Every write is preceded by `ensure_held()` and runs under `select!` with the handle's `lost()`, so
//! the section stops the moment the lock is lost. The one exception is fault injection: a write that
//! follows a SIGSTOP pause goes out unchecked — the pause sits between the check and the write, which
//! is the hazard the resources' fences exist for. Any `FENCED_OUT` ends the section (terminal), and
//! so does a refused grant (403 `GRANT_*`): every write carries the token with the grant lock-server
//! signed for it (`LockHandle::fence`), and a grant that is refused stays refused.

use std::future::Future;

use dlock_client::{ClientError, FencingToken, LockHandle};
use uuid::Uuid;

use crate::fault::{Faults, Step};
use crate::model::{PayoutState, RailOutcome};
use crate::resources::{PaymentApi, RailApi, is_api_error};

/// How a critical section ended, short of an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// This grant posted it.
    Posted { balance_minor: i64 },
    /// Terminally failed by this grant: the rail rejected it, or the account cannot cover it.
    Failed { reason: &'static str },
    /// Nothing left to do: it was already terminal (another holder finished it).
    AlreadyTerminal {
        state: PayoutState,
        claim_token: Option<i64>,
    },
    /// Not claimable (already terminal: another holder finished it), refused by the claim before
    /// anything was written with this grant. `message` is payment-resource's, naming the state.
    NotClaimable { message: String },
    /// The rail cannot tell yet what became of the ambiguous submission.
    Unresolved,
    /// Ended ABANDONED by this grant: the rail never received it and rail-proxy's deadline passed.
    Abandoned { reason: &'static str },
}

/// Failure reasons recorded on the payout.
pub const REASON_RAIL_REJECTED: &str = "RAIL_REJECTED";
pub const REASON_NEVER_RECEIVED: &str = "RAIL_NEVER_RECEIVED";

/// How an ambiguous submission is asked about within one critical section.
#[derive(Debug, Clone, Copy)]
pub struct ResolvePolicy {
    /// Questions per critical section (at least 1).
    pub attempts: u32,
    /// First wait between two questions; doubled each time, capped at [`MAX_RESOLVE_BACKOFF`].
    pub backoff: std::time::Duration,
}

pub const MAX_RESOLVE_BACKOFF: std::time::Duration = std::time::Duration::from_secs(5);

impl ResolvePolicy {
    /// The wait before question `n + 1` (n counts from 0).
    pub fn wait(&self, n: u32) -> std::time::Duration {
        self.backoff
            .saturating_mul(2u32.saturating_pow(n.min(16)))
            .min(MAX_RESOLVE_BACKOFF)
    }
}

impl Default for ResolvePolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            backoff: std::time::Duration::from_millis(250),
        }
    }
}

/// What the critical section needs: the two resources, the fault plan, the resolve policy.
#[derive(Debug)]
pub struct Resources {
    pub payments: PaymentApi,
    pub rail: RailApi,
    pub faults: Faults,
    pub resolve: ResolvePolicy,
}

/// One payout, one grant.
pub struct Critical<'a> {
    pub resources: &'a Resources,
    pub lock: &'a LockHandle,
    pub payout_id: Uuid,
    pub owner_id: &'a str,
}

impl Critical<'_> {
    fn token(&self) -> FencingToken {
        self.lock.token()
    }

    /// Runs `call`, abandoning it the moment the lock is lost.
    async fn guarded<T>(&self, call: impl Future<Output = Result<T, ClientError>>) -> Result<T, ClientError> {
        tokio::select! {
            biased;
            reason = self.lock.lost() => Err(self.lock.lock_lost(reason)),
            answer = call => answer,
        }
    }

    /// A write: check the lock, then (fault injection) maybe pause, then send. After a pause the
    /// write goes out as decided, unchecked and unguarded.
    async fn write<T>(
        &self,
        step: Option<Step>,
        call: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        self.lock.ensure_held()?;
        let paused = match step {
            Some(s) => self.resources.faults.at(s, self.payout_id, self.token()).await,
            None => false,
        };
        if paused {
            call.await
        } else {
            self.guarded(call).await
        }
    }

    /// Claims (or adopts) the payout with this grant and drives it as far as it goes.
    pub async fn run(&self) -> Result<Ended, ClientError> {
        let api = &self.resources.payments;
        let claimed = self
            .write(
                Some(Step::BeforeClaim),
                api.claim(self.payout_id, self.owner_id, &self.lock.fence()),
            )
            .await;
        let claimed = match claimed {
            Ok(c) => c,
            // Terminal already: another holder finished (or failed) it. Nothing was written with
            // this token, so the holder may use it for its next payout; the answer names the state.
            Err(ClientError::Api {
                status,
                code,
                message,
            }) if status.as_u16() == 409 && code == "NOT_CLAIMABLE" => {
                return Ok(Ended::NotClaimable { message });
            }
            Err(e) => return Err(e),
        };
        let state = claimed.payout.state;
        tracing::info!(
            event = if claimed.adopted { "payout_adopted" } else { "payout_claimed" },
            payout_id = %self.payout_id,
            account_id = %claimed.payout.account_id,
            fencing_token = self.token().get(),
            owner_id = self.owner_id,
            %state,
        );
        match state {
            PayoutState::Claimed => {
                // The reservation: payment-resource holds the amount only if the account covers it.
                match self
                    .transition(PayoutState::Claimed, PayoutState::RailSubmitted, None)
                    .await
                {
                    Ok(()) => self.submit().await,
                    Err(e) if is_api_error(&e, 422, "INSUFFICIENT_FUNDS") => Ok(Ended::Failed {
                        reason: "insufficient funds (refused at the reservation, before the rail)",
                    }),
                    Err(e) => Err(e),
                }
            }
            PayoutState::RailSubmitted => self.resume_submitted().await,
            PayoutState::RailAcked => self.post().await,
            PayoutState::RailAmbiguous => self.resolve().await,
            PayoutState::Posted | PayoutState::Failed | PayoutState::Abandoned => {
                Ok(Ended::AlreadyTerminal {
                    state,
                    claim_token: claimed.payout.claim_token,
                })
            }
            PayoutState::Pending => Err(ClientError::Protocol(format!(
                "payout {} is still PENDING after a successful claim",
                self.payout_id
            ))),
        }
    }

    async fn transition(
        &self,
        from: PayoutState,
        to: PayoutState,
        reason: Option<&str>,
    ) -> Result<(), ClientError> {
        let api = &self.resources.payments;
        let done = self
            .write(
                None,
                api.transition(self.payout_id, from, to, &self.lock.fence(), reason),
            )
            .await?;
        tracing::info!(
            event = "payout_transitioned",
            payout_id = %self.payout_id,
            %from,
            %to,
            fencing_token = self.token().get(),
            idempotent = done.idempotent,
        );
        Ok(())
    }

    /// RAIL_SUBMITTED → the rail, through rail-proxy's fence (d).
    async fn submit(&self) -> Result<Ended, ClientError> {
        let rail = &self.resources.rail;
        let answer = self
            .write(
                Some(Step::BeforeRailSubmit),
                rail.submit(self.payout_id, &self.lock.fence()),
            )
            .await;
        match answer {
            Ok(attempt) => {
                tracing::info!(
                    event = "rail_submitted",
                    payout_id = %self.payout_id,
                    fencing_token = self.token().get(),
                    outcome = ?attempt.outcome,
                );
                self.after_rail(attempt.outcome).await
            }
            // The payout already has its one forwardable attempt (ours, whose answer was lost, or a
            // previous holder's). Its recorded outcome decides; there is never a second forward.
            Err(e) if is_api_error(&e, 409, "DUPLICATE_ATTEMPT") => {
                tracing::warn!(
                    event = "rail_attempt_exists",
                    payout_id = %self.payout_id,
                    fencing_token = self.token().get(),
                    "rail-proxy already holds an attempt for this payout; resuming from its outcome"
                );
                let recorded = self.guarded(rail.submissions(self.payout_id)).await?;
                match recorded.attempt() {
                    Some(attempt) => self.after_rail(attempt.outcome).await,
                    None => Err(ClientError::Protocol(format!(
                        "rail-proxy answered DUPLICATE_ATTEMPT for {} but lists no attempt",
                        self.payout_id
                    ))),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// An adopted RAIL_SUBMITTED payout: the previous holder may or may not have reached the rail.
    async fn resume_submitted(&self) -> Result<Ended, ClientError> {
        let recorded = self
            .guarded(self.resources.rail.submissions(self.payout_id))
            .await?;
        match recorded.attempt() {
            // No forwardable attempt: the previous holder stopped before the rail. Submitting is
            // safe — rail_submission_attempt_uidx admits one forwardable attempt per payout.
            None => self.submit().await,
            Some(attempt) => {
                tracing::info!(
                    event = "rail_attempt_found",
                    payout_id = %self.payout_id,
                    presented_token = attempt.presented_token,
                    outcome = ?attempt.outcome,
                );
                self.after_rail(attempt.outcome).await
            }
        }
    }

    /// From RAIL_SUBMITTED, given what the rail did with the attempt.
    async fn after_rail(&self, outcome: Option<RailOutcome>) -> Result<Ended, ClientError> {
        match outcome {
            Some(RailOutcome::Acked) => {
                self.transition(PayoutState::RailSubmitted, PayoutState::RailAcked, None)
                    .await?;
                self.post().await
            }
            Some(RailOutcome::Rejected) => {
                self.transition(
                    PayoutState::RailSubmitted,
                    PayoutState::Failed,
                    Some(REASON_RAIL_REJECTED),
                )
                .await?;
                Ok(Ended::Failed {
                    reason: "rail rejected the payment",
                })
            }
            // Ambiguous (or unanswered): resolved by asking the rail, never by resubmitting.
            Some(RailOutcome::Timeout) | None => {
                self.transition(PayoutState::RailSubmitted, PayoutState::RailAmbiguous, None)
                    .await?;
                self.resolve().await
            }
            Some(RailOutcome::Fenced) => Err(ClientError::Protocol(format!(
                "the recorded attempt of {} is a FENCED refusal",
                self.payout_id
            ))),
        }
    }

    /// RAIL_AMBIGUOUS: ask the rail (via rail-proxy) what happened, up to `attempts` times with
    /// exponential backoff, holding the lock (renewed meanwhile). Paid → posted; rejected → FAILED;
    /// abandoned by rail-proxy (never received, past its deadline) → ABANDONED; still unknown →
    /// [`Ended::Unresolved`] for a later pass (the deadline guarantees an end).
    async fn resolve(&self) -> Result<Ended, ClientError> {
        let policy = self.resources.resolve;
        let mut n = 0u32;
        let attempt = loop {
            self.lock.ensure_held()?;
            let answer = self
                .guarded(self.resources.rail.resolve(self.payout_id, &self.lock.fence()))
                .await;
            let retry = match answer {
                Ok(a) => break a,
                Err(e) if is_api_error(&e, 409, "RAIL_OUTCOME_UNKNOWN") => "the rail has no record yet",
                Err(e) if is_api_error(&e, 502, "RAIL_UNAVAILABLE") => "the rail did not answer",
                Err(e) => return Err(e),
            };
            n += 1;
            if n >= policy.attempts.max(1) {
                return Ok(Ended::Unresolved);
            }
            let wait = policy.wait(n - 1);
            tracing::info!(
                event = "rail_resolve_retry",
                payout_id = %self.payout_id,
                fencing_token = self.token().get(),
                attempt = n,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                retry,
            );
            tokio::select! {
                biased;
                reason = self.lock.lost() => return Err(self.lock.lock_lost(reason)),
                _ = tokio::time::sleep(wait) => {}
            }
        };
        tracing::info!(
            event = "rail_resolved",
            payout_id = %self.payout_id,
            fencing_token = self.token().get(),
            outcome = ?attempt.outcome,
            abandoned = attempt.abandoned_at.is_some(),
        );
        if attempt.abandoned_at.is_some() {
            self.transition(
                PayoutState::RailAmbiguous,
                PayoutState::Abandoned,
                Some(REASON_NEVER_RECEIVED),
            )
            .await?;
            return Ok(Ended::Abandoned {
                reason: "the rail never received it and the deadline passed",
            });
        }
        match attempt.outcome {
            Some(RailOutcome::Acked) => {
                self.transition(PayoutState::RailAmbiguous, PayoutState::RailAcked, None)
                    .await?;
                self.post().await
            }
            Some(RailOutcome::Rejected) => {
                self.transition(
                    PayoutState::RailAmbiguous,
                    PayoutState::Failed,
                    Some(REASON_RAIL_REJECTED),
                )
                .await?;
                Ok(Ended::Failed {
                    reason: "rail rejected the payment",
                })
            }
            _ => Ok(Ended::Unresolved),
        }
    }

    /// RAIL_ACKED → POSTED: (a)(b)(c) at payment-resource with this grant's token.
    async fn post(&self) -> Result<Ended, ClientError> {
        let api = &self.resources.payments;
        let answer = self
            .write(
                Some(Step::BeforePost),
                api.post(self.payout_id, &self.lock.fence()),
            )
            .await;
        match answer {
            Ok(posted) if posted.idempotent => {
                tracing::info!(
                    event = "payout_already_posted",
                    payout_id = %self.payout_id,
                    fencing_token = self.token().get(),
                    claim_token = ?posted.payout.claim_token,
                    "payment-resource says another post already did it; nothing posted again"
                );
                Ok(Ended::AlreadyTerminal {
                    state: posted.payout.state,
                    claim_token: posted.payout.claim_token,
                })
            }
            Ok(posted) => {
                tracing::info!(
                    event = "payout_posted",
                    payout_id = %self.payout_id,
                    account_id = %posted.payout.account_id,
                    amount_minor = posted.payout.amount_minor,
                    fencing_token = self.token().get(),
                    balance_minor = posted.balance_minor,
                    fence = posted.fence,
                );
                Ok(Ended::Posted {
                    balance_minor: posted.balance_minor,
                })
            }
            // A business rejection, not a fence: payment-resource has failed the payout.
            Err(e) if is_api_error(&e, 422, "INSUFFICIENT_FUNDS") => Ok(Ended::Failed {
                reason: "insufficient funds",
            }),
            Err(e) => Err(e),
        }
    }
}
