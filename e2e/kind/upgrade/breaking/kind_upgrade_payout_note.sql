-- The negative control of the kind tier's rolling upgrade (e2e/README.md): the same fixture, made
-- NOT additive. The column comes with a constraint that every new payout must fill it, which the
-- running version does not know to do: from the moment this is applied, creating a payout fails.
-- Built into the upgrade image instead of ../kind_upgrade_payout_note.sql
-- (DLOCK_KIND_UPGRADE_MIGRATION=e2e/kind/upgrade/breaking/kind_upgrade_payout_note.sql
-- e2e/kind/run.sh), step upgrade of e2e/tests/kind.rs must fail.
ALTER TABLE payout ADD COLUMN upgrade_note TEXT;
-- NOT VALID: the rows already there are not checked, so the migration itself succeeds.
ALTER TABLE payout ADD CONSTRAINT payout_upgrade_note_set CHECK (upgrade_note IS NOT NULL) NOT VALID;
