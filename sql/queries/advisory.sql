-- name: AdvisoryTryLock :one
-- Take the lock if free; a fencing token comes with it (0 when not locked).
-- Keys are (class, key) int4 pairs; see gate.AdvisoryKey.
SELECT l.locked::boolean AS locked,
       (CASE WHEN l.locked THEN nextval('pgclaim_fence_seq') ELSE 0 END)::bigint AS fence
FROM (SELECT pg_try_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) AS locked) l;

-- name: AdvisoryLockWait :one
-- Wait for the lock for at most lock_timeout (e.g. '250ms'); fails with
-- SQLSTATE 55P03 when the wait runs out. The setting lasts for this
-- statement only.
WITH t AS (
    SELECT set_config('lock_timeout', sqlc.arg(lock_timeout)::text, true) AS v
), lk AS (
    SELECT pg_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) AS v FROM t
)
SELECT nextval('pgclaim_fence_seq')::bigint AS fence FROM lk;

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
