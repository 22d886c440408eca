-- name: ClaimTick :one
-- Ledger-only claim in one statement: check the fire time against database
-- time (skipped when tolerance_us is NULL, as for catch-up), then insert the
-- tick unless it exists. fence is 0 when the tick was already claimed.
WITH chk AS (
    SELECT now() AS db_now,
           (sqlc.narg(tolerance_us)::bigint IS NULL
            OR sqlc.arg(fire_at)::timestamptz
               BETWEEN now() - sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
                   AND now() + sqlc.narg(tolerance_us)::bigint * interval '1 microsecond') AS in_tolerance
), ins AS (
    INSERT INTO pgclaim_ticks (job, fire_at, holder, fence)
    SELECT sqlc.arg(job)::text, sqlc.arg(fire_at)::timestamptz, sqlc.arg(holder)::text, nextval('pgclaim_fence_seq')
    FROM chk
    WHERE chk.in_tolerance
    ON CONFLICT (job, fire_at) DO NOTHING
    RETURNING fence
)
SELECT chk.db_now::timestamptz AS db_now,
       chk.in_tolerance::boolean AS in_tolerance,
       COALESCE(ins.fence, 0)::bigint AS fence
FROM chk LEFT JOIN ins ON true;

-- name: ClaimTickLocked :one
-- The combined gate in one statement: skew check, pg_try_advisory_lock on the
-- job's key, the ledger insert, and, if the insert found the tick claimed
-- already, the unlock. fence <> 0 means this session holds the lock and owns
-- the tick; in every other case it holds nothing, and taken says whether the
-- tick was claimed already (else the lock was held elsewhere). The ledger is
-- read separately only when the lock was held elsewhere: checking it up front
-- made the common path several times slower.
WITH chk AS (
    SELECT now() AS db_now,
           (sqlc.narg(tolerance_us)::bigint IS NULL
            OR sqlc.arg(fire_at)::timestamptz
               BETWEEN now() - sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
                   AND now() + sqlc.narg(tolerance_us)::bigint * interval '1 microsecond') AS in_tolerance
), lk AS (
    SELECT CASE WHEN chk.in_tolerance
                THEN pg_try_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)
                ELSE false
           END AS locked
    FROM chk
), ins AS (
    INSERT INTO pgclaim_ticks (job, fire_at, holder, fence)
    SELECT sqlc.arg(job)::text, sqlc.arg(fire_at)::timestamptz, sqlc.arg(holder)::text, nextval('pgclaim_fence_seq')
    FROM lk
    WHERE lk.locked
    ON CONFLICT (job, fire_at) DO NOTHING
    RETURNING fence
)
SELECT chk.db_now::timestamptz AS db_now,
       chk.in_tolerance::boolean AS in_tolerance,
       lk.locked::boolean AS locked,
       (CASE WHEN lk.locked THEN ins.fence IS NULL
             WHEN chk.in_tolerance THEN EXISTS (SELECT 1 FROM pgclaim_ticks t
                                                WHERE t.job = sqlc.arg(job)::text
                                                  AND t.fire_at = sqlc.arg(fire_at)::timestamptz)
             ELSE false
        END)::boolean AS taken,
       COALESCE(ins.fence, 0)::bigint AS fence,
       (CASE WHEN lk.locked AND ins.fence IS NULL
             THEN pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)
             ELSE false END)::boolean AS released
FROM chk CROSS JOIN lk LEFT JOIN ins ON true;

-- name: FinishTick :execrows
-- Record how a run ended. Only the run that claimed the tick (same fence)
-- and only while it is still running.
UPDATE pgclaim_ticks
SET finished_at = clock_timestamp(),
    outcome     = sqlc.arg(outcome)::text,
    error       = sqlc.narg(error)::text
WHERE job = sqlc.arg(job)::text
  AND fire_at = sqlc.arg(fire_at)::timestamptz
  AND fence = sqlc.arg(fence)::bigint
  -- = 'running', spelled so the planner uses the primary key rather than
  -- the partial index on running ticks, which fills with dead entries
  -- between vacuums.
  AND outcome NOT IN ('succeeded', 'failed', 'abandoned', 'lost');

-- name: FinishTickUnlock :one
-- FinishTick and the advisory unlock in one statement, on the session that
-- holds the lock. unlocked is false if the session did not hold the lock.
WITH fin AS (
    UPDATE pgclaim_ticks
    SET finished_at = clock_timestamp(),
        outcome     = sqlc.arg(outcome)::text,
        error       = sqlc.narg(error)::text
    WHERE job = sqlc.arg(job)::text
      AND fire_at = sqlc.arg(fire_at)::timestamptz
      AND fence = sqlc.arg(fence)::bigint
      -- = 'running', spelled so the planner cannot pick the partial index
      -- on running ticks, which fills with dead entries between vacuums.
      AND outcome NOT IN ('succeeded', 'failed', 'abandoned', 'lost')
    RETURNING 1
)
SELECT pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)::boolean AS unlocked,
       (SELECT count(*) FROM fin)::bigint AS finished;

-- name: DBNow :one
-- Database time: the only clock pgclaim compares against.
SELECT now()::timestamptz AS db_now;

-- name: TickClaimed :one
-- Whether some instance has claimed the tick.
SELECT EXISTS (
    SELECT 1 FROM pgclaim_ticks
    WHERE job = sqlc.arg(job)::text AND fire_at = sqlc.arg(fire_at)::timestamptz
)::boolean AS claimed;

-- name: TickOwner :one
-- Who claimed a tick and how it ended.
SELECT holder, fence, outcome
FROM pgclaim_ticks
WHERE job = sqlc.arg(job)::text AND fire_at = sqlc.arg(fire_at)::timestamptz;

-- name: PruneTicks :execrows
-- Retention: delete finished ticks whose instant and start are both older
-- than the limit. Running ticks stay (they are live, or stuck and worth
-- seeing).
DELETE FROM pgclaim_ticks
WHERE started_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
  AND fire_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
  AND outcome <> 'running';
