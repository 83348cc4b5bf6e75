-- C1 §1.5 paydb DDL, copied from docs/contracts/C1-database-schemas.txt. Applied migrations are immutable:
-- correct a mistake with V<n+1>, never by editing this file (its checksum is recorded).

CREATE TABLE account (
    account_id    UUID        PRIMARY KEY,
    currency      CHAR(3)     NOT NULL,
    balance_minor BIGINT      NOT NULL DEFAULT 0,
    fence         BIGINT      NOT NULL DEFAULT 0,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT account_currency_ck CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT account_balance_ck  CHECK (balance_minor >= 0),
    CONSTRAINT account_fence_ck    CHECK (fence >= 0)
);

CREATE TABLE payout (
    payout_id       UUID        PRIMARY KEY,
    account_id      UUID        NOT NULL REFERENCES account (account_id),
    amount_minor    BIGINT      NOT NULL,
    currency        CHAR(3)     NOT NULL,
    state           TEXT        NOT NULL DEFAULT 'PENDING',
    claimed_by      TEXT,
    claim_token     BIGINT,
    idempotency_key TEXT        NOT NULL,
    attempt_count   INTEGER     NOT NULL DEFAULT 0,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT payout_idem_uq     UNIQUE (idempotency_key),
    CONSTRAINT payout_amount_ck   CHECK (amount_minor > 0),
    CONSTRAINT payout_attempts_ck CHECK (attempt_count >= 0),
    CONSTRAINT payout_state_ck    CHECK (state IN ('PENDING','CLAIMED','RAIL_SUBMITTED',
                                   'RAIL_ACKED','RAIL_AMBIGUOUS','POSTED','FAILED','ABANDONED')),
    CONSTRAINT payout_pending_ck  CHECK (state <> 'PENDING'
                                   OR (claimed_by IS NULL AND claim_token IS NULL)),
    CONSTRAINT payout_claimed_ck  CHECK (state IN ('PENDING','FAILED')
                                   OR (claimed_by IS NOT NULL AND claim_token > 0))
);

CREATE INDEX payout_pending_idx ON payout (created_at) WHERE state = 'PENDING';
CREATE INDEX payout_account_idx ON payout (account_id);

CREATE TABLE ledger_entry (
    entry_id     UUID        PRIMARY KEY,
    payout_id    UUID        NOT NULL REFERENCES payout (payout_id),
    account_id   UUID        NOT NULL REFERENCES account (account_id),
    direction    TEXT        NOT NULL,
    amount_minor BIGINT      NOT NULL,
    fence        BIGINT      NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT ledger_direction_ck CHECK (direction IN ('DEBIT','CREDIT')),
    CONSTRAINT ledger_amount_ck    CHECK (amount_minor > 0),
    CONSTRAINT ledger_fence_ck     CHECK (fence > 0),
    CONSTRAINT ledger_leg_uq       UNIQUE (payout_id, account_id, direction)
);

CREATE TABLE rail_submission (
    submission_id   UUID        PRIMARY KEY,
    payout_id       UUID        NOT NULL REFERENCES payout (payout_id),
    idempotency_key TEXT        NOT NULL,
    presented_token BIGINT      NOT NULL,
    outcome         TEXT,
    rail_reference  TEXT,
    submitted_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_at     TIMESTAMPTZ,
    CONSTRAINT rail_outcome_ck  CHECK (outcome IS NULL
                                 OR outcome IN ('ACKED','REJECTED','TIMEOUT','FENCED')),
    CONSTRAINT rail_token_ck    CHECK (presented_token > 0),
    CONSTRAINT rail_resolved_ck CHECK ((outcome IS NULL) = (resolved_at IS NULL))
);

CREATE UNIQUE INDEX rail_submission_attempt_uidx ON rail_submission (payout_id)
    WHERE outcome IS DISTINCT FROM 'FENCED';

CREATE TABLE rail_high_water (
    account_id    UUID        PRIMARY KEY REFERENCES account (account_id),
    highest_token BIGINT      NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT rail_hwm_token_ck CHECK (highest_token > 0)
);
