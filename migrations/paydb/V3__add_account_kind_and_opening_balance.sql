-- payment-resource accounting model (docs/accounting.md): what "balance = sum of entries" (INV-03) is
-- measured against. V1 stays as C1 wrote it; this only adds.
--
-- opening_balance_minor: the balance an account was created with. For a CUSTOMER account
--   balance_minor = opening_balance_minor - sum(DEBIT legs) + sum(CREDIT legs), always.
-- kind: CUSTOMER accounts are debited by statement (a) and carry the fence; one SETTLEMENT account per
--   currency receives the CREDIT leg of every posted payout (the money leaving to the rail). Its
--   balance_minor is not maintained by postings, so no posting ever locks it (no hot row).

ALTER TABLE account
    ADD COLUMN opening_balance_minor BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN kind                  TEXT   NOT NULL DEFAULT 'CUSTOMER',
    ADD CONSTRAINT account_opening_balance_ck CHECK (opening_balance_minor >= 0),
    ADD CONSTRAINT account_kind_ck            CHECK (kind IN ('CUSTOMER','SETTLEMENT'));

-- Rows that predate this migration get the opening balance that makes their history consistent
-- (a no-op on a fresh database). A negative result fails the CHECK and the migration, on purpose:
-- an inconsistent ledger needs a human, not a default.
UPDATE account a
   SET opening_balance_minor = a.balance_minor
                             + COALESCE((SELECT SUM(l.amount_minor) FROM ledger_entry l
                                          WHERE l.account_id = a.account_id AND l.direction = 'DEBIT'), 0)
                             - COALESCE((SELECT SUM(l.amount_minor) FROM ledger_entry l
                                          WHERE l.account_id = a.account_id AND l.direction = 'CREDIT'), 0);

-- Exactly one settlement account per currency: the CREDIT leg's destination must be unambiguous.
CREATE UNIQUE INDEX account_settlement_uidx ON account (currency) WHERE kind = 'SETTLEMENT';

-- Account reads recompute the ledger sum; reconciliation groups legs by account.
CREATE INDEX ledger_entry_account_idx ON ledger_entry (account_id);

-- Grants: V2 granted payapp table-level privileges on account and ledger_entry, which cover columns
-- added later; this migration creates no table or sequence, so it needs no new GRANT.
