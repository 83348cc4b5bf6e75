//! Every statement rail-proxy runs, each exactly once, and the thin functions that run them.
//!
//! rail-proxy writes only `rail_submission` and `rail_high_water` (C1 §1.5: nothing else writes
//! `rail_high_water`); it reads `payout` to learn the account, amount, currency and idempotency key.
//! The statements of a submission's happy path are public: the payout bench's floor runs exactly
//! them under pgbench (`dlock-dev bench payouts`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

/// Statement (d) of C1 §1.6, verbatim: advance the per-account high-water mark, strictly.
/// Zero rows: a token at least as high has already submitted for this account.
pub const HIGH_WATER: &str = "\
INSERT INTO rail_high_water (account_id, highest_token, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (account_id) DO UPDATE
   SET highest_token = EXCLUDED.highest_token,
       updated_at    = now()
 WHERE rail_high_water.highest_token < EXCLUDED.highest_token
RETURNING highest_token";

/// After (d) returned zero rows: the mark that refused us (for the 409 body). (d) locked the row,
/// so this reads the value that decided, or a later, higher one.
const SELECT_HIGH_WATER: &str = "SELECT highest_token FROM rail_high_water WHERE account_id = $1";

/// The payout a submission names: its account (for (d)), amount, currency and idempotency key.
pub const SELECT_PAYOUT: &str = "\
SELECT payout_id, account_id, amount_minor, currency, claimed_by, claim_token, idempotency_key,
       state, reserved_minor
  FROM payout
 WHERE payout_id = $1";

/// The audit row of a refusal by (d). Excluded from `rail_submission_attempt_uidx`, so any number
/// of them may exist beside the one forwardable attempt.
const INSERT_FENCED: &str = "\
INSERT INTO rail_submission (submission_id, payout_id, idempotency_key, presented_token, outcome, resolved_at)
VALUES ($1, $2, $3, $4, 'FENCED', now())
RETURNING submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
          submitted_at, resolved_at, abandoned_at";

/// The one forwardable attempt per payout (outcome NULL until the rail answers).
/// `rail_submission_attempt_uidx` decides: if an attempt exists, zero rows and we never forward.
/// Funds before the rail (docs/accounting.md, "Reservations"): the row is only written while the
/// payout is RAIL_SUBMITTED and holds its reservation, which payment-resource made under the
/// account's fence only if the account covered it — so zero rows also means "not reserved", and
/// nothing is forwarded. The caller tells the two apart by reading the attempt.
pub const INSERT_ATTEMPT: &str = "\
INSERT INTO rail_submission (submission_id, payout_id, idempotency_key, presented_token)
SELECT $1, p.payout_id, $3, $4
  FROM payout p
 WHERE p.payout_id = $2
   AND p.state = 'RAIL_SUBMITTED'
   AND p.reserved_minor > 0
   AND p.reserved_minor = p.amount_minor
ON CONFLICT (payout_id) WHERE outcome IS DISTINCT FROM 'FENCED' DO NOTHING
RETURNING submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
          submitted_at, resolved_at, abandoned_at";

const SELECT_ATTEMPT: &str = "\
SELECT submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
       submitted_at, resolved_at, abandoned_at
  FROM rail_submission
 WHERE payout_id = $1 AND outcome IS DISTINCT FROM 'FENCED'";

/// [`SELECT_ATTEMPT`] with the attempt's age in seconds by the database clock: read back by a
/// submission whose attempt INSERT lost its reply, which forwards its own attempt only while it is
/// young enough that no resolution can abandon it (`RECORD_ABANDONED` compares `submitted_at` with
/// the same clock).
///
/// `FOR KEY SHARE` (the weakest row lock: it blocks no update of the attempt) makes the reading
/// transaction write WAL, so its COMMIT waits for the synchronous standby like the INSERT's own
/// reply would have. An INSERT whose wait for the standby was cut short (its backend terminated in a
/// failover) is visible on the primary before it is replicated; once the reading transaction has
/// committed, the standby holds everything up to it, the attempt included, so a promotion cannot
/// lose an attempt that was then forwarded.
const SELECT_ATTEMPT_AGE: &str = "\
SELECT submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
       submitted_at, resolved_at, abandoned_at,
       extract(epoch FROM now() - submitted_at)::float8 AS age_seconds
  FROM rail_submission
 WHERE payout_id = $1 AND outcome IS DISTINCT FROM 'FENCED'
   FOR KEY SHARE";

