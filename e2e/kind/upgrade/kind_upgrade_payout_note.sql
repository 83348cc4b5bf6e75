-- The kind tier's upgrade fixture: the one migration that only the upgrade image carries
-- (e2e/kind/build-image.sh --paydb-migration makes it the next paydb version; e2e/tests/kind.rs, step
-- upgrade, finds it in flyway_schema_history by this file's name). An additive change, the kind a
-- rolling upgrade is built for: until they are replaced, the old version's pods keep serving on the
-- new schema, and a nullable column they do not know of must not disturb them.
ALTER TABLE payout ADD COLUMN upgrade_note TEXT;
