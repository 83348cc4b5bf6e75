//! Every statement lock-server runs against lockdb, and nothing else. The four statements of C1
//! §1.3–1.4 are copied from the contract (named `:params` become positional `$n`); the rest are the
//! session, reaper, revoke and read statements the contract describes in prose.
//!
//! Only the database clock is used: `now()` (transaction start time, C1 Warning 2), never
//! `clock_timestamp()`, and never a time sent by a client. TTLs arrive as seconds (`f64`, converted
//! from milliseconds) for `make_interval(secs => …)`.

/// C1 §1.3 acquire. Binds: `$1` key, `$2` owner_id, `$3` session_id, `$4` ttl_seconds.
/// One row = GRANTED (free key, expired lease taken over, same session re-entering); zero = CONTENDED.
/// `nextval` is evaluated again in `DO UPDATE` so that a takeover gets a strictly higher token (Warning 1).
pub const ACQUIRE: &str = "\
INSERT INTO lock_entry (lock_key, owner_id, session_id, fencing_token, acquired_at, expires_at)
VALUES ($1, $2, $3, nextval('fencing_token_seq'),
        now(), now() + make_interval(secs => $4))
ON CONFLICT (lock_key) DO UPDATE
   SET owner_id      = EXCLUDED.owner_id,
       session_id    = EXCLUDED.session_id,
       fencing_token = nextval('fencing_token_seq'),
       acquired_at   = now(),
       expires_at    = now() + make_interval(secs => $4)
 WHERE lock_entry.expires_at <= now()
    OR (lock_entry.owner_id = EXCLUDED.owner_id AND lock_entry.session_id = EXCLUDED.session_id)
RETURNING fencing_token, owner_id, session_id, acquired_at, expires_at";

/// C1 §1.4 renew. Binds: `$1` key, `$2` token, `$3` ttl_seconds. Zero rows = the lease lapsed (even by
/// 1 ms) or the row belongs to a newer token; `expires_at > now()` is what stops a lapsed row from
/// being resurrected.
pub const RENEW: &str = "\
UPDATE lock_entry
   SET expires_at = now() + make_interval(secs => $3)
 WHERE lock_key      = $1
   AND fencing_token = $2
   AND expires_at    > now()
RETURNING fencing_token, expires_at";

/// The renew statement `renew` (C1's [`RENEW`], or a negative control's) run as it is, in a `WITH`,
/// and joined back to its row for the owner and session the re-signed grant names. Binds as `renew`'s
/// (`$1` key, `$2` token, `$3` ttl_seconds); returns `fencing_token, expires_at, owner_id,
/// session_id`, zero rows exactly when `renew` has zero.
///
/// The renew's text is untouched, character for character (C1 §1.4 is normative), and nothing is
/// read in a second round trip. The join sees the statement's snapshot, from before its UPDATE: the
/// row at this key and token, whose owner and session renew does not change (one token is one grant
/// for all time, C1 §1.4).
pub fn with_holder(renew: &str) -> String {
    format!(
        "WITH r AS (\n{renew}\n)\n\
         SELECT r.fencing_token, r.expires_at, e.owner_id, e.session_id\n  \
         FROM r JOIN lock_entry e ON e.lock_key = $1 AND e.fencing_token = r.fencing_token"
    )
}

/// C1 §1.4 release: compare-and-delete on exactly key + token. Binds: `$1` key, `$2` token.
/// Zero rows = the grant is no longer ours (stale); never retried, never widened.
pub const RELEASE: &str = "\
DELETE FROM lock_entry
 WHERE lock_key      = $1
   AND fencing_token = $2
RETURNING fencing_token";

/// C1 §1.4 session heartbeat. Binds: `$1` session_id, `$2` session_ttl_seconds. Zero rows = reaped or
/// already expired; every lock under the session is void.
pub const HEARTBEAT: &str = "\
UPDATE lock_session
   SET expires_at = now() + make_interval(secs => $2)
 WHERE session_id = $1 AND expires_at > now()
RETURNING expires_at";

/// Opens a session; the id is drawn by the database. Binds: `$1` owner_id, `$2` ttl_seconds.
pub const CREATE_SESSION: &str = "\
INSERT INTO lock_session (session_id, owner_id, created_at, expires_at)
VALUES (gen_random_uuid(), $1, now(), now() + make_interval(secs => $2))
RETURNING session_id, owner_id, expires_at";

/// Closes a session; `ON DELETE CASCADE` releases its locks in the same statement (C1 §1.2, FR-04).
/// Binds: `$1` session_id.
pub const CLOSE_SESSION: &str = "DELETE FROM lock_session WHERE session_id = $1";