const SELECT_SUBMISSIONS: &str = "\
SELECT submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
       submitted_at, resolved_at, abandoned_at
  FROM rail_submission
 WHERE payout_id = $1
 ORDER BY submitted_at, submission_id";

/// What the rail answered to the one forward. Only an unanswered attempt can take it, so a
/// resolution that raced ahead of a slow answer is never overwritten.
pub const RECORD_FORWARD_OUTCOME: &str = "\
UPDATE rail_submission
   SET outcome = $2, rail_reference = $3, resolved_at = now()
 WHERE submission_id = $1 AND outcome IS NULL
RETURNING submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
          submitted_at, resolved_at, abandoned_at";

/// The real outcome learned by asking the rail, for an ambiguous (TIMEOUT) or unanswered attempt.
const RECORD_RESOLUTION: &str = "\
UPDATE rail_submission
   SET outcome = $2, rail_reference = $3, resolved_at = now()
 WHERE submission_id = $1 AND (outcome IS NULL OR outcome = 'TIMEOUT')
RETURNING submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
          submitted_at, resolved_at, abandoned_at";

/// Ambiguity always ends: the rail, asked, has no record of the attempt, and the attempt is older
/// than the abandonment deadline ($2 seconds, by the database clock; longer than the rail timeout, so
/// the one forward has long ended). The attempt is resolved (TIMEOUT if it had no outcome) and marked
/// abandoned; its payout may then end ABANDONED. Never on an ACKED or REJECTED attempt.
const RECORD_ABANDONED: &str = "\
UPDATE rail_submission
   SET outcome      = COALESCE(outcome, 'TIMEOUT'),
       resolved_at  = COALESCE(resolved_at, now()),
       abandoned_at = now()
 WHERE submission_id = $1
   AND (outcome IS NULL OR outcome = 'TIMEOUT')
   AND abandoned_at IS NULL
   AND submitted_at < now() - make_interval(secs => $2)
RETURNING submission_id, payout_id, idempotency_key, presented_token, outcome, rail_reference,
          submitted_at, resolved_at, abandoned_at";

const PING: &str = "SELECT 1";

/// The payout fields rail-proxy needs. It never writes payout.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Payout {
    pub payout_id: Uuid,
    pub account_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub claimed_by: Option<String>,
    pub claim_token: Option<i64>,
    pub idempotency_key: String,
    pub state: String,
    /// The hold payment-resource made for it (V4); only a payout holding its amount is forwarded.
    pub reserved_minor: i64,
}

/// One `rail_submission` row, as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Submission {
    pub submission_id: Uuid,
    pub payout_id: Uuid,
    pub idempotency_key: String,
    pub presented_token: i64,
    /// NULL while the forward is in flight (or if we crashed mid-forward); then ACKED, REJECTED,
    /// TIMEOUT (ambiguous, resolvable) or FENCED (refused by (d), never forwarded).
    pub outcome: Option<String>,
    pub rail_reference: Option<String>,
    pub submitted_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    /// Set when the attempt was given up: the rail, asked after the deadline, had never received it.
    pub abandoned_at: Option<DateTime<Utc>>,
}

/// An attempt read back with its age by the database clock ([`SELECT_ATTEMPT_AGE`]).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AgedAttempt {
    #[sqlx(flatten)]
    pub attempt: Submission,
    /// `now() - submitted_at` in seconds; negative if a promoted standby's clock is behind the one
    /// that stamped the row.
    pub age_seconds: f64,
}

/// The outcomes rail-proxy records (`rail_outcome_ck`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Acked,
    Rejected,
    Timeout,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Acked => "ACKED",
            Outcome::Rejected => "REJECTED",
            Outcome::Timeout => "TIMEOUT",
        }
    }
}

pub async fn select_payout<'e>(db: impl PgExecutor<'e>, payout_id: Uuid) -> sqlx::Result<Option<Payout>> {
    sqlx::query_as(SELECT_PAYOUT)
        .bind(payout_id)
        .fetch_optional(db)
        .await
}

