-- name: ClaimTick :one
-- Claim a tick in one plain insert: check the fire time against database
-- time (skipped when tolerance_us is NULL, as for catch-up), insert the
-- tick unless it exists, and, when the insert won, take the job's lock as
-- lock_mode says: 'none' (Config.LedgerOnly: no lock) or 'try'
-- (pg_try_advisory_lock on the job's key). A session that holds the lock
-- already (after a wait) claims with ClaimTickHeld.
--
-- No row: the tick was claimed already. The insert meets a competing claim
-- in the primary key whether that claim has committed or not (it waits for
-- one still in flight), so a contender learns that it lost in this one
-- statement, takes no lock, and evaluates nothing of the RETURNING list.
--
-- Errors, each aborting the statement and with it the insert (the session
-- then holds no lock):
--   - PGC02: the fire time is out of tolerance. The message ends with
--     database time, in microseconds since 1970-01-01 UTC. A fire time is
--     checked before the primary key, as the value of the fence.
--   - PGC01: the insert won, but the job's lock is held by another run (a
--     slow previous tick, an Exclusive run): the tick must not stay
--     claimed.
--
-- One row: this claim owns the tick, with its fencing token (and, but for
-- 'none', its session holds the lock). stale (not for 'none'): the job's
-- most recently started tick other than this one (the statement does not
-- see its own insert) is still marked running. With the lock held no other
-- run of the job is alive (every locked run holds the lock until its
-- outcome is recorded), so that tick's holder died; AbandonTicks then marks
-- it. A dead holder's tick is the latest, since no tick of the job could be
-- claimed while it held the lock: one index probe.
--
-- A plain INSERT … RETURNING, not a CTE: every contender of a tick sets up
-- the whole plan at every execution, and the 7 losers of 8 need only the
-- insert's conflict check.
INSERT INTO pgclaim_ticks AS t (job, fire_at, holder, fence)
VALUES (
    sqlc.arg(job)::text, sqlc.arg(fire_at)::timestamptz, sqlc.arg(holder)::text,
    CASE WHEN sqlc.narg(tolerance_us)::bigint IS NULL
           OR sqlc.arg(fire_at)::timestamptz
              BETWEEN now() - sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
                  AND now() + sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
         THEN pgclaim_fence()
         ELSE pgclaim_raise('PGC02', 'pgclaim: the fire time is out of tolerance of database time, in microseconds since 1970: '
                                     || floor(extract(epoch FROM now()) * 1000000)::bigint)
    END)
ON CONFLICT (job, fire_at) DO NOTHING
RETURNING
    (CASE WHEN sqlc.arg(lock_mode)::text = 'none' THEN t.fence
          WHEN pg_try_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) THEN t.fence
          ELSE pgclaim_raise('PGC01', 'pgclaim: the job''s lock is held by another run: the claim of the tick is undone')
     END)::bigint AS fence,
    (CASE WHEN sqlc.arg(lock_mode)::text = 'none' THEN false
          ELSE COALESCE((SELECT l.outcome = 'running' FROM pgclaim_ticks l
                         WHERE l.job = sqlc.arg(job)::text
                         ORDER BY l.started_at DESC LIMIT 1), false)
     END)::boolean AS stale;

-- name: ClaimTickHeld :one
-- ClaimTick for a session that may hold the job's lock already
-- (Config.LockWait): it is released here when the tick is not claimed,
-- in the same statement. gate sends it with lock_mode 'held' only; the
-- other modes go through ClaimTick. Check the fire time against database time
-- (skipped when tolerance_us is NULL, as for catch-up), insert the tick
-- unless it exists, and then, when the insert won, take the job's lock as
-- lock_mode says. lock_mode is 'none' (Config.LedgerOnly: no lock), 'try'
-- (pg_try_advisory_lock on the job's key) or 'held' (this session holds the
-- lock already, taken with a wait; it is unlocked here when the tick is not
-- claimed).
--
-- The insert comes first because the primary key decides "claimed
-- already" alone: it meets a competing claim of the tick whether that
-- claim has committed or not (it waits for one still in flight), where a
-- look at the ledger would miss a claim not yet committed. So a contender
-- of a tick learns that it lost in this one statement. When the insert won
-- but the lock is held by another run of the job (a slow previous tick, an
-- Exclusive run), the tick must not stay claimed: pgclaim_raise aborts the
-- statement, and with it the insert, with SQLSTATE PGC01, and the session
-- holds no lock. No lock is taken by a contender that lost.
--
-- fence <> 0 means this claim owns the tick (and, but for 'none', its
-- session holds the lock). In every other case the session holds no lock
-- any more (left_locked reports an unlock that was not confirmed, after
-- which the session must be closed): in_tolerance false means the fire
-- time was refused; else taken is true (the tick was claimed already).
--
-- stale (not for 'none'): this claim won, and the job's most recently
-- started tick (other than the one inserted here, which this statement does
-- not see) is still marked running. With the lock held no other run of the
-- job is alive (every locked run holds the lock until its outcome is
-- recorded), so that tick's holder died; AbandonTicks then marks it.
-- Looking at the latest tick only costs one index probe; a dead holder's
-- tick is the latest, since no tick of the job could be claimed while it
-- held the lock.
--
-- lk is a subquery, not a CTE: it calls a volatile function, so the planner
-- keeps it as one row evaluated once, after the insert it reads. Every
-- contender of a tick sets up the whole plan at every execution, and each
-- node fewer is start-up saved.
WITH ins AS (
    INSERT INTO pgclaim_ticks (job, fire_at, holder, fence)
    SELECT sqlc.arg(job)::text, sqlc.arg(fire_at)::timestamptz, sqlc.arg(holder)::text, pgclaim_fence()
    WHERE sqlc.narg(tolerance_us)::bigint IS NULL
       OR sqlc.arg(fire_at)::timestamptz
          BETWEEN now() - sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
              AND now() + sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
    ON CONFLICT (job, fire_at) DO NOTHING
    RETURNING fence
)
SELECT lk.db_now::timestamptz AS db_now,
       lk.in_tolerance::boolean AS in_tolerance,
       (lk.in_tolerance AND lk.fence IS NULL)::boolean AS taken,
       (CASE WHEN lk.fence IS NULL THEN 0
             WHEN lk.locked THEN lk.fence
             ELSE pgclaim_raise('PGC01', 'pgclaim: the job''s lock is held by another run: the claim of the tick is undone')
        END)::bigint AS fence,
       (CASE WHEN lk.locked AND sqlc.arg(lock_mode)::text <> 'none'
             THEN COALESCE((SELECT l.outcome = 'running' FROM pgclaim_ticks l
                            WHERE l.job = sqlc.arg(job)::text
                            ORDER BY l.started_at DESC LIMIT 1), false)
             ELSE false END)::boolean AS stale,
       (CASE WHEN lk.fence IS NULL AND sqlc.arg(lock_mode)::text = 'held'
             THEN NOT pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)
             ELSE false END)::boolean AS left_locked
