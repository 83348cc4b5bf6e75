-- The notification of a freed key (V3's lock_entry_freed), fired per deleted row instead of once per
-- statement over a transition table. Same rule, same payload: one notification per freed key that
-- someone waits for or watches, naming the cause, the grant, and the head waiter.
--
-- Why: the statement-level form ran its query over a transition table at every DELETE, the common
-- case (nobody waits or watches) included. The row-level function's queries are planned once per
-- connection and cached; in the common case they cost two index probes. pgbench on the acquire +
-- release cycle (16 clients, 5 s, the 2-core machine, three alternated rounds, medians):
-- 6,497 cycles/s with V3's trigger, 7,846 with this one, 9,371 with no trigger at all
-- (docs/benchmarks.md).

DROP TRIGGER lock_entry_freed ON lock_entry;
DROP FUNCTION lock_entry_freed();

CREATE FUNCTION lock_entry_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lock_waiter w WHERE w.lock_key = OLD.lock_key)
       OR EXISTS (SELECT 1 FROM lock_watch v WHERE v.lock_key = OLD.lock_key) THEN
        PERFORM pg_notify('dlock_lock', json_build_object(
                    'e', 'freed',
                    'k', OLD.lock_key,
                    't', OLD.fencing_token,
                    'o', OLD.owner_id,
                    'c', CASE
                             WHEN current_setting('dlock.cause', true) = 'revoked' THEN 'revoked'
                             WHEN NOT EXISTS (SELECT 1 FROM lock_session s WHERE s.session_id = OLD.session_id)
                                 THEN 'session_ended'
                             ELSE 'released'
                         END,
                    'h', (SELECT min(w.waiter_id) FROM lock_waiter w
                           WHERE w.lock_key = OLD.lock_key AND w.expires_at > now()))::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER lock_entry_freed
    AFTER DELETE ON lock_entry
    FOR EACH ROW EXECUTE FUNCTION lock_entry_freed();
