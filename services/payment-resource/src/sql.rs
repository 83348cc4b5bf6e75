//! Every paydb statement of payment-resource, each exactly once.
//!
//! Statements (a), (b), (c) are C1 §1.6's, bound positionally (sqlx has no named parameters); each
//! comes in two variants, [`Statements::FENCED`] (the contract) and [`Statements::UNFENCED`] (the
//! `payment.fencing.enabled=false` kill switch: the same statement without its fence predicate). The
//! variant is chosen once, at the repository boundary, from [`crate::config::Fencing`]; tests may
//! build a deliberately broken set to prove that the safety tests can fail (negative controls).
//!
//! This service never reads or writes rail-proxy's high-water table: that is rail-proxy's enforcement point, and
//! the two must stay independent (C1 §1.5).

use crate::config::Fencing;

/// The column list every payout read returns (matches [`crate::model::Payout`]).
macro_rules! payout_columns {
    () => {
        "payout_id, account_id, amount_minor, currency, state, claimed_by, claim_token, \
         idempotency_key, attempt_count, created_at, updated_at, reserved_minor, reserved_token, \
         failure_reason"
    };
}

/// The column list every account read returns (matches [`crate::model::Account`]).
macro_rules! account_columns {
    () => {
        "account_id, currency, kind, balance_minor, opening_balance_minor, fence, reserved_minor"
    };
}

// ---------------------------------------------------------------------------------------------
// (a) account: debit and advance the fence in one statement.
// $1 account_id, $2 currency, $3 amount_minor, $4 token. Strict `<`: an equal token loses.

const ACCOUNT_DEBIT_FENCED: &str = "
UPDATE account
   SET balance_minor = balance_minor - $3,
       fence         = $4,
       updated_at    = now()
 WHERE account_id    = $1
   AND currency      = $2
   AND fence         < $4
   AND balance_minor >= $3
RETURNING balance_minor, fence";

const ACCOUNT_DEBIT_UNFENCED: &str = "
UPDATE account
   SET balance_minor = balance_minor - $3,
       fence         = $4,
       updated_at    = now()
 WHERE account_id    = $1
   AND currency      = $2
   AND balance_minor >= $3
RETURNING balance_minor, fence";

// (b) ledger leg: only postable while the debited account's fence is at or below our token, i.e. (a)
// stamped it and nobody has moved it since. `<=`, not `<`: (a) already wrote our own token.
// $1 entry_id, $2 payout_id, $3 the leg's account, $4 direction, $5 amount_minor, $6 token,
// $7 the fenced (debited) account. C1 writes the leg onto the fenced account itself (`a.account_id`);
// our CREDIT leg goes to the settlement account (docs/accounting.md), so the leg's account is bound
// separately while the fence predicate still reads the debited account. For the DEBIT leg $3 = $7
// and the statement is C1's.

const LEDGER_LEG_FENCED: &str = "
INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence)
SELECT $1, $2, $3, $4, $5, $6
  FROM account a
 WHERE a.account_id = $7
   AND a.fence     <= $6
RETURNING entry_id";

const LEDGER_LEG_UNFENCED: &str = "
INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence)
SELECT $1, $2, $3, $4, $5, $6
  FROM account a
 WHERE a.account_id = $7
RETURNING entry_id";

// (c) payout transition, same transaction, still fenced. $1 payout_id, $2 token.

const PAYOUT_POST_FENCED: &str = "
UPDATE payout
   SET state = 'POSTED', updated_at = now()
 WHERE payout_id = $1 AND state = 'RAIL_ACKED' AND claim_token <= $2
RETURNING state";

// The token is still bound (both variants take the same parameters) but unused here.
const PAYOUT_POST_UNFENCED: &str = "
UPDATE payout
   SET state = 'POSTED', updated_at = now()
 WHERE payout_id = $1 AND state = 'RAIL_ACKED'
RETURNING state";

// (r) the reservation (V4, docs/accounting.md "Reservations"): entering RAIL_SUBMITTED holds the
// payout's amount against the account, only while the account covers it and only for a grant that
// has not been superseded on the account. `<=`, not `<`: the reservation does not advance the fence
// (that is (a)'s job, strictly), so the grant that will post with this token must still pass it.
// $1 account_id, $2 currency, $3 amount_minor, $4 token.