FROM (
    SELECT now() AS db_now,
           (sqlc.narg(tolerance_us)::bigint IS NULL
            OR sqlc.arg(fire_at)::timestamptz
               BETWEEN now() - sqlc.narg(tolerance_us)::bigint * interval '1 microsecond'
                   AND now() + sqlc.narg(tolerance_us)::bigint * interval '1 microsecond') AS in_tolerance,
           ins.fence,
           CASE WHEN ins.fence IS NULL THEN false
                WHEN sqlc.arg(lock_mode)::text = 'try'
                THEN pg_try_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)
                ELSE true
           END AS locked
    FROM (SELECT 1) AS one LEFT JOIN ins ON true
) AS lk;

-- name: AbandonTicks :one
-- Mark abandoned every tick of the job still running, except the caller's
-- own (own_fence; 0 for none), while holding the job's advisory lock: no
-- other run of the job is alive then, so these ticks' holders died before
-- their runs finished. The lock is taken here (re-entrantly when the session
-- holds it already, so the unlock below leaves it held once) and released
-- after the update, which runs first since abl is read in FROM. locked is
-- false, and nothing is marked, when another session has the lock. A run
-- that finished while this statement waited for the lock is seen by its
-- finished row (the update re-checks a row changed since its snapshot).
WITH lk AS (
    SELECT pg_try_advisory_lock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4) AS locked
), ab AS (
    UPDATE pgclaim_ticks t
    SET outcome = 'abandoned', finished_at = clock_timestamp(), error = sqlc.arg(error)::text
    FROM lk
    WHERE lk.locked
      AND t.job = sqlc.arg(job)::text
      AND t.outcome = 'running'
      AND t.fence <> sqlc.arg(own_fence)::bigint
    RETURNING t.fire_at, t.holder, t.fence
), abl AS (
    SELECT array_agg(ab.fire_at ORDER BY ab.fire_at) AS fire_at,
           array_agg(ab.holder ORDER BY ab.fire_at) AS holder,
           array_agg(ab.fence ORDER BY ab.fire_at) AS fence
    FROM ab
)
SELECT lk.locked::boolean AS locked,
       COALESCE(abl.fire_at, '{}')::timestamptz[] AS fire_at,
       COALESCE(abl.holder, '{}')::text[] AS holder,
       COALESCE(abl.fence, '{}')::bigint[] AS fence,
       (CASE WHEN lk.locked
             THEN pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)
             ELSE false END)::boolean AS unlocked
FROM lk CROSS JOIN abl;

-- name: FinishTick :execrows
-- Record how a run ended, through the pool (the run's session is gone, or
-- there is none). Only the run that claimed the tick (same fence), and only
-- while it is running, or marked abandoned by another instance that took the
-- job's lock after this run's session ended: the holder's own account wins.
-- The fence is unique to one grant, across promotions too (pgclaim_fence()):
-- when a promotion lost the tick's row and another run claimed the tick
-- again on the new primary, that run has another fence, and the old run's
-- late outcome changes nothing.
UPDATE pgclaim_ticks
SET finished_at = clock_timestamp(),
    outcome     = sqlc.arg(outcome)::text,
    error       = sqlc.narg(error)::text