/// The reaper: expired sessions go, and their locks with them by the cascade.
pub const REAP_SESSIONS: &str = "DELETE FROM lock_session WHERE expires_at <= now()";

/// Force-revoke, first half: removes the key's *live* grant and reports what it was. An expired row
/// is not held by anyone (acquire may take it over at any moment), so it is not revoked.
/// Binds: `$1` key. Runs in one transaction with [`INSERT_REVOCATION`].
pub const REVOKE_GRANT: &str = "\
DELETE FROM lock_entry
 WHERE lock_key = $1 AND expires_at > now()
RETURNING owner_id, fencing_token";

/// Token-pinned force-revoke, first half: removes the key's live grant only if it is the grant
/// written at `$2` (compare-and-delete, as C1's release), so a retry after a crash can never remove a
/// newer holder. Binds: `$1` key, `$2` the fencing token to remove. Runs in one transaction with
/// [`INSERT_REVOCATION`] and, on zero rows, the two diagnostic reads below.
pub const REVOKE_PINNED_GRANT: &str = "\
DELETE FROM lock_entry
 WHERE lock_key = $1 AND fencing_token = $2 AND expires_at > now()
RETURNING owner_id, fencing_token";

/// After a pinned revoke found zero rows: was that exact grant revoked before (a retry)? The only
/// read of the append-only `lock_revocation`, and it is on the admin path, never the hot path (C1
/// §1.2). Binds: `$1` key, `$2` token.
pub const FIND_REVOCATION: &str = "\
SELECT prev_owner AS owner_id, prev_token AS fencing_token
  FROM lock_revocation
 WHERE lock_key = $1 AND prev_token = $2
 ORDER BY id
 LIMIT 1";

/// Force-revoke, second half: the append-only audit row, only when a grant was deleted.
/// Binds: `$1` key, `$2` prev_owner, `$3` prev_token, `$4` operator, `$5` reason.
pub const INSERT_REVOCATION: &str = "\
INSERT INTO lock_revocation (lock_key, prev_owner, prev_token, operator, reason)
VALUES ($1, $2, $3, $4, $5)";

/// The operator's read of one key. `expired` is judged by the database clock, like acquire judges it.
/// Binds: `$1` key.
pub const READ_LOCK: &str = "\
SELECT fencing_token, owner_id, acquired_at, expires_at, expires_at <= now() AS expired
  FROM lock_entry
 WHERE lock_key = $1";

/// Whose a session is (for a lock client's rights, before anything is written): its owner id,
/// expired or not. Binds: `$1` session_id.
pub const SESSION_OWNER: &str = "SELECT owner_id FROM lock_session WHERE session_id = $1";

/// Whose the grant at a key and token is (for a lock client's rights, before renew or release
/// writes): one token is one grant for all time, so its owner never changes. Binds: `$1` key,
/// `$2` token.
pub const GRANT_OWNER: &str = "SELECT owner_id FROM lock_entry WHERE lock_key = $1 AND fencing_token = $2";

/// Readiness probe.
pub const PING: &str = "SELECT 1";

// ---- the history lock-server vouches for ([`super::epoch`]; docs/design.md) --------------------

/// Which lockdb history a connection reached: the cluster's system identifier (a new one after a
/// fresh initdb or a logical restore), the database's oid (a new one when the database was dropped
/// and created again, as a restore into the same cluster does), the timeline it writes on (the first eight hex digits of the
/// current WAL file's name; a promotion or a restore with recovery starts a new one at once, before
/// its checkpoint), and when its postmaster started (a restart, a restored file-system copy). Fails on
/// a standby (no current WAL position during recovery), where nothing may be granted anyway.
pub const HISTORY: &str = "\
SELECT system_identifier::text AS system_identifier,
       (SELECT oid FROM pg_database WHERE datname = current_database())::bigint AS database_oid,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint AS timeline,
       pg_postmaster_start_time() AS postmaster_started
  FROM pg_control_system()";