/// Runs (d). `statement` is [`HIGH_WATER`] in production; tests pass a deliberately broken
/// variant to prove the test would notice. `Some(token)` = advanced, `None` = refused.
pub async fn high_water<'e>(
    db: impl PgExecutor<'e>,
    statement: &'static str,
    account_id: Uuid,
    token: i64,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(statement)
        .bind(account_id)
        .bind(token)
        .fetch_optional(db)
        .await
}

pub async fn select_high_water<'e>(db: impl PgExecutor<'e>, account_id: Uuid) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(SELECT_HIGH_WATER)
        .bind(account_id)
        .fetch_optional(db)
        .await
}

pub async fn insert_fenced<'e>(
    db: impl PgExecutor<'e>,
    payout: &Payout,
    token: i64,
) -> sqlx::Result<Submission> {
    sqlx::query_as(INSERT_FENCED)
        .bind(Uuid::new_v4())
        .bind(payout.payout_id)
        .bind(&payout.idempotency_key)
        .bind(token)
        .fetch_one(db)
        .await
}

/// `None`: a forwardable attempt already exists for this payout (or it holds no reservation).
/// `submission_id` is the caller's, so that it can recognise the row as its own if the reply is lost.
pub async fn insert_attempt<'e>(
    db: impl PgExecutor<'e>,
    payout: &Payout,
    token: i64,
    submission_id: Uuid,
) -> sqlx::Result<Option<Submission>> {
    sqlx::query_as(INSERT_ATTEMPT)
        .bind(submission_id)
        .bind(payout.payout_id)
        .bind(&payout.idempotency_key)
        .bind(token)
        .fetch_optional(db)
        .await
}

pub async fn select_attempt<'e>(
    db: impl PgExecutor<'e>,
    payout_id: Uuid,
) -> sqlx::Result<Option<Submission>> {
    sqlx::query_as(SELECT_ATTEMPT)
        .bind(payout_id)
        .fetch_optional(db)
        .await
}

/// Run in a transaction of its own and used only once it has committed ([`SELECT_ATTEMPT_AGE`]).
pub async fn select_attempt_age<'e>(
    db: impl PgExecutor<'e>,
    payout_id: Uuid,
) -> sqlx::Result<Option<AgedAttempt>> {
    sqlx::query_as(SELECT_ATTEMPT_AGE)
        .bind(payout_id)
        .fetch_optional(db)
        .await
}

pub async fn select_submissions<'e>(
    db: impl PgExecutor<'e>,
    payout_id: Uuid,
) -> sqlx::Result<Vec<Submission>> {
    sqlx::query_as(SELECT_SUBMISSIONS)
        .bind(payout_id)
        .fetch_all(db)
        .await
}

/// `None`: the attempt was no longer unanswered (a resolution got there first).
pub async fn record_forward_outcome<'e>(
    db: impl PgExecutor<'e>,
    submission_id: Uuid,
    outcome: Outcome,
    rail_reference: Option<&str>,
) -> sqlx::Result<Option<Submission>> {
    sqlx::query_as(RECORD_FORWARD_OUTCOME)
        .bind(submission_id)
        .bind(outcome.as_str())
        .bind(rail_reference)
        .fetch_optional(db)
        .await
}

/// `None`: the attempt is already resolved (ACKED or REJECTED).
pub async fn record_resolution<'e>(
    db: impl PgExecutor<'e>,
    submission_id: Uuid,
    outcome: Outcome,
    rail_reference: Option<&str>,
) -> sqlx::Result<Option<Submission>> {
    sqlx::query_as(RECORD_RESOLUTION)
        .bind(submission_id)
        .bind(outcome.as_str())
        .bind(rail_reference)
        .fetch_optional(db)
        .await
}

/// `None`: not abandonable (resolved by the rail, already abandoned, or the deadline not yet passed).
pub async fn record_abandoned<'e>(
    db: impl PgExecutor<'e>,
    submission_id: Uuid,
    after_seconds: f64,
) -> sqlx::Result<Option<Submission>> {
    sqlx::query_as(RECORD_ABANDONED)
        .bind(submission_id)
        .bind(after_seconds)
        .fetch_optional(db)
        .await
}

pub async fn ping<'e>(db: impl PgExecutor<'e>) -> sqlx::Result<()> {
    sqlx::query(PING).execute(db).await.map(|_| ())
}
