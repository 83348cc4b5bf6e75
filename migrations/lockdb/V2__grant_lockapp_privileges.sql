-- lock-server connects as lockapp and is the only writer of lockdb (C1 §1.1). The role is created
-- without a password; deployments set one with `dlock-migrate --app-password-env`.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lockapp') THEN
        CREATE ROLE lockapp LOGIN;
    END IF;
END
$$;

GRANT SELECT, INSERT, UPDATE, DELETE ON lock_session, lock_entry TO lockapp;
-- lock_revocation is append-only: no UPDATE, no DELETE.
GRANT SELECT, INSERT ON lock_revocation TO lockapp;
GRANT USAGE ON SEQUENCE fencing_token_seq, lock_revocation_id_seq TO lockapp;
