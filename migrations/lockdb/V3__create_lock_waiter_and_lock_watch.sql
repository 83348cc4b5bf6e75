-- The queue of blocking acquires and the registry of watches (docs/lock-api.md, "Blocking acquire",
-- "Watch"). C1's statements stay the only writers of lock_entry: nothing here writes it. The
-- triggers only tell lock-server replicas, through NOTIFY on the channel dlock_lock, what changed, so
-- that a release wakes exactly the next waiter (whichever replica serves it) and watches learn of it
-- without polling.

-- One row per waiting acquire, in arrival order (waiter_id). A row lives while its request waits:
-- its replica deletes it when the request is answered or cancelled, the cascade when the session
-- ends, and a row whose replica died is skipped after expires_at (the wait's end plus a grace) and
-- removed by the reaper.
CREATE TABLE lock_waiter (
    waiter_id  BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_key   TEXT        NOT NULL,
    session_id UUID        NOT NULL REFERENCES lock_session (session_id) ON DELETE CASCADE,
    owner_id   TEXT        NOT NULL,
    queued_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    CONSTRAINT lock_waiter_wait_ck CHECK (expires_at > queued_at)
);

CREATE INDEX lock_waiter_key_idx     ON lock_waiter (lock_key, waiter_id);
CREATE INDEX lock_waiter_session_idx ON lock_waiter (session_id);

-- One row per open watch: the keys whose releases must be told (a release of an unwatched key
-- without waiters sends nothing).
CREATE TABLE lock_watch (
    watch_id   BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_key   TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX lock_watch_key_idx ON lock_watch (lock_key);

-- A grant that went (release, revoke, the cascade of a session's end): one notification per freed
-- key that someone waits for or watches, naming the cause, the grant, and the head waiter (the
-- oldest live one), which alone is woken. Statement-level, over the deleted rows: the common case
-- (nobody waits for or watches these keys) costs two index probes per statement.
CREATE FUNCTION lock_entry_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dlock_lock', json_build_object(
                'e', 'freed',
                'k', f.lock_key,
                't', f.fencing_token,
                'o', f.owner_id,
                'c', CASE
                         WHEN current_setting('dlock.cause', true) = 'revoked' THEN 'revoked'
                         WHEN NOT EXISTS (SELECT 1 FROM lock_session s WHERE s.session_id = f.session_id)
                             THEN 'session_ended'
                         ELSE 'released'
                     END,
                'h', (SELECT min(w.waiter_id) FROM lock_waiter w
                       WHERE w.lock_key = f.lock_key AND w.expires_at > now()))::text)
      FROM freed f
     WHERE EXISTS (SELECT 1 FROM lock_waiter w WHERE w.lock_key = f.lock_key)
        OR EXISTS (SELECT 1 FROM lock_watch v WHERE v.lock_key = f.lock_key);
    RETURN NULL;
END
$$;

CREATE TRIGGER lock_entry_freed
    AFTER DELETE ON lock_entry
    REFERENCING OLD TABLE AS freed
    FOR EACH STATEMENT EXECUTE FUNCTION lock_entry_freed();

-- A waiter that left the queue (answered, cancelled, timed out, its session ended): if it was the
-- head, the next live waiter becomes head and is told; if its session ended, its own replica is
-- told, so that the request answers SESSION_GONE at once.
CREATE FUNCTION lock_waiter_left() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_id BIGINT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM lock_waiter w
                    WHERE w.lock_key = OLD.lock_key AND w.waiter_id < OLD.waiter_id
                      AND w.expires_at > now()) THEN
        SELECT min(w.waiter_id) INTO next_id FROM lock_waiter w
         WHERE w.lock_key = OLD.lock_key AND w.waiter_id > OLD.waiter_id AND w.expires_at > now();
        IF next_id IS NOT NULL THEN
            PERFORM pg_notify('dlock_lock',
                json_build_object('e', 'head', 'k', OLD.lock_key, 'h', next_id)::text);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM lock_session s WHERE s.session_id = OLD.session_id) THEN
        PERFORM pg_notify('dlock_lock',
            json_build_object('e', 'gone', 'k', OLD.lock_key, 'w', OLD.waiter_id)::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER lock_waiter_left
    AFTER DELETE ON lock_waiter
    FOR EACH ROW EXECUTE FUNCTION lock_waiter_left();

-- Watches come and go: every replica keeps the set of watched keys, so that a grant of a watched key
-- is told (a grant of any other key sends nothing: the acquire path is unchanged).
CREATE FUNCTION lock_watch_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('dlock_lock',
            json_build_object('e', 'watch', 'k', NEW.lock_key, 'v', NEW.watch_id)::text);
    ELSE
        PERFORM pg_notify('dlock_lock',
            json_build_object('e', 'unwatch', 'k', OLD.lock_key, 'v', OLD.watch_id)::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER lock_watch_changed
    AFTER INSERT OR DELETE ON lock_watch
    FOR EACH ROW EXECUTE FUNCTION lock_watch_changed();

GRANT SELECT, INSERT, DELETE ON lock_waiter, lock_watch TO lockapp;
