//! The submission flow: (d), the one attempt, the one forward, the recorded outcome; and the
//! resolution of ambiguous attempts by asking the rail. The fencing token is always a parameter.

use std::time::Duration;

use dlock_common::FencingToken;
use dlock_common::fencing::FencedOutDetails;
use dlock_common::grant::{GrantGate, Presented};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::{Fault, RailFence};
use crate::error::ProxyError;
use crate::metrics::{Metrics, SubmissionOutcome};
use crate::rail::{Forwarded, Lookup, Rail};
use crate::sql::{self, AgedAttempt, Outcome, Payout, Submission};

/// The exit code of the `exit_after_attempt` fault.
pub const FAULT_EXIT_CODE: i32 = 75;

/// The attempt INSERT's own bound, from asking for a connection to its reply. When paydb's primary
/// vanishes (its pod deleted, its node lost) the connection need not break: with no RST the
/// statement's reply simply never comes, and without a bound the request would wait until the
/// executor gives up on it (its request timeout) and drops it — an attempt committed and never
/// forwarded, which resolution later abandons. Past this bound the INSERT is treated exactly as a
/// lost reply ([`reply_may_be_lost`]: it may have committed): the timed-out future is dropped, with
/// its connection (the pool takes a connection dropped mid-statement back only once a ping on it
/// answers, so a hung one is never reused), and the attempt is read back on another one. An INSERT
/// takes milliseconds on a healthy synchronous pair, so this only ends one that will not answer.
/// Dropping it does not cancel it on the server: one that is merely slow and commits after the
/// read-back found nothing is left as any lost reply's late commit is (the retry gets
/// DUPLICATE_ATTEMPT, resolution ends it; never forwarded twice).
///
/// The whole submission must answer within the executor's request timeout (10 s by default), or
/// the executor drops it and the attempt it may have recorded is never forwarded. With the
/// defaults the attempt's worst path is this bound (2 s), then the read-back ([`READ_BACK_BUDGET`],
/// 4 s), then the one forward (the rail timeout, 2 s): 8 s, leaving 2 s for the payout read and
/// (d) before it and the outcome write after it, each a round trip in the normal case. A larger
/// rail timeout or a smaller executor timeout must keep that sum inside.
pub const ATTEMPT_INSERT_TIMEOUT: Duration = Duration::from_secs(2);

/// Reading back an attempt whose INSERT lost its reply (or got none within
/// [`ATTEMPT_INSERT_TIMEOUT`]): a first read at once, then reads 50 ms apart, doubling up to 1 s
/// apart, for at most [`READ_BACK_BUDGET`] in all (each read bounded by what is left of it). A
/// failover of paydb's synchronous pair (promotion, then fresh connections) takes a second or two,
/// which this covers, on top of the time the INSERT already waited; the budget keeps the INSERT's
/// bound, the read-back and the one forward inside the executor's request timeout (the sum is
/// worked out at [`ATTEMPT_INSERT_TIMEOUT`]). Past it the answer is the 503 it was before the read-back: the
/// executor's retry finds the attempt, and resolution ends it.
pub const READ_BACK_FIRST_DELAY: Duration = Duration::from_millis(50);
pub const READ_BACK_MAX_DELAY: Duration = Duration::from_secs(1);
pub const READ_BACK_BUDGET: Duration = Duration::from_secs(4);

/// Whether a failed attempt INSERT may nonetheless have committed, its reply lost: the connection
/// broke (`Io`: the primary died or a failover cut it, as in "peer closed connection"), no reply
/// came within [`ATTEMPT_INSERT_TIMEOUT`] (`Io` of kind `TimedOut`, from [`no_reply_within`]: the
/// connection hung), or the server ended the session (SQLSTATE classes 08 and 57P: a backend
/// terminated while it waited for the synchronous standby has already committed locally). Not the
/// pool's own errors (`PoolTimedOut`, `PoolClosed`: no connection was had, so the statement never
/// left this process), not a read-only server (`25006`: refused, so not committed), not a
/// constraint or a value PostgreSQL refused (rolled back): those answer as they always did.
pub fn reply_may_be_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
    }
}

