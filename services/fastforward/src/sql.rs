//! Every statement of the fast-forward, in one place.

/// paydb: the highest token each fenced resource has accepted (C1 §1.5/§1.6). Read-only; an empty
/// table counts as 0.
pub const PAYDB_HIGH_WATER: &str = "\
SELECT (SELECT COALESCE(max(highest_token), 0) FROM rail_high_water)::BIGINT AS rail_high_water,
       (SELECT COALESCE(max(fence), 0)         FROM account)::BIGINT         AS account_fence,
       (SELECT COALESCE(max(fence), 0)         FROM ledger_entry)::BIGINT    AS ledger_fence,
       (SELECT COALESCE(max(claim_token), 0)   FROM payout)::BIGINT          AS claim_token";

/// lockdb: the highest token the sequence has handed out (0 when it never has).
pub const SEQUENCE_ISSUED: &str = "\
SELECT (CASE WHEN is_called THEN last_value ELSE last_value - 1 END)::BIGINT FROM fencing_token_seq";

/// lockdb: move the sequence so that the next token is above `$1`, never lowering it (C1 §1.7:
/// sequences are non-transactional; GREATEST keeps a sequence that is already further untouched).
/// Returns the highest issued value afterwards.
pub const ADVANCE: &str = "\
SELECT setval('fencing_token_seq',
              GREATEST($1::BIGINT,
                       (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
                          FROM fencing_token_seq)),
              true)::BIGINT";