/// The jump: moves `fencing_token_seq` above anything a history lock-server cannot vouch for can have
/// handed out, in one statement. Binds: `$1` the advisory lock every jump takes
/// ([`super::epoch::JUMP_LOCK`]), `$2` the jump ([`super::epoch::JUMP`], 2^32), `$3` the band of one
/// timeline ([`super::epoch::TIMELINE_BAND`], 2^48), `$4` tokens per millisecond of the floor
/// ([`super::epoch::TOKENS_PER_MS`], 2^10), `$5` where the floor's clock starts
/// ([`super::epoch::FLOOR_EPOCH_MS`], 2026-01-01 in Unix milliseconds). Returns the value it found
/// and the value it set: the next token is `jumped_to + 1`.
///
/// The sequence goes to the greater of:
/// - *2^32 above what it finds*: a standby that lacked the last grants, or a restored copy, is
///   behind by their number, and none is behind by four billion grants;
/// - *the floor*, `timeline * $3 + ms * $4` (the timeline the server writes on, capped at 2^14;
///   the milliseconds since `$5` by the database clock): the history may also lack a **jump**, made
///   after it fell behind (a lock-server that started on the old primary after the standby stopped
///   receiving, or after the copy was taken), and that jump put the lost tokens 2^32 above anything
///   it can find. A promotion writes on a higher timeline, whose band is above the old one's floor
///   and 2^16 jumps; a restore on the same timeline comes later in time, and the floor has risen by
///   1,024 tokens for every millisecond since the lost jump — more than any lockdb grants.
///
/// `nextval`, not a read of `last_value`: it is atomic with every acquire's `nextval`, so what it
/// finds is above every token already handed out on this history. The advisory lock serialises
/// jumps (several replicas starting at once): a jump that read its value before another jump's
/// `setval` would otherwise set the sequence back below the tokens granted after that other jump.
/// Acquires do not take it and never wait for it.
pub const JUMP_SEQUENCE: &str = "\
WITH serialised AS MATERIALIZED (SELECT pg_advisory_xact_lock($1)),
     seen AS MATERIALIZED (
       SELECT nextval('fencing_token_seq') AS found,
              LEAST(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
                    16383) AS timeline,
              GREATEST(floor(extract(epoch FROM now()) * 1000)::bigint - $5, 0) AS ms
         FROM serialised)
SELECT found,
       setval('fencing_token_seq', GREATEST(found + $2, timeline * $3 + ms * $4), true) AS jumped_to
  FROM seen";

// ---- the queue of blocking acquires and the watches (migration V3; docs/lock-api.md) -----------
// None of these writes lock_entry: a waiter is granted by C1's acquire statement like anyone else.

/// The channel every notification of V3's triggers (and [`NOTIFY_GRANTED`]) goes to.
pub const CHANNEL: &str = "dlock_lock";

/// Whether anyone is queued for the key (a live waiter row): a blocking acquire that finds nobody
/// tries the grant at once instead of joining ([`crate::queue`]). Binds: `$1` key.
pub const QUEUE_EMPTY: &str = "\
SELECT NOT EXISTS (SELECT 1 FROM lock_waiter WHERE lock_key = $1 AND expires_at > now())";

/// Joins the key's queue; the id is the arrival order. Binds: `$1` key, `$2` session_id,
/// `$3` owner_id, `$4` seconds until the row no longer counts (the wait plus a grace). An unknown
/// session is refused by the foreign key (SESSION_GONE).
pub const ENQUEUE_WAITER: &str = "\
INSERT INTO lock_waiter (lock_key, session_id, owner_id, queued_at, expires_at)
VALUES ($1, $2, $3, now(), now() + make_interval(secs => $4))
RETURNING waiter_id";

/// Where a waiter stands: whether its row is still there (`false`: its session ended and the
/// cascade took it), and the seconds left of the live waiter just ahead of it (`NULL`: none, it is
/// the head). Binds: `$1` key, `$2` waiter_id.
pub const WAITER_POSITION: &str = "\
SELECT EXISTS (SELECT 1 FROM lock_waiter WHERE waiter_id = $2) AS present,
       (SELECT extract(epoch FROM w.expires_at - now())::float8
          FROM lock_waiter w
         WHERE w.lock_key = $1 AND w.waiter_id < $2 AND w.expires_at > now()
         ORDER BY w.waiter_id DESC LIMIT 1) AS ahead_secs";

/// [`WAITER_POSITION`] of a deliberately broken queue (negative control only): the newest waiter is
/// the head (LIFO).
pub const WAITER_POSITION_LIFO: &str = "\
SELECT EXISTS (SELECT 1 FROM lock_waiter WHERE waiter_id = $2) AS present,
       (SELECT extract(epoch FROM w.expires_at - now())::float8
          FROM lock_waiter w
         WHERE w.lock_key = $1 AND w.waiter_id > $2 AND w.expires_at > now()
         ORDER BY w.waiter_id ASC LIMIT 1) AS ahead_secs";

/// Seconds left of the key's grant by the database clock (`NULL` row: no grant). Binds: `$1` key.
pub const HOLDER_LEFT: &str = "\
SELECT extract(epoch FROM expires_at - now())::float8 FROM lock_entry WHERE lock_key = $1";