const ACCOUNT_RESERVE_FENCED: &str = "
UPDATE account
   SET reserved_minor = reserved_minor + $3,
       updated_at     = now()
 WHERE account_id                    = $1
   AND currency                      = $2
   AND fence                        <= $4
   AND balance_minor - reserved_minor >= $3
RETURNING balance_minor, reserved_minor, fence";

// The kill switch drops the fence predicate only; the funds predicate is not fencing and stays.
const ACCOUNT_RESERVE_UNFENCED: &str = "
UPDATE account
   SET reserved_minor = reserved_minor + $3,
       updated_at     = now()
 WHERE account_id                    = $1
   AND currency                      = $2
   AND balance_minor - reserved_minor >= $3
RETURNING balance_minor, reserved_minor, fence";

/// The statement set the posting component runs for (a), (b) and (c), and the reservation (r).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statements {
    pub account_debit: &'static str,
    pub ledger_leg: &'static str,
    pub payout_post: &'static str,
    pub account_reserve: &'static str,
}

impl Statements {
    /// C1 §1.6, `payment.fencing.enabled=true`.
    pub const FENCED: Statements = Statements {
        account_debit: ACCOUNT_DEBIT_FENCED,
        ledger_leg: LEDGER_LEG_FENCED,
        payout_post: PAYOUT_POST_FENCED,
        account_reserve: ACCOUNT_RESERVE_FENCED,
    };

    /// The kill switch: the same statements without their fence predicates (never a sentinel token).
    pub const UNFENCED: Statements = Statements {
        account_debit: ACCOUNT_DEBIT_UNFENCED,
        ledger_leg: LEDGER_LEG_UNFENCED,
        payout_post: PAYOUT_POST_UNFENCED,
        account_reserve: ACCOUNT_RESERVE_UNFENCED,
    };

    pub fn for_fencing(fencing: Fencing) -> Statements {
        match fencing {
            Fencing::Enabled => Statements::FENCED,
            Fencing::Disabled => Statements::UNFENCED,
        }
    }
}

/// Gives a payout's hold back to its account: on posting (just before (a) turns it into the debit), and
/// when the payout ends FAILED or ABANDONED. $1 account_id, $2 the payout's reserved_minor.
pub const ACCOUNT_RELEASE: &str = "
UPDATE account
   SET reserved_minor = reserved_minor - $2,
       updated_at     = now()
 WHERE account_id = $1
RETURNING reserved_minor";

/// The diagnostic read that classifies a zero-row (a); run after the rollback, on a fresh
/// transaction. $1 account_id.
pub const ACCOUNT_FENCE_AND_BALANCE: &str = "SELECT fence, balance_minor FROM account WHERE account_id = $1";

// ---------------------------------------------------------------------------------------------
// accounts

/// $1 account_id, $2 currency, $3 opening balance (also the initial balance), $4 kind. Any unique
/// conflict (the id, or a second settlement account for the currency) returns zero rows.
pub const ACCOUNT_INSERT: &str = concat!(
    "INSERT INTO account (account_id, currency, balance_minor, opening_balance_minor, kind)
VALUES ($1, $2, $3, $3, $4)
ON CONFLICT DO NOTHING
RETURNING ",
    account_columns!()
);

pub const ACCOUNT_BY_ID: &str = concat!(
    "SELECT ",
    account_columns!(),
    " FROM account WHERE account_id = $1"
);

/// The account plus its ledger recomputed from `ledger_entry`. The posted-payout sum only matters for
/// a SETTLEMENT account (its credits must equal it), so the CASE skips that scan for customers.
pub const ACCOUNT_WITH_LEDGER: &str = "
SELECT a.account_id, a.currency, a.kind, a.balance_minor, a.opening_balance_minor, a.fence,
       a.reserved_minor,
       COALESCE((SELECT SUM(l.amount_minor) FROM ledger_entry l
                  WHERE l.account_id = a.account_id AND l.direction = 'DEBIT'), 0)::BIGINT
           AS ledger_debit_minor,
       COALESCE((SELECT SUM(l.amount_minor) FROM ledger_entry l
                  WHERE l.account_id = a.account_id AND l.direction = 'CREDIT'), 0)::BIGINT
           AS ledger_credit_minor,
       CASE WHEN a.kind = 'SETTLEMENT'
            THEN COALESCE((SELECT SUM(p.amount_minor) FROM payout p
                            WHERE p.currency = a.currency AND p.state = 'POSTED'), 0)::BIGINT
            ELSE 0::BIGINT
       END AS posted_payouts_minor
  FROM account a
 WHERE a.account_id = $1";

