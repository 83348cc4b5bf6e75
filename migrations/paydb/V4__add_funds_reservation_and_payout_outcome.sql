-- Funds before the rail (docs/accounting.md, "Reservations"). V1 stays as C1 wrote it; this only adds.
--
-- account.reserved_minor: the sum of the amounts held for this account's payouts that have entered
--   RAIL_SUBMITTED and are not yet POSTED, FAILED or ABANDONED. Entering RAIL_SUBMITTED reserves the
--   amount, under the account's fence, only while balance_minor - reserved_minor covers it; posting
--   converts the hold into the debit of statement (a); FAILED and ABANDONED release it. rail-proxy
--   forwards only a payout that holds its reservation, so the rail is never asked to pay what the
--   account cannot cover.
-- payout.reserved_minor: this payout's share of account.reserved_minor (0 or amount_minor).
-- payout.reserved_token: the grant that made the reservation (audit; kept after release).
-- payout.failure_reason: why a payout ended FAILED or ABANDONED (machine-readable code).
-- rail_submission.abandoned_at: the attempt was given up because the rail, asked after the deadline,
--   had never received it; its payout ends ABANDONED and its owner may create a new one.

ALTER TABLE account
    ADD COLUMN reserved_minor BIGINT NOT NULL DEFAULT 0,
    ADD CONSTRAINT account_reserved_ck CHECK (reserved_minor >= 0 AND reserved_minor <= balance_minor);

ALTER TABLE payout
    ADD COLUMN reserved_minor BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN reserved_token BIGINT,
    ADD COLUMN failure_reason TEXT,
    ADD CONSTRAINT payout_reserved_ck CHECK (reserved_minor = 0 OR reserved_minor = amount_minor),
    ADD CONSTRAINT payout_reserved_state_ck CHECK (reserved_minor = 0
                                       OR state IN ('RAIL_SUBMITTED','RAIL_ACKED','RAIL_AMBIGUOUS'));

ALTER TABLE rail_submission
    ADD COLUMN abandoned_at TIMESTAMPTZ;

-- Payouts already past CLAIMED when this runs hold their amount from now on, so that the accounts'
-- holds are complete. An account whose in-flight payouts exceed its balance fails account_reserved_ck
-- and the migration, on purpose: that account needs a human, not a default.
UPDATE payout
   SET reserved_minor = amount_minor, reserved_token = claim_token
 WHERE state IN ('RAIL_SUBMITTED','RAIL_ACKED','RAIL_AMBIGUOUS');

UPDATE account a
   SET reserved_minor = r.held
  FROM (SELECT account_id, SUM(reserved_minor)::BIGINT AS held
          FROM payout WHERE reserved_minor > 0 GROUP BY account_id) r
 WHERE r.account_id = a.account_id;

-- Reconciliation pages through payouts by id and joins their rail attempts.
CREATE INDEX rail_submission_payout_idx ON rail_submission (payout_id);
-- The executor lists each in-flight state one keyset page at a time (bounded work); without this a
-- page of e.g. CLAIMED payouts would scan the whole table when the PENDING backlog is large.
CREATE INDEX payout_inflight_idx ON payout (state, created_at, payout_id)
    WHERE state IN ('CLAIMED','RAIL_SUBMITTED','RAIL_ACKED','RAIL_AMBIGUOUS');

-- Grants: V2 granted payapp table-level privileges, which cover the columns added here.