/// A watch feed's read of its key: the grant, whether it lapsed, and the seconds left of it, by the
/// database clock. Binds: `$1` key.
pub const WATCH_READ: &str = "\
SELECT fencing_token, owner_id, acquired_at, expires_at, expires_at <= now() AS expired,
       extract(epoch FROM expires_at - now())::float8 AS left_secs
  FROM lock_entry
 WHERE lock_key = $1";

/// Leaves the queue (granted, timed out, cancelled). Binds: `$1` waiter_id.
pub const DEQUEUE_WAITER: &str = "DELETE FROM lock_waiter WHERE waiter_id = $1";

/// Opens a watch of a key: from now on its releases are told. Binds: `$1` key, `$2` seconds until
/// the row no longer counts (a replica renews its rows while it watches).
pub const ADD_WATCH: &str = "\
INSERT INTO lock_watch (lock_key, expires_at)
VALUES ($1, now() + make_interval(secs => $2))
RETURNING watch_id";

/// Closes a watch. Binds: `$1` watch_id.
pub const DROP_WATCH: &str = "DELETE FROM lock_watch WHERE watch_id = $1";

/// The open watches, read when a replica's listener (re)connects.
pub const WATCHES: &str = "SELECT watch_id, lock_key FROM lock_watch WHERE expires_at > now()";

/// Tells every replica of a grant of a watched key (a grant of any other key sends nothing).
/// Binds: `$1` the JSON payload.
pub const NOTIFY_GRANTED: &str = "SELECT pg_notify('dlock_lock', $1)";

/// Marks the revoke's transaction, so that V3's trigger reports its delete as a revocation.
pub const MARK_REVOKE: &str = "SELECT set_config('dlock.cause', 'revoked', true)";

/// The reaper: queue rows and watches whose replica did not remove them (it died) once they lapsed.
pub const REAP_WAITERS: &str = "DELETE FROM lock_waiter WHERE expires_at <= now()";
pub const REAP_WATCHES: &str = "DELETE FROM lock_watch WHERE expires_at <= now()";

/// One page of held keys (`GET /v1/locks`), in key order after `$2` (`''` for the first page), with
/// each key's queue length. Binds: `$1` prefix (`''` for every key), `$2` after, `$3` limit.
pub const LIST_LOCKS: &str = "\
SELECT e.lock_key, e.fencing_token, e.owner_id, e.session_id, e.acquired_at, e.expires_at,
       e.expires_at <= now() AS expired,
       (SELECT count(*) FROM lock_waiter w
         WHERE w.lock_key = e.lock_key AND w.expires_at > now()) AS waiters
  FROM lock_entry e
 WHERE starts_with(e.lock_key, $1) AND e.lock_key > $2
 ORDER BY e.lock_key
 LIMIT $3";

/// One round trip for `n` concurrent calls of the same statement: `n` copies of `stmt`, each its own
/// data-modifying `WITH` item, and their `RETURNING` rows tagged with the copy's index.
///
/// ```text
/// WITH c0 AS (<stmt, binds $1..$k>), c1 AS (<stmt, binds $k+1..$2k>), …
/// SELECT 0 AS batch_index, c0.* FROM c0 UNION ALL SELECT 1, c1.* FROM c1 …
/// ```
///
/// Each copy is `stmt` character for character except that placeholder `$j` of copy `i` becomes
/// `$(i·binds + j)`; no clause is added, dropped or shared, so each copy is judged by exactly its own
/// predicates, draws its token from its own `nextval`, and zero rows tagged `i` mean for caller `i`
/// what zero rows of `stmt` mean. Whatever set of statements the repository runs (C1's, or a
/// deliberately broken one in a negative control) is the set its batches run. All copies share one
/// transaction, hence one `now()` (C1 Warning 2 still holds: the database clock, never a client's).
///
/// The copies must name distinct rows: `INSERT … ON CONFLICT DO UPDATE` cannot affect one row twice
/// in one statement, so the repository never puts two calls for one key into one batch. `stmt` must
/// use `$` only for placeholders (true of every statement in this file).
pub fn batched(stmt: &str, binds: usize, n: usize) -> String {
    let mut out = String::with_capacity((stmt.len() + 64) * n);
    out.push_str("WITH ");
    for i in 0..n {
        if i > 0 {
            out.push_str(",\n     ");
        }
        out.push_str(&format!("c{i} AS (\n"));
        renumber(stmt, i * binds, &mut out);
        out.push_str("\n)");
    }
    for i in 0..n {
        out.push_str(if i == 0 {
            "\nSELECT "
        } else {
            "\nUNION ALL SELECT "
        });
        out.push_str(&format!("{i} AS batch_index, c{i}.* FROM c{i}"));
    }
    out
}