/// The error of an attempt INSERT that gave no reply within `bound`: an I/O time-out, so it is
/// read back as a lost reply ([`reply_may_be_lost`]) and, if the read-back does not settle it,
/// answered 503 like a broken connection.
pub fn no_reply_within(bound: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no reply to the attempt insert within {} ms", bound.as_millis()),
    ))
}

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

        // Bound here rather than in the statement: if the INSERT's reply is lost, this id is how
        // the row read back is recognised as this request's own.
        let submission_id = Uuid::new_v4();
        let inserted = match self.insert_attempt(&payout, token, submission_id).await {
            Ok(inserted) => inserted,
            Err(e) if reply_may_be_lost(&e) => {
                return self.after_lost_reply(&payout, token, submission_id, e).await;
            }
            Err(e) => return Err(e.into()),
        };
        let Some(attempt) = inserted else {
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
            return Err(self.duplicate_attempt(&payout, token, existing));
        };
        self.forward(&payout, token, attempt).await
    }

    /// The attempt INSERT, bounded by [`ATTEMPT_INSERT_TIMEOUT`]: no reply within it is the error
    /// [`no_reply_within`], which the caller reads back as a lost reply.
    async fn insert_attempt(
        &self,
        payout: &Payout,
        token: FencingToken,
        submission_id: Uuid,
    ) -> sqlx::Result<Option<Submission>> {
        let insert = self.insert_attempt_unbounded(payout, token, submission_id);
        // The negative control: the stalled reply awaited without the bound, as before it existed.
        #[cfg(feature = "fault-injection")]
        if self.fault == Some(Fault::StallAttemptReplyNoBound) {
            return insert.await;
        }
        match tokio::time::timeout(ATTEMPT_INSERT_TIMEOUT, insert).await {
            Ok(inserted) => inserted,
            Err(_) => {
                tracing::warn!(
                    event = "rail_attempt_insert_timed_out",
                    payout_id = %payout.payout_id,
                    account_id = %payout.account_id,
                    presented = token.get(),
                    submission_id = %submission_id,
                    timeout_ms = u64::try_from(ATTEMPT_INSERT_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
                    "no reply to the attempt insert in time; it may have committed: treating it as a lost reply"
                );
                Err(no_reply_within(ATTEMPT_INSERT_TIMEOUT))
            }
        }
    }

    /// The attempt INSERT itself, and the `lose-attempt-reply` and `stall-attempt-reply` faults.
    async fn insert_attempt_unbounded(
        &self,
        payout: &Payout,
        token: FencingToken,
        submission_id: Uuid,
    ) -> sqlx::Result<Option<Submission>> {
        // Compiled only into builds with the `fault-injection` feature (never the release image).
        #[cfg(feature = "fault-injection")]
        if let Some(
            fault @ (Fault::LoseAttemptReply
            | Fault::LoseAttemptReplyNoReadBack
            | Fault::StallAttemptReply
            | Fault::StallAttemptReplyNoBound),
        ) = self.fault
        {
            // On a connection of its own, held until the reply is given up, as a broken or hung
            // one is: the read-back cannot use it.
            let mut conn = self.pool.acquire().await?;
            let inserted = sql::insert_attempt(&mut *conn, payout, token.get(), submission_id).await?;
            // The statement ran (and committed the attempt, if it inserted one); the caller sees
            // what a connection that hangs (stall) or dies with the reply in flight (lose) gives
            // instead of its result.
            let stalls = matches!(fault, Fault::StallAttemptReply | Fault::StallAttemptReplyNoBound);
            tracing::error!(
                event = if stalls { "fault_stall_attempt_reply" } else { "fault_lose_attempt_reply" },
                payout_id = %payout.payout_id,
                submission_id = %submission_id,
                inserted = inserted.is_some(),
                "fault injection: the attempt insert ran; its reply is {}",
                if stalls { "never coming" } else { "lost" }
            );
            if stalls {
                std::future::pending::<()>().await;
            }
            return Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "fault injection: the reply of the attempt insert was lost",
            )));
        }
        sql::insert_attempt(&self.pool, payout, token.get(), submission_id).await
    }

    /// The attempt INSERT failed in a way that may have committed it (or gave no reply within
    /// [`ATTEMPT_INSERT_TIMEOUT`]). Only the request that
    /// created an attempt ever forwards it (every other one gets DUPLICATE_ATTEMPT, and resolution
    /// never submits), so if the row read back is ours and unanswered, no one else will forward
    /// it: forward it now, once, if it is young enough that no resolution can abandon it meanwhile.
    /// Anything else answers as the request would have without the read-back.
    async fn after_lost_reply(
        &self,
        payout: &Payout,
        token: FencingToken,
        submission_id: Uuid,
        error: sqlx::Error,
    ) -> Result<Submission, ProxyError> {
        tracing::warn!(
            event = "rail_attempt_reply_lost",
            payout_id = %payout.payout_id,
            account_id = %payout.account_id,
            presented = token.get(),
            submission_id = %submission_id,
            error = %error,
            "the attempt insert failed in a way that may have committed it; reading the attempt back"
        );
        // The negative control: the read-back skipped, as before it existed.
        #[cfg(feature = "fault-injection")]
        if self.fault == Some(Fault::LoseAttemptReplyNoReadBack) {
            return Err(error.into());
        }
        let (found, reads) = match self.read_back(payout.payout_id).await {
            Ok(read) => read,
            Err((last, reads)) => {
                tracing::warn!(
                    event = "rail_attempt_read_back_failed",
                    payout_id = %payout.payout_id,
                    submission_id = %submission_id,
                    reads,
                    error = %last,
                    "could not read the attempt back in time; not forwarding (a retry gets \
                     DUPLICATE_ATTEMPT if it committed, and resolution ends it)"
                );
                return Err(error.into());
            }
        };
        let Some(AgedAttempt { attempt, age_seconds }) = found else {
            tracing::warn!(
                event = "rail_attempt_not_recorded",
                payout_id = %payout.payout_id,
                submission_id = %submission_id,
                reads,
                "the attempt insert did not commit; nothing to forward"
            );
            return Err(error.into());
        };
        if attempt.submission_id != submission_id || attempt.outcome.is_some() {
            // Another request's attempt (ours did not commit), or ours already ended (only an
            // abandonment can have done that): an existing attempt, never forwarded again.
            return Err(self.duplicate_attempt(payout, token, attempt));
        }
        let max_age = self.max_forward_age();
        if age_seconds >= max_age.as_secs_f64() {
            tracing::warn!(
                event = "rail_attempt_too_old_to_forward",
                payout_id = %payout.payout_id,
                submission_id = %submission_id,
                age_ms = (age_seconds * 1000.0) as i64,
                max_age_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX),
                "our attempt committed but is too old to forward safely; resolution will end it"
            );
            return Err(error.into());
        }
        tracing::info!(
            event = "rail_attempt_read_back",
            payout_id = %payout.payout_id,
            submission_id = %submission_id,
            reads,
            age_ms = (age_seconds * 1000.0) as i64,
            "our attempt committed although its reply was lost; forwarding it"
        );
        self.forward(payout, token, attempt).await
    }

    /// [`Proxy::read_attempt`] until it answers, with backoff, within [`READ_BACK_BUDGET`].
    /// `Ok` with the number of reads; `Err` with the last error and the number of reads.
    async fn read_back(&self, payout_id: Uuid) -> Result<(Option<AgedAttempt>, u32), (String, u32)> {
        let deadline = tokio::time::Instant::now() + READ_BACK_BUDGET;
        let mut delay = READ_BACK_FIRST_DELAY;
        let mut reads = 0;
        loop {
            reads += 1;
            let read = tokio::time::timeout_at(deadline, self.read_attempt(payout_id));
            let last = match read.await {
                Ok(Ok(found)) => return Ok((found, reads)),
                // Still going away, or coming back: read again.
                Ok(Err(e)) if dlock_common::db::unavailable(&e) => e.to_string(),
                Ok(Err(e)) => return Err((e.to_string(), reads)),
                Err(_) => return Err(("no answer within the read-back budget".to_owned(), reads)),
            };
            if tokio::time::Instant::now() + delay >= deadline {
                return Err((last, reads));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(READ_BACK_MAX_DELAY);
        }
    }

    /// The attempt and its age, answered only once the reading transaction has committed: then
    /// the synchronous standby holds the attempt too ([`sql::select_attempt_age`]).
    async fn read_attempt(&self, payout_id: Uuid) -> sqlx::Result<Option<AgedAttempt>> {
        let mut tx = self.pool.begin().await?;
        let found = sql::select_attempt_age(&mut *tx, payout_id).await?;
        tx.commit().await?;
        Ok(found)
    }

    /// The oldest attempt a lost reply's read-back still forwards. A resolution abandons an
    /// attempt the rail has never seen once it is older than `abandon_after`; a forward begun at
    /// age `a` has ended by `a + rail timeout`. Requiring `a` below half of what the deadline
    /// leaves after the rail timeout means the forward ends by age (abandon_after + rail timeout)
    /// / 2, well before any abandonment: the other half is margin for what the ages do not
    /// measure — a pause of this process between the read and the forward, and, after a failover,
    /// a promoted standby's clock judging a `submitted_at` the old primary stamped. So nothing is
    /// forwarded that the ledger can record as abandoned.
    fn max_forward_age(&self) -> Duration {
        self.abandon_after.saturating_sub(self.rail.timeout()) / 2
    }

    /// An attempt exists (in flight, answered, or ambiguous): never a second forward.
    fn duplicate_attempt(&self, payout: &Payout, token: FencingToken, existing: Submission) -> ProxyError {
        self.metrics.submission(SubmissionOutcome::duplicate_attempt);
        tracing::warn!(
            event = "rail_attempt_exists",
            payout_id = %payout.payout_id,
            account_id = %payout.account_id,
            presented = token.get(),
            existing_submission_id = %existing.submission_id,
            existing_outcome = existing.outcome.as_deref().unwrap_or("NULL"),
            "payout already has a rail attempt; not forwarding"
        );
        ProxyError::DuplicateAttempt(Box::new(existing))
    }

    /// The one forward of the attempt this request created, and its recorded outcome.
    async fn forward(
        &self,
        payout: &Payout,
        token: FencingToken,
        attempt: Submission,
    ) -> Result<Submission, ProxyError> {
        let payout_id = payout.payout_id;
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
        let forwarded = self.rail.forward(payout).await;
        let (outcome, reference) = match &forwarded {
            Forwarded::Acked { rail_reference } => (Outcome::Acked, Some(rail_reference.as_str())),
            Forwarded::Rejected { .. } => (Outcome::Rejected, None),
            Forwarded::Ambiguous { .. } => (Outcome::Timeout, None),
        };
        self.log_forwarded(payout, token, &forwarded);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_connection_may_have_lost_a_committed_reply() {
        let io = |kind| sqlx::Error::Io(std::io::Error::new(kind, "gone"));
        assert!(reply_may_be_lost(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(reply_may_be_lost(&io(std::io::ErrorKind::UnexpectedEof)));
        // No connection was had: the statement never left this process.
        assert!(!reply_may_be_lost(&sqlx::Error::PoolTimedOut));
        assert!(!reply_may_be_lost(&sqlx::Error::PoolClosed));
        assert!(!reply_may_be_lost(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn no_reply_within_the_bound_is_read_back_as_a_lost_reply() {
        let e = no_reply_within(ATTEMPT_INSERT_TIMEOUT);
        assert!(reply_may_be_lost(&e), "{e}");
        // Answered 503 like a broken connection if the read-back does not settle it.
        assert!(dlock_common::db::unavailable(&e), "{e}");
        assert!(e.to_string().contains("2000 ms"), "{e}");
    }

    /// The attempt's worst path (the INSERT's bound, the read-back, the default rail timeout)
    /// stays inside the executor's default request timeout, with room for the statements around it.
    #[test]
    fn the_attempts_worst_path_fits_the_executors_request_timeout() {
        let rail_timeout = crate::Config::new("postgres://x@h/db", "http://r").rail_timeout;
        let executor_request_timeout = Duration::from_secs(10);
        let worst = ATTEMPT_INSERT_TIMEOUT + READ_BACK_BUDGET + rail_timeout;
        assert!(
            worst + Duration::from_secs(2) <= executor_request_timeout,
            "{worst:?}"
        );
    }
}