WHERE job = sqlc.arg(job)::text
  AND fire_at = sqlc.arg(fire_at)::timestamptz
  AND fence = sqlc.arg(fence)::bigint
  AND outcome IN ('running', 'abandoned');

-- name: FinishTickUnlock :one
-- FinishTick and the advisory unlock in one statement, on the session that
-- holds the lock. unlocked is false if the session did not hold the lock.
-- No row: the tick was not running under this fence, and nothing was
-- unlocked (the caller unlocks with AdvisoryUnlock). The unlock runs in the
-- RETURNING list, after the row is finished (and locked), and takes effect
-- before this statement commits: a claim that takes the lock in between
-- sees the tick still running in its snapshot (ClaimTick's stale). If that
-- claim won its tick, AbandonTicks' update waits for this transaction,
-- re-reads the row finished and marks nothing; a claim that found its tick
-- taken does not look.
UPDATE pgclaim_ticks
SET finished_at = clock_timestamp(),
    outcome     = sqlc.arg(outcome)::text,
    error       = sqlc.narg(error)::text
WHERE job = sqlc.arg(job)::text
  AND fire_at = sqlc.arg(fire_at)::timestamptz
  AND fence = sqlc.arg(fence)::bigint
  AND outcome = 'running'
RETURNING pg_advisory_unlock(sqlc.arg(lock_class)::int4, sqlc.arg(lock_key)::int4)::boolean AS unlocked;

-- name: DBNow :one
-- Database time: the only clock pgclaim compares against.
SELECT now()::timestamptz AS db_now;

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

-- name: PruneTicksBatch :execrows
-- Retention: delete up to batch_size finished ticks whose instant and start
-- are both older than the limit, oldest first, skipping rows another
-- session has locked (as PruneTicks, a batch at a time).
DELETE FROM pgclaim_ticks t
WHERE (t.job, t.fire_at) IN (
    SELECT k.job, k.fire_at FROM pgclaim_ticks k
    WHERE k.started_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
      AND k.fire_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
      AND k.outcome <> 'running'
    ORDER BY k.fire_at
    LIMIT sqlc.arg(batch_size)::int
    FOR UPDATE SKIP LOCKED);

-- name: MissingRelations :one
-- Which of the named relations (pgclaim's tables and sequence) and
-- functions (a name ending in ")", with its argument types:
-- pgclaim_fence(), pgclaim_raise(text,text)) do not exist,
-- resolved by the search path the other statements use: the constructors
-- refuse a database pgclaim's migrations were not applied to.
SELECT COALESCE(array_agg(u.n ORDER BY u.ord) FILTER (WHERE
           CASE WHEN u.n LIKE '%)' THEN to_regprocedure(u.n) IS NULL ELSE to_regclass(u.n) IS NULL END),
       '{}')::text[] AS missing
FROM unnest(sqlc.arg(names)::text[]) WITH ORDINALITY AS u(n, ord);

-- name: HeldTick :one
-- Whether the tick is claimed, and the job's most recently started tick if
-- it is still running: the run that holds the job's lock (none: an
-- Exclusive run of the same name holds it). No tick of the job can be
-- claimed while a run holds the lock, so the lock's run is the latest
-- started; an older tick still marked running is a dead holder's, which
-- the next claim marks abandoned. One index probe, where looking for the
-- latest tick whose outcome is running would step back over every finished
-- tick of the job when none runs. Read before waiting for the lock (a
-- claimed tick is not waited for: its run may be what holds the lock), and
-- after a claim found the lock held elsewhere (a tick claimed meanwhile by
-- a racing instance, not committed when the claim looked, is a normal
-- skip).
SELECT EXISTS (SELECT 1 FROM pgclaim_ticks t
               WHERE t.job = sqlc.arg(job)::text AND t.fire_at = sqlc.arg(fire_at)::timestamptz)::boolean AS claimed,
       COALESCE(r.holder, '')::text AS holder,
       r.fire_at::timestamptz AS running_fire_at,
       r.started_at::timestamptz AS running_since
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT l.holder, l.fire_at, l.started_at, l.outcome FROM pgclaim_ticks l
    WHERE l.job = sqlc.arg(job)::text
    ORDER BY l.started_at DESC LIMIT 1
) AS r ON r.outcome = 'running';

-- name: ProbeTick :one
-- Whether the tick is claimed, once every claim of it still in flight has
-- ended: an insert of the tick meets a claim's uncommitted insert of the
-- same key in the primary key and waits for its transaction, which a read
-- of the ledger would not see. claimed: the insert met the tick. Only ever
-- sent inside a transaction that is rolled back (gate's rolledBack), so
-- the row it inserts when the tick is not claimed never commits. Read
-- after a claim found the job's lock held elsewhere and the tick not in
-- its snapshot: the lock's holder may be the tick's winner, between taking
-- the lock and committing its claim.
WITH ins AS (
    INSERT INTO pgclaim_ticks (job, fire_at, holder, fence)
    VALUES (sqlc.arg(job)::text, sqlc.arg(fire_at)::timestamptz, '', 0)
    ON CONFLICT (job, fire_at) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins) = 0 AS claimed;