/// Copies `stmt` into `out` with every placeholder `$j` written as `$(j + offset)`.
fn renumber(stmt: &str, offset: usize, out: &mut String) {
    out.push_str(&placeholders(stmt, |j| Some(format!("${}", j + offset))).unwrap_or_default());
}

/// `stmt` with every placeholder `$j` replaced by `to(j)`; `None` if `to` refuses one. A `$` not
/// followed by digits is not a placeholder and is copied as it is. (Also how the payout bench's
/// floor names a statement's binds as pgbench variables.)
pub fn placeholders(stmt: &str, to: impl Fn(usize) -> Option<String>) -> Option<String> {
    let mut out = String::with_capacity(stmt.len() + 64);
    let mut rest = stmt;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let number = &rest[at + 1..at + 1 + digits];
        match number.parse::<usize>() {
            Ok(j) => out.push_str(&to(j)?),
            Err(_) => {
                out.push('$');
                out.push_str(number);
            }
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Some(out)
}

/// One round trip for any number of concurrent calls of `stmt` as one table modification: `stmt`
/// with its one row of binds replaced by the rows of `unnest` over one array per placeholder
/// (`types[j - 1]` is the SQL type of `$j`; `$j` becomes array `$j` and, row by row, column `b.pj`).
/// Derived from `stmt` mechanically, so whatever statement the repository runs (C1's, or a broken
/// one in a negative control) is what its batches run. `None` when `stmt` is not of a shape handled
/// here; the caller then batches with [`batched`].
///
/// Every output row carries `batch_index`: the 0-based position of the call whose binds produced
/// it. The arrays' rows must name distinct keys (`INSERT … ON CONFLICT DO UPDATE` cannot affect one
/// row twice in a statement; the repository never batches two calls for one key).
///
/// Two shapes (the two batched statements of C1):
///
/// * `INSERT INTO t (cols) VALUES (row) ON CONFLICT (key) DO UPDATE SET … WHERE … RETURNING r`:
///   `VALUES (row)` becomes `SELECT row FROM b` (the `$j` of `row` as `b.pj`), everything after it
///   is kept character for character, except that a `$j` there (only the `DO UPDATE` can have one)
///   becomes the same call's value, found by the proposed row's key:
///   `(SELECT b.pj FROM b WHERE b.pk = EXCLUDED.key)`, where `$k` is the bind `row` puts in `key`.
///   `INSERT`'s `RETURNING` cannot name the source rows, so it also returns `key`, and each row is
///   tagged with its call's index by that key.
/// * `DELETE FROM t WHERE … RETURNING r`: `USING` the unnested rows, each `$j` as `b.pj`, and
///   `b.batch_index` returned with `r`.
pub fn unnested(stmt: &str, types: &[&str]) -> Option<String> {
    let cols: Vec<String> = (1..=types.len()).map(|j| format!("p{j}")).collect();
    let source = format!(
        "unnest({}) WITH ORDINALITY AS b({}, batch_index)",
        types
            .iter()
            .enumerate()
            .map(|(i, t)| format!("${}::{t}[]", i + 1))
            .collect::<Vec<_>>()
            .join(", "),
        cols.join(", ")
    );
    let column = |j: usize| (1..=types.len()).contains(&j).then(|| format!("b.p{j}"));
    if stmt.starts_with("DELETE FROM ") {
        let at = stmt.find(" WHERE ")?;
        let (target, rest) = stmt.split_at(at);
        let returning = rest.rfind("RETURNING ")? + "RETURNING ".len();
        let (filter, returned) = rest.split_at(returning);
        return Some(format!(
            "{}\n USING {source}\n{}(b.batch_index - 1)::int4 AS batch_index, {returned}",
            target.trim_end(),
            placeholders(filter, column)?,
        ));
    }
    if !stmt.starts_with("INSERT INTO ") {
        return None;
    }
    let values = stmt.find("VALUES (")?;
    let (head, rest) = stmt.split_at(values);
    let inner = &rest["VALUES (".len()..];
    let close = matching_paren(inner)?;
    let (row, tail) = (&inner[..close], &inner[close + 1..]);
    // The conflict target's column, and the bind the row puts in it.
    let target = tail.split("ON CONFLICT (").nth(1)?.split(')').next()?.trim();
    let columns = head[head.find('(')? + 1..head.rfind(')')?].split(',');
    let position = columns.map(str::trim).position(|c| c == target)?;
    let key_bind = split_top_level(row)
        .get(position)?
        .trim()
        .strip_prefix('$')?
        .parse::<usize>()
        .ok()
        .filter(|k| (1..=types.len()).contains(k))?;
    let returning = tail.rfind("RETURNING ")? + "RETURNING ".len();
    let (conflict, returned) = tail.split_at(returning);
    if returned.contains('$') {
        return None;
    }
    let same_call =
        |j: usize| column(j).map(|c| format!("(SELECT {c} FROM b WHERE b.p{key_bind} = EXCLUDED.{target})"));
    Some(format!(
        "WITH b AS (SELECT * FROM {source}),\n\
         c AS (\n{head}SELECT {}\n  FROM b ORDER BY b.batch_index{}{target} AS batch_key, {returned}\n)\n\
         SELECT (b.batch_index - 1)::int4 AS batch_index, c.* FROM c JOIN b ON b.p{key_bind} = c.batch_key",
        placeholders(row, column)?,
        placeholders(conflict, same_call)?,
    ))
}

/// One round trip for a batch of `insert`'s calls *and* a batch of `delete`'s, as one statement
/// (one transaction): `insert`'s [`unnested`] text with `delete`'s [`unnested`] text as one more
/// `WITH` item, `d` (a data-modifying `WITH` must be at the top level), placeholders renumbered
/// after `insert`'s (`delete`'s `$j` is `$(j + insert_types.len())`). Both texts are kept character
/// for character but for that; each half is the same mechanical batch form as when it runs alone.
///
/// Every row carries `batch_statement` (0: a row of `insert`'s batch, 1: of `delete`'s) and
/// `batch_index` (within its own batch), then `insert`'s columns; a `delete` row has its own columns
/// under the same names and NULL in the others. `None` unless `insert` is the `INSERT … ON
/// CONFLICT` shape and `delete` the `DELETE` shape, and every column `delete` returns is one
/// `insert` returns too.
///
/// The two halves see one snapshot and must name keys that neither half nor any other statement in
/// flight touches (the caller's rule, [`super::batch`]): their rows are locked in two runs, not in
/// one order, so they could deadlock with a statement holding one of their keys.
pub fn paired(insert: &str, insert_types: &[&str], delete: &str, delete_types: &[&str]) -> Option<String> {
    let first = unnested(insert, insert_types)?;
    let second = unnested(delete, delete_types)?;
    if !insert.starts_with("INSERT INTO ") || !delete.starts_with("DELETE FROM ") {
        return None;
    }
    let at = first.rfind("\nSELECT ")?;
    let (with, select) = first.split_at(at);
    let select = select.strip_prefix("\nSELECT ")?;
    let names = |returning: &str| -> Vec<String> {
        split_top_level(returning)
            .iter()
            .filter_map(|c| c.split_whitespace().last().map(str::to_owned))
            .collect()
    };
    // `insert`'s row: batch_index, its conflict column as batch_key, then its RETURNING list.
    let first_columns = names(insert.rsplit("RETURNING ").next()?);
    let second_columns = names(delete.rsplit("RETURNING ").next()?);
    if !second_columns.iter().all(|c| first_columns.contains(c)) {
        return None;
    }
    let from_d = first_columns
        .iter()
        .map(|c| {
            if second_columns.contains(c) {
                format!("d.{c}")
            } else {
                "NULL".to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut renumbered = String::new();
    renumber(&second, insert_types.len(), &mut renumbered);
    Some(format!(
        "{with},\nd AS (\n{renumbered}\n)\n\
         SELECT 0 AS batch_statement, {select}\n\
         UNION ALL SELECT 1, d.batch_index, NULL, {from_d} FROM d"
    ))
}

/// The index of the `)` closing an already opened `(` in `s`.
fn matching_paren(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `s` split at the commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The statements whose exact text carries a safety property, as one swappable set.
///
/// Production code always uses [`Statements::C1`]. A different set exists only so that tests can run
/// the same scenarios against a deliberately broken statement (the negative controls of NFR-07) and
/// watch the safety assertions fail. A replacement must keep the bind order documented on the
/// corresponding constant and return the same columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statements {
    pub acquire: &'static str,
    pub renew: &'static str,
    pub release: &'static str,
    pub heartbeat: &'static str,
    /// The jump before any grant on a history lock-server cannot vouch for ([`JUMP_SEQUENCE`]);
    /// `None` only in [`Statements::NO_JUMP`].
    pub jump: Option<&'static str>,
}

impl Statements {
    /// The contract's statements (C1 §1.3–1.4).
    pub const C1: Statements = Statements {
        acquire: ACQUIRE,
        renew: RENEW,
        release: RELEASE,
        heartbeat: HEARTBEAT,
        jump: Some(JUMP_SEQUENCE),
    };

    /// For negative controls only (`DLOCK_UNSAFE_NO_SEQUENCE_JUMP`): C1's statements with no jump, so
    /// a promoted standby or a restored lockdb hands out tokens it already handed out.
    pub const NO_JUMP: Statements = Statements {
        jump: None,
        ..Statements::C1
    };
}

impl Default for Statements {
    fn default() -> Self {
        Self::C1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::batch::Call;
    use crate::store::postgres::repo::{AcquireCall, ReleaseCall};

    /// The bind types the batches use (the calls' own).
    const ACQUIRE_TYPES: &[&str] = AcquireCall::TYPES;
    const RELEASE_TYPES: &[&str] = ReleaseCall::TYPES;
    const RENEW_TYPES: &[&str] = &["text", "int8", "float8"];

    #[test]
    fn a_batch_is_the_statement_once_per_call_with_only_its_placeholders_renumbered() {
        let text = batched(ACQUIRE, 4, 3);
        // Copy 0 is C1's text as it is; copies 1 and 2 are C1's text with $1..$4 moved up by 4 and 8.
        // C1's text has $1..$4 only, so one pass per placeholder cannot hit an already moved one.
        let shifted = |by: usize| {
            (1..=4)
                .fold(ACQUIRE.to_owned(), |s, j| {
                    s.replace(&format!("${j}"), &format!("#{}", j + by))
                })
                .replace('#', "$")
        };
        for (i, copy) in [ACQUIRE.to_owned(), shifted(4), shifted(8)].iter().enumerate() {
            assert!(
                text.contains(&format!("c{i} AS (\n{copy}\n)")),
                "copy {i} in\n{text}"
            );
        }
        assert_eq!(text.matches("nextval('fencing_token_seq')").count(), 6);
        assert_eq!(text.matches("WHERE lock_entry.expires_at <= now()").count(), 3);
        assert!(text.ends_with(
            "SELECT 0 AS batch_index, c0.* FROM c0\nUNION ALL SELECT 1 AS batch_index, c1.* FROM c1\n\
             UNION ALL SELECT 2 AS batch_index, c2.* FROM c2"
        ));
        assert!(!text.contains("$13"));
        let release = batched(RELEASE, 2, 2);
        assert!(
            release.contains("lock_key      = $3\n   AND fencing_token = $4"),
            "{release}"
        );
    }

    /// Every line of `stmt` from `from` on, with `$j` written as `to(j)`: what must appear in the
    /// unnested text unchanged but for its binds.
    fn lines_from(stmt: &str, from: &str, to: impl Fn(usize) -> String) -> String {
        let at = stmt.find(from).unwrap();
        placeholders(&stmt[at..], |j| Some(to(j))).unwrap()
    }

    #[test]
    fn the_unnested_acquire_is_c1s_acquire_with_its_values_row_from_the_arrays() {
        let text = unnested(ACQUIRE, ACQUIRE_TYPES).unwrap();
        let expected = "\
WITH b AS (SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::float8[]) WITH ORDINALITY AS b(p1, p2, p3, p4, batch_index)),
c AS (
INSERT INTO lock_entry (lock_key, owner_id, session_id, fencing_token, acquired_at, expires_at)
SELECT b.p1, b.p2, b.p3, nextval('fencing_token_seq'),
        now(), now() + make_interval(secs => b.p4)
  FROM b ORDER BY b.batch_index
ON CONFLICT (lock_key) DO UPDATE
   SET owner_id      = EXCLUDED.owner_id,
       session_id    = EXCLUDED.session_id,
       fencing_token = nextval('fencing_token_seq'),
       acquired_at   = now(),
       expires_at    = now() + make_interval(secs => (SELECT b.p4 FROM b WHERE b.p1 = EXCLUDED.lock_key))
 WHERE lock_entry.expires_at <= now()
    OR (lock_entry.owner_id = EXCLUDED.owner_id AND lock_entry.session_id = EXCLUDED.session_id)
RETURNING lock_key AS batch_key, fencing_token, owner_id, session_id, acquired_at, expires_at
)
SELECT (b.batch_index - 1)::int4 AS batch_index, c.* FROM c JOIN b ON b.p1 = c.batch_key";
        assert_eq!(text, expected);
        // C1's conflict clause, its SET list and its WHERE predicates, character for character but
        // for the one bind in them: the same call's TTL.
        let conflict = lines_from(ACQUIRE, "ON CONFLICT", |j| {
            format!("(SELECT b.p{j} FROM b WHERE b.p1 = EXCLUDED.lock_key)")
        });
        let conflict = conflict.split("RETURNING ").next().unwrap();
        assert!(text.contains(conflict), "{conflict}\nnot in\n{text}");
        assert_eq!(text.matches("nextval('fencing_token_seq')").count(), 2);
    }

    #[test]
    fn the_unnested_release_is_c1s_compare_and_delete_row_by_row() {
        let text = unnested(RELEASE, RELEASE_TYPES).unwrap();
        assert_eq!(
            text,
            "DELETE FROM lock_entry
 USING unnest($1::text[], $2::int8[]) WITH ORDINALITY AS b(p1, p2, batch_index)
 WHERE lock_key      = b.p1
   AND fencing_token = b.p2
RETURNING (b.batch_index - 1)::int4 AS batch_index, fencing_token"
        );
        let predicates = lines_from(RELEASE, " WHERE", |j| format!("b.p{j}"));
        let predicates = predicates.split("\nRETURNING").next().unwrap();
        assert!(text.contains(predicates));
    }

    #[test]
    fn a_broken_statement_unnests_to_the_same_breakage() {
        // The clause a negative control deletes from C1's text is absent from its batched text too.
        let no_nextval = ACQUIRE.replacen("       fencing_token = nextval('fencing_token_seq'),\n", "", 1);
        let text = unnested(&no_nextval, ACQUIRE_TYPES).unwrap();
        assert_eq!(text.matches("nextval('fencing_token_seq')").count(), 1);
        assert!(!text.contains("fencing_token = nextval"));
        let by_key = RELEASE.replacen("\n   AND fencing_token = $2", "", 1);
        let text = unnested(&by_key, RELEASE_TYPES).unwrap();
        assert!(!text.contains("fencing_token ="), "{text}");
        assert!(text.contains("WHERE lock_key      = b.p1\nRETURNING"), "{text}");
    }

    #[test]
    fn a_paired_statement_is_both_unnested_texts_with_the_release_renumbered() {
        let acquire = unnested(ACQUIRE, ACQUIRE_TYPES).unwrap();
        let release = unnested(RELEASE, RELEASE_TYPES).unwrap();
        let text = paired(ACQUIRE, ACQUIRE_TYPES, RELEASE, RELEASE_TYPES).unwrap();
        // The acquire's batch form up to its last SELECT, unchanged.
        let with = &acquire[..acquire.rfind("\nSELECT ").unwrap()];
        assert!(text.starts_with(with), "{text}");
        // The release's batch form, with $1, $2 moved to $5, $6 and nothing else changed.
        let moved = release.replace("$1::", "$5::").replace("$2::", "$6::");
        assert!(text.contains(&format!("d AS (\n{moved}\n)")), "{text}");
        assert!(!text.contains("$7"));
        assert!(text.ends_with(
            "SELECT 0 AS batch_statement, (b.batch_index - 1)::int4 AS batch_index, c.* FROM c JOIN b ON b.p1 = c.batch_key\n\
             UNION ALL SELECT 1, d.batch_index, NULL, d.fencing_token, NULL, NULL, NULL, NULL FROM d"
        ), "{text}");
        // A broken release pairs to the same breakage.
        let by_key = RELEASE.replacen("\n   AND fencing_token = $2", "", 1);
        let broken = paired(ACQUIRE, ACQUIRE_TYPES, &by_key, RELEASE_TYPES).unwrap();
        assert!(!broken.contains("fencing_token = b.p2"), "{broken}");
        // Only an INSERT batch followed by a DELETE batch pairs.
        assert_eq!(paired(RELEASE, RELEASE_TYPES, ACQUIRE, ACQUIRE_TYPES), None);
        assert_eq!(paired(ACQUIRE, ACQUIRE_TYPES, RENEW, RENEW_TYPES), None);
    }

    #[test]
    fn statements_of_other_shapes_are_not_unnested() {
        assert_eq!(unnested(RENEW, RENEW_TYPES), None);
        assert_eq!(unnested(PING, &[]), None);
        // A bind past the arrays, or a key column the row does not fill from a bind.
        assert_eq!(unnested(RELEASE, &["text"]), None);
        assert_eq!(unnested(CREATE_SESSION, &["text", "float8"]), None);
    }

    #[test]
    fn the_renew_that_names_its_holder_is_c1s_renew_unchanged_inside() {
        let text = with_holder(RENEW);
        assert!(text.contains(&format!("WITH r AS (\n{RENEW}\n)")), "{text}");
        assert_eq!(text.matches("UPDATE lock_entry").count(), 1);
        assert_eq!(text.matches("$").count(), RENEW.matches('$').count() + 1);
    }

    #[test]
    fn renumbering_leaves_a_lone_dollar_alone() {
        let mut out = String::new();
        renumber("a $ b $12 c$", 10, &mut out);
        assert_eq!(out, "a $ b $22 c$");
    }
}