/// The CREDIT leg's destination. $1 currency.
pub const SETTLEMENT_ACCOUNT_ID: &str =
    "SELECT account_id FROM account WHERE currency = $1 AND kind = 'SETTLEMENT'";

// ---------------------------------------------------------------------------------------------
// payouts

/// $1 payout_id, $2 account_id, $3 amount_minor, $4 currency, $5 idempotency_key. A repeated key
/// returns zero rows; the caller compares the stored payout with the request.
pub const PAYOUT_INSERT: &str = concat!(
    "INSERT INTO payout (payout_id, account_id, amount_minor, currency, idempotency_key)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING ",
    payout_columns!()
);

pub const PAYOUT_BY_ID: &str = concat!("SELECT ", payout_columns!(), " FROM payout WHERE payout_id = $1");

pub const PAYOUT_BY_IDEMPOTENCY_KEY: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " FROM payout WHERE idempotency_key = $1"
);

/// The first read of every transaction that changes a payout's hold (posting, reservation, ending):
/// locks the payout row so that two of them serialise (the second then sees the first's result).
pub const PAYOUT_FOR_UPDATE: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " FROM payout WHERE payout_id = $1 FOR UPDATE"
);

/// The claim statement, with `$account` (empty, or a predicate on the payout's account) after the
/// payout id: the one text of both variants below.
macro_rules! payout_claim {
    ($account:literal) => {
        concat!(
            "UPDATE payout
   SET state         = CASE WHEN state = 'PENDING' THEN 'CLAIMED' ELSE state END,
       claimed_by    = $2,
       claim_token   = $3,
       attempt_count = attempt_count + 1,
       updated_at    = now()
 WHERE payout_id = $1",
            $account,
            "
   AND (state = 'PENDING'
        OR (state IN ('CLAIMED','RAIL_SUBMITTED','RAIL_ACKED','RAIL_AMBIGUOUS') AND claim_token < $3))
RETURNING ",
            payout_columns!()
        )
    };
}

/// Claim or adopt. $1 payout_id, $2 owner, $3 token. PENDING → CLAIMED; a payout in flight under an
/// older token is adopted by the newer holder (state unchanged) so it can finish a dead holder's
/// work. Every claim counts an attempt, so `attempt_count > 1` means the payout was adopted.
pub const PAYOUT_CLAIM: &str = payout_claim!("");

/// [`PAYOUT_CLAIM`] under a verified grant, $4 the grant's account: a payout of another account is
/// not touched (zero rows; the caller's re-read names it GRANT_WRONG_RESOURCE). Learning the
/// payout's account costs no statement of its own: it is this statement's predicate.
pub const PAYOUT_CLAIM_FOR_ACCOUNT: &str = payout_claim!("\n   AND account_id = $4");

/// CLAIMED → RAIL_SUBMITTED, holding the amount: runs in the reservation transaction after (r)
/// succeeded. $1 payout_id, $2 token; fenced like (c).
pub const PAYOUT_MARK_RESERVED: &str = concat!(
    "UPDATE payout
   SET state          = 'RAIL_SUBMITTED',
       reserved_minor = amount_minor,
       reserved_token = $2,
       updated_at     = now()
 WHERE payout_id = $1 AND state = 'CLAIMED' AND claim_token <= $2
RETURNING ",
    payout_columns!()
);

/// Into FAILED or ABANDONED, giving up the hold (the caller releases it on the account in the same
/// transaction) and recording why. $1 payout_id, $2 from, $3 to, $4 token, $5 reason; fenced like (c).
pub const PAYOUT_END: &str = concat!(
    "UPDATE payout
   SET state          = $3,
       reserved_minor = 0,
       failure_reason = $5,
       updated_at     = now()
 WHERE payout_id = $1 AND state = $2 AND claim_token <= $4
RETURNING ",
    payout_columns!()
);

