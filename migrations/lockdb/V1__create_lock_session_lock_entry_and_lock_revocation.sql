-- C1 §1.2 lockdb DDL, copied from docs/contracts/C1-database-schemas.txt. Applied migrations are immutable:
-- correct a mistake with V<n+1>, never by editing this file (its checksum is recorded).

CREATE SEQUENCE fencing_token_seq AS BIGINT START WITH 1 INCREMENT BY 1 NO CYCLE;

CREATE TABLE lock_session (
    session_id   UUID        PRIMARY KEY,
    owner_id     TEXT        NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL,
    CONSTRAINT lock_session_ttl_ck CHECK (expires_at > created_at)
);

CREATE TABLE lock_entry (
    lock_key      TEXT        PRIMARY KEY,
    owner_id      TEXT        NOT NULL,
    session_id    UUID        NOT NULL REFERENCES lock_session (session_id) ON DELETE CASCADE,
    fencing_token BIGINT      NOT NULL,
    acquired_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL,
    CONSTRAINT lock_entry_token_ck CHECK (fencing_token > 0),
    CONSTRAINT lock_entry_ttl_ck   CHECK (expires_at > acquired_at)
);

CREATE INDEX lock_entry_expiry_idx  ON lock_entry (expires_at);
CREATE INDEX lock_entry_session_idx ON lock_entry (session_id);

CREATE TABLE lock_revocation (
    id         BIGSERIAL   PRIMARY KEY,
    lock_key   TEXT        NOT NULL,
    prev_owner TEXT        NOT NULL,
    prev_token BIGINT      NOT NULL,
    operator   TEXT        NOT NULL,
    reason     TEXT        NOT NULL,
    revoked_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
