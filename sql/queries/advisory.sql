-- name: AdvisoryTryLock :one
-- Take the lock if free; a fencing token comes with it (0 when not locked).
-- Keys are (class, key) int4 pairs; see gate.AdvisoryKey.
--
-- The token is durable before it is returned, as every other grant's is:
-- the statement writes a transactional WAL message naming it
-- (pg_logical_emit_message), so its commit flushes the WAL that covers the
-- token and, under synchronous replication, waits for the standby. A bare
-- nextval commits without either, and a crash or a promotion right after
-- could hand the same sequence value out again. g is evaluated once (a
-- subquery whose output is volatile is neither flattened nor has the
-- condition pushed into it); the condition always holds.
SELECT g.locked::boolean AS locked, g.fence::bigint AS fence
FROM (SELECT l.locked, CASE WHEN l.locked THEN pgclaim_fence() ELSE 0 END AS fence
      FROM (SELECT pg_try_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) AS locked) l) g
WHERE CASE WHEN g.locked THEN pg_logical_emit_message(true, 'pgclaim_fence', g.fence::text) IS NOT NULL ELSE true END;

-- name: AdvisoryLockWait :one
-- Wait for the lock for at most lock_timeout (e.g. '250ms'); fails with
-- SQLSTATE 55P03 when the wait runs out. The setting lasts for this
-- statement only. The token is made durable as in AdvisoryTryLock.
WITH t AS (
    SELECT set_config('lock_timeout', sqlc.arg(lock_timeout)::text, true) AS v
), lk AS (
    SELECT pg_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) AS v FROM t
), g AS (
    SELECT pgclaim_fence() AS fence FROM lk
)
SELECT g.fence::bigint AS fence FROM g
WHERE pg_logical_emit_message(true, 'pgclaim_fence', g.fence::text) IS NOT NULL;

-- name: AdvisoryTryLocks :many
-- Take each free lock of (lock_class, lock_keys[i]) without waiting, in one
-- round trip, and return the keys taken. No fencing token comes with them:
-- for callers whose fence comes from a row they seize under the lock (the
-- scheduler's lease rows).
SELECT k::int4 AS lock_key
FROM unnest(sqlc.arg(lock_keys)::int4[]) AS k
WHERE pg_try_advisory_lock(sqlc.arg(lock_class)::int4, k);

-- name: AdvisoryTryLocksUpTo :many
-- Take free locks of (lock_class, lock_keys[i]) without waiting, in the
-- order given, until up_to are taken, and return each key taken with its
-- position in lock_keys (from 1). A key is tried only when LIMIT asks
-- for another row (a plain scan of the array: no sort, no join), so every
-- lock taken is returned, and the keys after the last one returned were
-- not tried when up_to came back. For many callers sharing out a set of
-- locks in one round trip each, as SKIP LOCKED shares out rows.
SELECT k.key::int4 AS lock_key, k.pos::int4 AS pos
FROM unnest(sqlc.arg(lock_keys)::int4[]) WITH ORDINALITY AS k(key, pos)
WHERE pg_try_advisory_lock(sqlc.arg(lock_class)::int4, k.key)
LIMIT sqlc.arg(up_to)::int;

-- name: AdvisoryUnlocks :many
-- Release each lock of (lock_class, lock_keys[i]) this session holds, in
-- one round trip, and return the keys released.
SELECT k::int4 AS lock_key
FROM unnest(sqlc.arg(lock_keys)::int4[]) AS k
WHERE pg_advisory_unlock(sqlc.arg(lock_class)::int4, k);

-- name: AdvisoryUnlock :one
SELECT pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)::boolean AS unlocked;

-- name: SessionSetup :one
-- Prepare a connection dedicated to holding advisory locks: report the
-- backend pid (compared with the one announced at connect to detect a
-- pooler in between), run its transactions at READ COMMITTED whatever the
-- database, role or pool sets (the gate's statements rely on its re-check
-- semantics, and the connection never goes back to the pool), disable
-- idle_session_timeout (an idle lock holder must not be disconnected), and set TCP keepalives so the server notices a
-- vanished client in about 11 s and frees its locks. Settings unknown to
-- the server are skipped.
SELECT pg_backend_pid()::int4 AS pid,
       (SELECT count(set_config(s.name, v.value, false))
        FROM (VALUES ('default_transaction_isolation', 'read committed'),
                     ('idle_session_timeout', '0'),
                     ('idle_in_transaction_session_timeout', '0'),
                     ('tcp_keepalives_idle', '5'),
                     ('tcp_keepalives_interval', '2'),
                     ('tcp_keepalives_count', '3')) AS v(name, value)
        JOIN pg_catalog.pg_settings s ON s.name = v.name)::bigint AS settings;

-- name: AdvisoryHolder :one
-- The backend pid holding a gate advisory lock, if any (for operators and
-- tests).
SELECT pid::int4 AS pid
FROM pg_catalog.pg_locks
WHERE locktype = 'advisory'
  AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND classid = sqlc.arg(lock_class)::int4::oid
  AND objid = sqlc.arg(lock_key)::int4::oid
  AND objsubid = 2
  AND granted;