/// Whether the payout has a forwardable rail attempt that rail-proxy has not abandoned: such a
/// payout may have been paid, so it must not end ABANDONED. $1 payout_id. (Read only; rail-proxy
/// writes rail_submission.)
pub const PAYOUT_HAS_LIVE_ATTEMPT: &str = "
SELECT EXISTS (SELECT 1 FROM rail_submission
                WHERE payout_id = $1
                  AND outcome IS DISTINCT FROM 'FENCED'
                  AND abandoned_at IS NULL)";

/// Inside the posting transaction, before (a): the hold becomes the debit, so the payout gives it up.
/// $1 payout_id.
pub const PAYOUT_CLEAR_RESERVATION: &str = "UPDATE payout SET reserved_minor = 0 WHERE payout_id = $1";

/// The transition statement, with `$account` as in [`payout_claim`].
macro_rules! payout_transition {
    ($account:literal) => {
        concat!(
            "UPDATE payout
   SET state = $3, updated_at = now()
 WHERE payout_id = $1 AND state = $2 AND claim_token <= $4",
            $account,
            "
RETURNING ",
            payout_columns!()
        )
    };
}

/// An executor-driven state change. $1 payout_id, $2 from, $3 to, $4 token; fenced like (c).
pub const PAYOUT_TRANSITION: &str = payout_transition!("");

/// [`PAYOUT_TRANSITION`] under a verified grant, $5 the grant's account (as [`PAYOUT_CLAIM_FOR_ACCOUNT`]).
pub const PAYOUT_TRANSITION_FOR_ACCOUNT: &str = payout_transition!("\n   AND account_id = $5");

/// First page of PENDING payouts, oldest first, over `payout_pending_idx`. $1 limit.
pub const PAYOUT_LIST_PENDING_FIRST: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " FROM payout
 WHERE state = 'PENDING'
 ORDER BY created_at, payout_id
 LIMIT $1"
);

/// Next page after the keyset cursor ($1 created_at, $2 payout_id), $3 limit. The extra
/// `created_at >= $1` lets the single-column partial index bound the scan.
pub const PAYOUT_LIST_PENDING_AFTER: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " FROM payout
 WHERE state = 'PENDING'
   AND created_at >= $1
   AND (created_at, payout_id) > ($1, $2)
 ORDER BY created_at, payout_id
 LIMIT $3"
);

/// First page of payouts in flight in one state ($1: CLAIMED, RAIL_SUBMITTED, RAIL_ACKED or
/// RAIL_AMBIGUOUS), oldest first: how a new holder finds work a dead holder left. $2 limit.
pub const PAYOUT_LIST_IN_STATE_FIRST: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " FROM payout
 WHERE state = $1
 ORDER BY created_at, payout_id
 LIMIT $2"
);

/// Next page of [`PAYOUT_LIST_IN_STATE_FIRST`] after the cursor ($2 created_at, $3 payout_id), $4 limit.
pub const PAYOUT_LIST_IN_STATE_AFTER: &str = concat!(
    "SELECT ",
    payout_columns!(),
    " FROM payout
 WHERE state = $1
   AND (created_at, payout_id) > ($2, $3)
 ORDER BY created_at, payout_id
 LIMIT $4"
);

// ---------------------------------------------------------------------------------------------
// reconciliation (read-only). Every read is one keyset page, so a run's memory and each statement's
// work are bounded by the page size, whatever the size of the books.

/// One page of accounts after the cursor ($1, the nil UUID for the first page), $2 limit, with the
/// sum of the holds its payouts carry (what `account.reserved_minor` must equal).
pub const RECON_ACCOUNTS_PAGE: &str = concat!(
    "SELECT ",
    account_columns!(),
    ",
       COALESCE((SELECT SUM(p.reserved_minor) FROM payout p
                  WHERE p.account_id = a.account_id AND p.reserved_minor > 0), 0)::BIGINT AS held_minor
  FROM account a
 WHERE a.account_id > $1
 ORDER BY a.account_id
 LIMIT $2"
);

