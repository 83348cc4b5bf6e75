-- Synthetic accounts for the local demo, the tests and the benchmarks only (C1 §1.8, NFR-12): no real
-- customer data. This file lives outside the production history (migrations/paydb): it is applied only
-- when a second location is named (dlock-migrate --dir migrations/paydb --dir migrations/paydb-seed),
-- by the demo, the test kit, the benchmarks, and a PaymentStack whose spec asks for demo data.
-- Deterministic ids so that scripts can name them; re-applied by the migrator whenever this file's
-- checksum changes, hence ON CONFLICT DO NOTHING (never overwrites balances a run has moved).
--
-- Settlement accounts (one per currency, kind SETTLEMENT):
--   00000000-0000-4000-8000-000000000901  EUR
--   00000000-0000-4000-8000-000000000902  USD
--   00000000-0000-4000-8000-000000000903  GBP
-- Customer accounts 00000000-0000-4000-8000-0000000000NN, NN = 01..20:
--   01..10 EUR, 11..20 USD, opening balance NN * 100000 minor units (NN * 1000.00).

INSERT INTO account (account_id, currency, balance_minor, opening_balance_minor, kind)
VALUES ('00000000-0000-4000-8000-000000000901', 'EUR', 0, 0, 'SETTLEMENT'),
       ('00000000-0000-4000-8000-000000000902', 'USD', 0, 0, 'SETTLEMENT'),
       ('00000000-0000-4000-8000-000000000903', 'GBP', 0, 0, 'SETTLEMENT')
ON CONFLICT DO NOTHING;

INSERT INTO account (account_id, currency, balance_minor, opening_balance_minor, kind)
SELECT ('00000000-0000-4000-8000-0000000000' || lpad(n::text, 2, '0'))::uuid,
       CASE WHEN n <= 10 THEN 'EUR' ELSE 'USD' END,
       n * 100000,
       n * 100000,
       'CUSTOMER'
  FROM generate_series(1, 20) AS n
ON CONFLICT DO NOTHING;
