-- payment-resource and rail-proxy connect as payapp (C1 §1.1). The role is created without a
-- password; deployments set one with `dlock-migrate --app-password-env`.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'payapp') THEN
        CREATE ROLE payapp LOGIN;
    END IF;
END
$$;

GRANT SELECT, INSERT, UPDATE ON account, payout, rail_submission, rail_high_water TO payapp;
-- ledger_entry is append-only.
GRANT SELECT, INSERT ON ledger_entry TO payapp;