/// Ledger legs of the accounts of one page ($1 their ids), grouped by the grant (fence) that wrote
/// them and direction.
pub const RECON_LEDGER_GROUPS: &str = "
SELECT account_id, fence, direction,
       COUNT(*)::BIGINT                        AS legs,
       SUM(amount_minor)::BIGINT               AS amount_minor,
       array_agg(payout_id ORDER BY payout_id) AS payout_ids
  FROM ledger_entry
 WHERE account_id = ANY($1)
 GROUP BY account_id, fence, direction
 ORDER BY account_id, fence, direction";

/// Σ amount of POSTED payouts per currency: what each settlement account's credits must equal.
pub const RECON_POSTED_BY_CURRENCY: &str = "
SELECT currency, SUM(amount_minor)::BIGINT AS amount_minor
  FROM payout
 WHERE state = 'POSTED'
 GROUP BY currency
 ORDER BY currency";

/// One page of payouts after the cursor ($1, the nil UUID first), $2 limit, each with the shape of
/// its legs and of its rail attempts: a POSTED payout needs exactly one DEBIT on its account and one
/// CREDIT on its currency's settlement account, both of its amount and by one grant, and exactly one
/// ACKED submission; an ACKED submission needs a POSTED payout. `stuck`: not terminal and unchanged
/// for more than $3 seconds (by the database clock).
pub const RECON_PAYOUTS_PAGE: &str = "
SELECT p.payout_id, p.account_id, p.currency, p.amount_minor, p.state,
       COUNT(l.entry_id)::BIGINT AS legs,
       (COUNT(*) FILTER (WHERE l.direction = 'DEBIT'
                           AND l.account_id = p.account_id
                           AND l.amount_minor = p.amount_minor))::BIGINT AS matching_debits,
       (COUNT(*) FILTER (WHERE l.direction = 'CREDIT'
                           AND s.kind = 'SETTLEMENT'
                           AND s.currency = p.currency
                           AND l.amount_minor = p.amount_minor))::BIGINT AS matching_credits,
       COALESCE(array_agg(DISTINCT l.fence ORDER BY l.fence) FILTER (WHERE l.entry_id IS NOT NULL),
                '{}'::BIGINT[]) AS fences,
       (SELECT COUNT(*) FROM rail_submission r
         WHERE r.payout_id = p.payout_id AND r.outcome = 'ACKED')::BIGINT AS acked_submissions,
       (p.state NOT IN ('POSTED','FAILED','ABANDONED')
        AND p.updated_at < now() - make_interval(secs => $3)) AS stuck,
       p.claim_token
  FROM (SELECT * FROM payout WHERE payout_id > $1 ORDER BY payout_id LIMIT $2) p
  LEFT JOIN ledger_entry l ON l.payout_id = p.payout_id
  LEFT JOIN account s      ON s.account_id = l.account_id
 GROUP BY p.payout_id, p.account_id, p.currency, p.amount_minor, p.state, p.updated_at, p.claim_token
 ORDER BY p.payout_id";

/// The payouts not terminal yet, per state: how many, and for how many seconds the oldest of them
/// has been unchanged (by the database clock). Terminal payouts are never read: PENDING comes from
/// `payout_pending_idx`, the in-flight states from `payout_inflight_idx`, so the work grows with
/// the payouts under way, not with the books.
pub const PAYOUT_OPEN_STATS: &str = "
SELECT state, COUNT(*)::BIGINT AS payouts,
       GREATEST(0, FLOOR(EXTRACT(EPOCH FROM now() - MIN(updated_at))))::BIGINT AS oldest_age_seconds
  FROM payout
 WHERE state IN ('PENDING','CLAIMED','RAIL_SUBMITTED','RAIL_ACKED','RAIL_AMBIGUOUS')
 GROUP BY state
 ORDER BY state";

// ---------------------------------------------------------------------------------------------
// readiness

pub const PING: &str = "SELECT 1";

/// Reconciliation reads every table from one snapshot, so a posting committing mid-run cannot show
/// up as a break.
pub const RECON_SNAPSHOT: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";
