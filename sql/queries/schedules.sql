-- Schedules (package schedule). All times are the database's; durations
-- are passed in microseconds and stored as intervals.

-- name: RegisterSchedule :one
-- Insert the definition, or replace the stored one when this version is
-- strictly higher. The WHERE of the DO UPDATE is re-checked on the newest
-- row version under concurrent registrations (read committed), so the
-- stored version only ever moves up. Pause state is never written here.
-- starts_at moves only when the spec or the zone changes. No row returned:
-- the stored definition has an equal or higher version and stays.
INSERT INTO pgclaim_schedules AS s (
    name, spec, time_zone, version, catch_up, catch_up_window, catch_up_cap, overlap,
    max_attempts, backoff, max_backoff, expected_duration, late_after, jitter, lease, starts_at, created_at, updated_at)
VALUES (sqlc.arg(name)::text, sqlc.arg(spec)::text, sqlc.arg(time_zone)::text, sqlc.arg(version)::int4,
        sqlc.arg(catch_up)::text, sqlc.arg(catch_up_window_us)::bigint * interval '1 microsecond',
        sqlc.arg(catch_up_cap)::int4, sqlc.arg(overlap)::text, sqlc.arg(max_attempts)::int4,
        sqlc.arg(backoff_us)::bigint * interval '1 microsecond',
        sqlc.arg(max_backoff_us)::bigint * interval '1 microsecond',
        sqlc.arg(expected_us)::bigint * interval '1 microsecond',
        sqlc.arg(late_after_us)::bigint * interval '1 microsecond',
        sqlc.arg(jitter_us)::bigint * interval '1 microsecond',
        sqlc.arg(lease_us)::bigint * interval '1 microsecond',
        now(), now(), now())
ON CONFLICT (name) DO UPDATE
SET spec = excluded.spec,
    time_zone = excluded.time_zone,
    version = excluded.version,
    catch_up = excluded.catch_up,
    catch_up_window = excluded.catch_up_window,
    catch_up_cap = excluded.catch_up_cap,
    overlap = excluded.overlap,
    max_attempts = excluded.max_attempts,
    backoff = excluded.backoff,
    max_backoff = excluded.max_backoff,
    expected_duration = excluded.expected_duration,
    late_after = excluded.late_after,
    jitter = excluded.jitter,
    lease = excluded.lease,
    starts_at = CASE WHEN s.spec = excluded.spec AND s.time_zone = excluded.time_zone
                     THEN s.starts_at ELSE excluded.starts_at END,
    updated_at = excluded.updated_at
WHERE s.version < excluded.version
RETURNING (xmax = 0)::boolean AS inserted;

-- name: SchedulesByName :many
-- Stored definitions and their pause state, with the database's time, of
-- the named schedules (a runner reads those of every schedule whose lock it
-- took at the same moment in one statement).
-- cursor is the newest scheduled instant recorded that is due: a future
-- instant Scheduler.RunAt ran ahead of time does not move it, so the
-- instants before that one are still recorded as they come due.
SELECT name, spec, time_zone, version, catch_up,
       (extract(epoch FROM catch_up_window) * 1000000)::bigint AS catch_up_window_us,
       catch_up_cap, overlap, max_attempts,
       (extract(epoch FROM backoff) * 1000000)::bigint AS backoff_us,
       (extract(epoch FROM max_backoff) * 1000000)::bigint AS max_backoff_us,
       (extract(epoch FROM expected_duration) * 1000000)::bigint AS expected_us,
       (extract(epoch FROM late_after) * 1000000)::bigint AS late_after_us,
       (extract(epoch FROM jitter) * 1000000)::bigint AS jitter_us,
       (extract(epoch FROM lease) * 1000000)::bigint AS lease_us,
       paused, paused_note, paused_by, paused_at, resumed_at, starts_at, pruned_until, retention_us,
       (SELECT max(r.instant) FROM pgclaim_schedule_runs r
        WHERE r.schedule = s.name AND r.kind = 'scheduled' AND r.instant <= now())::timestamptz AS cursor,
       now()::timestamptz AS db_now
FROM pgclaim_schedules s
WHERE name = ANY(sqlc.arg(names)::text[]);

-- name: OpenRuns :many
-- The named schedules' unfinished runs, by schedule, oldest first, with whether each can be
-- taken now: a pending run past its start_after, a retry whose time has
-- come, a running one whose lease has expired. Every running and retrying
-- run is returned, but of the pending ones only the oldest pending_limit
-- and the oldest that can start now: a backlog of pending runs (a catch-up,
-- a backfill) is read a few rows at a time, not whole on every pass of the
-- runner, which would make working it off quadratic in its length.
SELECT n.name::text AS schedule, o.instant, o.kind, o.state, o.attempt, o.fence, o.holder, o.lease_until, o.next_attempt_at, o.start_after, o.ready
FROM unnest(sqlc.arg(schedules)::text[]) AS n(name) CROSS JOIN LATERAL (
    (SELECT instant, kind, state, attempt, fence, holder, lease_until, next_attempt_at, start_after,
            ((state = 'retrying' AND next_attempt_at <= now())
             OR (state = 'running' AND lease_until <= now()))::boolean AS ready
     FROM pgclaim_schedule_runs
     WHERE schedule = n.name AND state IN ('running', 'retrying'))
    UNION
    (SELECT instant, kind, state, attempt, fence, holder, lease_until, next_attempt_at, start_after,
            (start_after IS NULL OR start_after <= now())::boolean AS ready
     FROM pgclaim_schedule_runs
     WHERE schedule = n.name AND state = 'pending'
     ORDER BY instant
     LIMIT sqlc.arg(pending_limit)::int)
    UNION
    (SELECT instant, kind, state, attempt, fence, holder, lease_until, next_attempt_at, start_after,
            true AS ready
     FROM pgclaim_schedule_runs
     WHERE schedule = n.name AND state = 'pending'
       AND (start_after IS NULL OR start_after <= now())
     ORDER BY instant
     LIMIT 1)
) AS o
ORDER BY n.name, o.instant;

-- name: RecordInstants :many
-- Record due instants of a schedule, each pending (to run, not before its
-- start_after; start_afters may be NULL or shorter: the missing ones start
-- at once) or skipped (with its reason). An instant already recorded is left as it is; nothing is
-- recorded while the schedule is paused (read by this statement). created_at
-- (and a skipped row's finished_at) is statement_timestamp(): when this
-- statement began, and read the pause, even if a conflicting row made it
-- wait past a pause that committed meanwhile. Only the
-- holder of the schedule's lock records: with a lease (lock_fence > 0) the
-- statement checks it still holds it; a session lock is checked by
-- running the statement on the lock's own session.
-- Many schedules' instants go in one statement (a scheduler whose runners
-- came due together): each element names its schedule and that schedule's
-- lease (lock_fence 0: none). Returns the schedule of each row inserted;
-- rows go in (schedule, instant) order.
INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, missed, reason, start_after, created_at, finished_at)
SELECT u.schedule, u.instant, sqlc.arg(kind)::text, u.state, u.missed, NULLIF(u.reason, ''),
       CASE WHEN u.state = 'pending' THEN u.start_after END, statement_timestamp(), CASE WHEN u.state = 'skipped' THEN statement_timestamp() END
FROM (SELECT unnest(sqlc.arg(schedules)::text[]) AS schedule, unnest(sqlc.arg(instants)::timestamptz[]) AS instant,
             unnest(sqlc.arg(states)::text[]) AS state, unnest(sqlc.arg(missed)::boolean[]) AS missed,
             unnest(sqlc.arg(reasons)::text[]) AS reason, unnest(sqlc.narg(start_afters)::timestamptz[]) AS start_after,
             unnest(sqlc.arg(lock_names)::text[]) AS lock_name, unnest(sqlc.arg(lock_fences)::bigint[]) AS lock_fence) AS u
WHERE u.instant IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM pgclaim_schedules s WHERE s.name = u.schedule AND s.paused)
  AND (u.lock_fence = 0 OR EXISTS (
    SELECT 1 FROM pgclaim_locks l
    WHERE l.name = u.lock_name AND l.fence = u.lock_fence AND l.lock_until > now()))
ORDER BY u.schedule, u.instant
ON CONFLICT DO NOTHING
RETURNING schedule::text AS schedule;

-- name: ClaimRuns :many
-- Start the next attempt of a run: a compare-and-swap on its state and
-- fence (NULL for a run never attempted) that bumps attempt and issues a
-- fresh fencing token. A running run is taken over only by the holder of
-- the schedule's lock (which its old holder no longer has) and, with
-- leases, once its lease has expired or once the lock it started under is
-- gone: its fence is older than the lock's (fences are one sequence, so
-- the run was started under an earlier grant of the lock, whose holder
-- counted it lost before the lock could be granted again); the lock is
-- checked as in RecordInstants. Nothing starts while the
-- schedule is paused (read by this statement: a pause committed before it
-- stops it). No row: someone else moved it, or paused. A first attempt
-- starting more than the schedule's late_after after its instant marks
-- the run late (not a backfilled one), measured from its start_after when
-- it has one (a jittered instant); lag_us is how long after its instant
-- this attempt started. A pending run does not start before start_after.
-- started_at, lateness and lag are read from clock_timestamp(), when the
-- run's row is updated (after any wait for its row lock): through the pool
-- the claim runs in a transaction whose BEGIN may come well before it, and
-- now() would be that. Not statement_timestamp() as for RecordInstants: a
-- fenced write of the previous attempt that held the row lock commits
-- before this claim takes effect, and the start must not read as earlier
-- than that write.
-- Many runs go in one statement (a scheduler whose runners came due
-- together), each of its own schedule: fence 0 for a run never attempted,
-- lock_fence 0 for no lease. A row for each run claimed.
UPDATE pgclaim_schedule_runs r
SET state = 'running',
    attempt = r.attempt + 1,
    fence = pgclaim_fence(),
    holder = sqlc.arg(holder)::text,
    lease_until = now() + v.lease_us * interval '1 microsecond',
    next_attempt_at = NULL,
    started_at = clock_timestamp(),
    late = r.late OR (r.attempt = 0 AND r.kind <> 'backfill' AND clock_timestamp() - COALESCE(r.start_after, r.instant) > s.late_after)
FROM pgclaim_schedules s,
     (SELECT unnest(sqlc.arg(schedules)::text[]) AS schedule, unnest(sqlc.arg(instants)::timestamptz[]) AS instant,
             unnest(sqlc.arg(states)::text[]) AS state, NULLIF(unnest(sqlc.arg(fences)::bigint[]), 0) AS fence,
             unnest(sqlc.arg(lease_us)::bigint[]) AS lease_us,
             unnest(sqlc.arg(lock_names)::text[]) AS lock_name, unnest(sqlc.arg(lock_fences)::bigint[]) AS lock_fence) AS v
WHERE s.name = r.schedule
  AND NOT s.paused
  AND r.schedule = v.schedule
  AND r.instant = v.instant
  AND r.state = v.state
  AND r.fence IS NOT DISTINCT FROM v.fence
  AND (r.state <> 'retrying' OR r.next_attempt_at <= now())
  AND (r.state <> 'pending' OR r.start_after IS NULL OR r.start_after <= now())
  AND (r.state <> 'running' OR NOT sqlc.arg(lease_mode)::boolean OR r.lease_until <= now()
       OR r.fence < v.lock_fence)
  AND (v.lock_fence = 0 OR EXISTS (
    SELECT 1 FROM pgclaim_locks l
    WHERE l.name = v.lock_name AND l.fence = v.lock_fence AND l.lock_until > now()))
RETURNING r.schedule::text AS schedule, r.instant, r.attempt, r.fence, r.kind, r.started_at, r.late,
          (extract(epoch FROM clock_timestamp() - r.instant) * 1000000)::bigint AS lag_us;

-- name: StartDue :many
-- The common path of schedules due at one moment, in one statement for
-- all of them: for each schedule whose lock the caller has just taken,
-- seize its lease row with a fresh fence (lock_fence 0; a lease lock,
-- lock_fence > 0, is checked as in RecordInstants instead) and, when the
-- schedule is as the caller last read it and its one due instant is on
-- time, record that instant and start its first attempt, as
-- RecordInstants and ClaimRuns would one after the other. "As last read":
-- the same version, not paused (nor paused over the instant), the newest
-- scheduled instant recorded the one before it, cursor (NULL: none), no run
-- unfinished, the instant come (by now()) and within grace. A schedule
-- that is not gets its lease fence and no run: the caller reads its state
-- and goes the usual way; early_us says how long before the instant by
-- now() the statement came (0: not early). late and lag are ClaimRuns'.
WITH v AS (
    SELECT unnest(sqlc.arg(schedules)::text[]) AS schedule, unnest(sqlc.arg(instants)::timestamptz[]) AS instant,
           unnest(sqlc.arg(versions)::int[]) AS version, unnest(sqlc.narg(cursors)::timestamptz[]) AS cursor,
           unnest(sqlc.arg(lease_us)::bigint[]) AS lease_us, unnest(sqlc.arg(grace_us)::bigint[]) AS grace_us,
           unnest(sqlc.arg(lock_names)::text[]) AS lock_name, unnest(sqlc.arg(lock_fences)::bigint[]) AS lock_fence
), seized AS (
    INSERT INTO pgclaim_locks (name, holder, locked_at, lock_until, fence)
    SELECT v.lock_name, sqlc.arg(holder)::text, now(), now() + v.lease_us * interval '1 microsecond', pgclaim_fence()
    FROM v
    WHERE v.lock_fence = 0
    ORDER BY v.lock_name
    ON CONFLICT (name) DO UPDATE
    SET holder     = excluded.holder,
        locked_at  = excluded.locked_at,
        lock_until = excluded.lock_until,
        fence      = excluded.fence
    RETURNING name, fence
), started AS (
    INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, attempt, fence, holder, lease_until, started_at, created_at, late)
    SELECT v.schedule, v.instant, 'scheduled', 'running', 1, pgclaim_fence(), sqlc.arg(holder)::text,
           now() + v.lease_us * interval '1 microsecond', clock_timestamp(), statement_timestamp(),
           clock_timestamp() - v.instant > s.late_after
    FROM v JOIN pgclaim_schedules s ON s.name = v.schedule
    WHERE s.version = v.version
      AND NOT s.paused
      AND NOT (s.paused_at IS NOT NULL AND v.instant >= s.paused_at AND (s.resumed_at IS NULL OR v.instant <= s.resumed_at))
      AND v.instant <= now()
      AND now() - v.instant <= v.grace_us * interval '1 microsecond'
      AND (SELECT max(r.instant) FROM pgclaim_schedule_runs r
           WHERE r.schedule = v.schedule AND r.kind = 'scheduled' AND r.instant <= now()) IS NOT DISTINCT FROM v.cursor
      AND NOT EXISTS (SELECT 1 FROM pgclaim_schedule_runs r
                      WHERE r.schedule = v.schedule AND r.state IN ('pending', 'running', 'retrying'))
      AND (v.lock_fence = 0 OR EXISTS (
        SELECT 1 FROM pgclaim_locks l
        WHERE l.name = v.lock_name AND l.fence = v.lock_fence AND l.lock_until > now()))
    ORDER BY v.schedule
    ON CONFLICT DO NOTHING
    RETURNING schedule, instant, attempt, fence, late,
              (extract(epoch FROM clock_timestamp() - instant) * 1000000)::bigint AS lag_us
)
SELECT v.schedule::text AS schedule, COALESCE(seized.fence, 0)::bigint AS lease_fence,
       (started.schedule IS NOT NULL)::boolean AS started, started.attempt, started.fence, started.late, started.lag_us,
       GREATEST(0, (extract(epoch FROM v.instant - now()) * 1000000)::bigint)::bigint AS early_us
FROM v
LEFT JOIN seized ON seized.name = v.lock_name
LEFT JOIN started ON started.schedule = v.schedule;

-- name: RenewRun :one
-- Extend a running attempt's lease, only while it holds the run's fence and
-- its lease has not expired.
UPDATE pgclaim_schedule_runs
SET lease_until = now() + sqlc.arg(lease_us)::bigint * interval '1 microsecond'
WHERE schedule = sqlc.arg(schedule)::text
  AND instant = sqlc.arg(instant)::timestamptz
  AND fence = sqlc.arg(fence)::bigint
  AND state = 'running'
  AND lease_until > now()
RETURNING lease_until;

-- name: FinishRuns :many
-- End attempts: each succeeded, failed (with reason), or retrying (with
-- reason, next attempt at now() + its retry_us). A compare-and-swap on each
-- run's fence: a stale holder (its run taken over) changes nothing. Many
-- runs go in one statement (runs of a scheduler that ended together);
-- returns the schedule and instant of each run ended.
UPDATE pgclaim_schedule_runs r
SET state = v.state,
    lease_until = NULL,
    reason = NULLIF(v.reason, ''),
    next_attempt_at = CASE WHEN v.state = 'retrying' THEN now() + v.retry_us * interval '1 microsecond' END,
    finished_at = CASE WHEN v.state <> 'retrying' THEN now() END
FROM (SELECT unnest(sqlc.arg(schedules)::text[]) AS schedule, unnest(sqlc.arg(instants)::timestamptz[]) AS instant,
             unnest(sqlc.arg(fences)::bigint[]) AS fence, unnest(sqlc.arg(states)::text[]) AS state,
             unnest(sqlc.arg(reasons)::text[]) AS reason, unnest(sqlc.arg(retry_us)::bigint[]) AS retry_us) AS v
WHERE r.schedule = v.schedule
  AND r.instant = v.instant
  AND r.fence = v.fence
  AND r.state = 'running'
RETURNING r.schedule::text AS schedule, r.instant;

-- name: MarkOverdue :one
-- Mark a running attempt overdue once it has run for expected_us (database
-- time). No row: the attempt is no longer running (finished, taken over).
-- marked false: not yet; remaining_us says how long until it is.
WITH r AS (
    SELECT started_at FROM pgclaim_schedule_runs
    WHERE schedule = sqlc.arg(schedule)::text AND instant = sqlc.arg(instant)::timestamptz
      AND fence = sqlc.arg(fence)::bigint AND state = 'running'
), u AS (
    UPDATE pgclaim_schedule_runs
    SET overdue = true
    WHERE schedule = sqlc.arg(schedule)::text AND instant = sqlc.arg(instant)::timestamptz
      AND fence = sqlc.arg(fence)::bigint AND state = 'running'
      AND started_at + sqlc.arg(expected_us)::bigint * interval '1 microsecond' <= now()
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM u)::boolean AS marked,
       (extract(epoch FROM r.started_at + sqlc.arg(expected_us)::bigint * interval '1 microsecond' - now()) * 1000000)::bigint AS remaining_us
FROM r;

-- name: ReplaceRuns :many
-- Overlap replace: record the given running or retrying runs of a schedule
-- skipped with reason (a compare-and-swap on each one's state and fence;
-- a running attempt's fence is then stale), by the holder of the
-- schedule's lock (checked as in RecordInstants). Returns the instants
-- replaced.
UPDATE pgclaim_schedule_runs r
SET state = 'skipped', lease_until = NULL, next_attempt_at = NULL, finished_at = now(),
    reason = sqlc.arg(reason)::text
FROM (SELECT unnest(sqlc.arg(instants)::timestamptz[]) AS instant, unnest(sqlc.arg(fences)::bigint[]) AS fence,
             unnest(sqlc.arg(states)::text[]) AS state) AS u
WHERE r.schedule = sqlc.arg(schedule)::text
  AND r.instant = u.instant AND r.fence = u.fence AND r.state = u.state
  AND r.state IN ('running', 'retrying')
  AND (sqlc.arg(lock_fence)::bigint = 0 OR EXISTS (
    SELECT 1 FROM pgclaim_locks l
    WHERE l.name = sqlc.arg(lock_name)::text AND l.fence = sqlc.arg(lock_fence)::bigint AND l.lock_until > now()))
RETURNING r.instant;

-- name: FailDeadRun :execrows
-- Record a running run whose holder died on its last attempt as failed
-- (by the holder of the schedule's lock, checked as in RecordInstants; with
-- leases, once the run's lease has expired or the lock it started under is
-- gone, as in ClaimRun).
UPDATE pgclaim_schedule_runs
SET state = 'failed', lease_until = NULL, finished_at = now(), reason = sqlc.arg(reason)::text
WHERE schedule = sqlc.arg(schedule)::text
  AND instant = sqlc.arg(instant)::timestamptz
  AND fence = sqlc.arg(fence)::bigint
  AND state = 'running'
  AND (NOT sqlc.arg(lease_mode)::boolean OR lease_until <= now() OR fence < sqlc.arg(lock_fence)::bigint)
  AND (sqlc.arg(lock_fence)::bigint = 0 OR EXISTS (
    SELECT 1 FROM pgclaim_locks l
    WHERE l.name = sqlc.arg(lock_name)::text AND l.fence = sqlc.arg(lock_fence)::bigint AND l.lock_until > now()));

-- name: PollSchedules :many
-- For each of the named schedules: its version and pause state, and
-- whether a run waits for an instance: pending (not paused, past its
-- start_after, and nobody holds the schedule's lock: a holder takes its
-- pending runs itself, so an instance that polls while a runner records and
-- claims an instant does not come to look for nothing), a retry whose
-- time has come, or a running run whose holder is gone (its lease expired;
-- with advisory locks, nobody holds the schedule's lock; with leases, the
-- lease lock it started under, the one with an older fence, has expired).
SELECT s.name, s.version, s.paused, now()::timestamptz AS db_now,
       EXISTS (
           SELECT 1 FROM pgclaim_schedule_runs r
           WHERE r.schedule = s.name AND r.state IN ('pending', 'running', 'retrying')
             AND CASE r.state
                 WHEN 'pending' THEN NOT s.paused AND (r.start_after IS NULL OR r.start_after <= now())
                      AND CASE WHEN sqlc.arg(lease_mode)::boolean
                          THEN NOT EXISTS (
                              SELECT 1 FROM pgclaim_locks l
                              WHERE l.name = 'pgclaim.schedule:' || s.name AND l.lock_until > now())
                          ELSE NOT EXISTS (
                              SELECT 1 FROM pg_catalog.pg_locks l
                              WHERE l.locktype = 'advisory'
                                AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                                AND l.classid = sqlc.arg(lock_class)::int4::oid
                                AND l.objid = k.lock_key::oid
                                AND l.objsubid = 2
                                AND l.granted)
                          END
                 WHEN 'retrying' THEN r.next_attempt_at <= now() AND NOT s.paused
                 ELSE r.lease_until <= now()
                      OR (sqlc.arg(lease_mode)::boolean AND NOT EXISTS (
                          SELECT 1 FROM pgclaim_locks l
                          WHERE l.name = 'pgclaim.schedule:' || s.name
                            AND l.fence < r.fence AND l.lock_until > now()))
                      OR (NOT sqlc.arg(lease_mode)::boolean AND NOT EXISTS (
                          SELECT 1 FROM pg_catalog.pg_locks l
                          WHERE l.locktype = 'advisory'
                            AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                            AND l.classid = sqlc.arg(lock_class)::int4::oid
                            AND l.objid = k.lock_key::oid
                            AND l.objsubid = 2
                            AND l.granted))
                 END
       )::boolean AS work
FROM (SELECT unnest(sqlc.arg(names)::text[]) AS name, unnest(sqlc.arg(lock_keys)::int4[]) AS lock_key) AS k
JOIN pgclaim_schedules s ON s.name = k.name;

-- name: TakenSchedules :many
-- Of the named schedules, each due at its instant (the caller's next
-- wake-up for it), those that need no look from this instance now: another
-- instance holds the schedule's lock (its runner records what comes due),
-- or the instant is recorded and finished with no run of the schedule open
-- (a look would find nothing to do). The rest may still be taken by then;
-- this only spares the looks that would find them so. The server's lock
-- table is read once, not once per schedule.
SELECT k.name::text AS name
FROM (SELECT unnest(sqlc.arg(names)::text[]) AS name,
             unnest(sqlc.arg(dues)::timestamptz[]) AS due,
             unnest(sqlc.arg(lock_keys)::int4[]) AS lock_key) AS k
WHERE CASE WHEN sqlc.arg(lease_mode)::boolean
          THEN 'pgclaim.schedule:' || k.name IN (
              SELECT l.name FROM pgclaim_locks l
              WHERE l.name = ANY (SELECT 'pgclaim.schedule:' || n FROM unnest(sqlc.arg(names)::text[]) AS n)
                AND l.lock_until > now())
          ELSE k.lock_key::oid IN (
              SELECT l.objid FROM pg_catalog.pg_locks l
              WHERE l.locktype = 'advisory'
                AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                AND l.classid = sqlc.arg(lock_class)::int4::oid
                AND l.objsubid = 2
                AND l.granted)
      END
   OR (EXISTS (
           SELECT 1 FROM pgclaim_schedule_runs r
           WHERE r.schedule = k.name AND r.instant = k.due
             AND r.state IN ('succeeded', 'failed', 'skipped'))
       AND NOT EXISTS (
           SELECT 1 FROM pgclaim_schedule_runs r
           WHERE r.schedule = k.name AND r.state IN ('pending', 'running', 'retrying')));

-- name: PauseSchedule :one
-- Pause a schedule (no new run starts on any instance) and notify every
-- instance. Pausing a paused schedule keeps its first pause time and
-- replaces the note.
WITH u AS (
    UPDATE pgclaim_schedules
    SET paused = true, paused_note = sqlc.arg(note)::text, paused_by = sqlc.arg(paused_by)::text,
        paused_at = CASE WHEN paused THEN paused_at ELSE now() END,
        resumed_at = NULL, updated_at = now()
    WHERE name = sqlc.arg(name)::text
    RETURNING name, paused_at
)
SELECT u.paused_at, (pg_notify('pgclaim_schedules', u.name) IS NULL)::boolean AS notified FROM u;

-- name: ResumeSchedule :one
-- Resume a schedule and notify every instance. The instants that came due
-- while it was paused are then decided by its catch-up policy.
WITH u AS (
    UPDATE pgclaim_schedules
    SET paused = false,
        resumed_at = CASE WHEN paused THEN now() ELSE resumed_at END,
        updated_at = now()
    WHERE name = sqlc.arg(name)::text
    RETURNING name, resumed_at
)
SELECT u.resumed_at, (pg_notify('pgclaim_schedules', u.name) IS NULL)::boolean AS notified FROM u;

-- name: TriggerSchedule :one
-- Record a triggered run at the database's time, unless one is already
-- open (pending, running or retrying): then that one is returned, so two
-- operators triggering together get one run. Notifies every instance.
WITH s AS (
    SELECT name FROM pgclaim_schedules WHERE name = sqlc.arg(name)::text
), ins AS (
    INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, created_at)
    SELECT s.name, now(), 'triggered', 'pending', now() FROM s
    ON CONFLICT DO NOTHING
    RETURNING instant
), open AS (
    SELECT r.instant FROM pgclaim_schedule_runs r
    WHERE r.schedule = sqlc.arg(name)::text AND r.kind = 'triggered'
      AND r.state IN ('pending', 'running', 'retrying')
)
SELECT COALESCE((SELECT instant FROM ins), (SELECT instant FROM open))::timestamptz AS instant,
       EXISTS (SELECT 1 FROM ins)::boolean AS created,
       (pg_notify('pgclaim_schedules', s.name) IS NULL)::boolean AS notified
FROM s;

-- name: RunInstants :many
-- The instants of a schedule's recorded runs of a kind in (after, upto].
SELECT instant FROM pgclaim_schedule_runs
WHERE schedule = sqlc.arg(schedule)::text AND kind = sqlc.arg(kind)::text
  AND instant > sqlc.arg(after)::timestamptz AND instant <= sqlc.arg(upto)::timestamptz
ORDER BY instant;

-- name: PruneRuns :one
-- Delete the finished runs (succeeded, failed, skipped; never an open one)
-- that finished more than older_than ago by database time, and move each
-- schedule's pruned_until up to the newest scheduled or backfilled instant
-- deleted, so catch-up never records those instants again and Missed never
-- lists them. Nothing is deleted when a stored schedule's catch-up window
-- reaches older_than: refused_by names the one with the widest window.
WITH bad AS (
    SELECT name, (extract(epoch FROM catch_up_window) * 1000000)::bigint AS window_us
    FROM pgclaim_schedules
    WHERE catch_up_window >= sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
    ORDER BY catch_up_window DESC, name
    LIMIT 1
), d AS (
    DELETE FROM pgclaim_schedule_runs r
    WHERE NOT EXISTS (SELECT 1 FROM bad)
      AND r.state IN ('succeeded', 'failed', 'skipped')
      AND r.finished_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
    RETURNING r.schedule, r.instant, r.kind
), u AS (
    UPDATE pgclaim_schedules s
    SET pruned_until = GREATEST(s.pruned_until, m.until)
    FROM (SELECT schedule, max(instant) AS until FROM d WHERE kind <> 'triggered' GROUP BY schedule) AS m
    WHERE s.name = m.schedule
    RETURNING s.name
)
SELECT (SELECT count(*) FROM d)::bigint AS deleted,
       (SELECT count(*) FROM u)::bigint AS schedules,
       COALESCE((SELECT name FROM bad), '')::text AS refused_by,
       COALESCE((SELECT window_us FROM bad), 0)::bigint AS refused_window_us;

-- name: ReportRetention :exec
-- Store, for each named schedule, the retention its scheduler applies
-- (microseconds; -1: every run kept), where it changed.
UPDATE pgclaim_schedules s
SET retention_us = v.retention_us
FROM (SELECT unnest(sqlc.arg(names)::text[]) AS name,
             unnest(sqlc.arg(retentions_us)::bigint[]) AS retention_us) AS v
WHERE s.name = v.name AND s.retention_us IS DISTINCT FROM v.retention_us;

-- name: PruneScheduleRuns :one
-- Retention: delete up to batch_size of one schedule's finished runs
-- (succeeded, failed, skipped; never an open one) that finished more than
-- older_than ago by database time, oldest first, skipping rows another
-- session has locked, and move the schedule's pruned_until up to the newest
-- scheduled or backfilled instant deleted (as PruneRuns). A schedule whose
-- catch-up window reaches older_than is left alone (eligible false): catch-up
-- could otherwise run a pruned instant again. The caller bounds the
-- statement's time (SetLocalStatementTimeout).
WITH s AS (
    SELECT ps.name FROM pgclaim_schedules ps
    WHERE ps.name = sqlc.arg(name)
      AND ps.catch_up_window < sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
), v AS (
    SELECT r.instant FROM pgclaim_schedule_runs r
    WHERE r.schedule IN (SELECT s.name FROM s)
      AND r.state IN ('succeeded', 'failed', 'skipped')
      AND r.finished_at < now() - sqlc.arg(older_than_us)::bigint * interval '1 microsecond'
    ORDER BY r.finished_at
    LIMIT sqlc.arg(batch_size)::int
    FOR UPDATE SKIP LOCKED
), d AS (
    DELETE FROM pgclaim_schedule_runs r
    USING v
    WHERE r.schedule = sqlc.arg(name) AND r.instant = v.instant
    RETURNING r.instant, r.kind
), u AS (
    UPDATE pgclaim_schedules sc
    SET pruned_until = GREATEST(sc.pruned_until, m.until)
    FROM (SELECT max(instant) AS until FROM d WHERE kind <> 'triggered') AS m
    WHERE sc.name = sqlc.arg(name) AND m.until IS NOT NULL
    RETURNING sc.name
)
SELECT (SELECT count(*) FROM d)::bigint AS deleted,
       EXISTS (SELECT 1 FROM s) AS eligible,
       (SELECT count(*) FROM u)::bigint AS moved;

-- name: SetLocalStatementTimeout :exec
-- Bounds every later statement of the transaction.
SELECT set_config('statement_timeout', sqlc.arg(timeout)::text, true);

-- name: NotifySchedule :exec
-- Tell every listening instance that a run of the schedule waits (an
-- attempt handed back at shutdown), as Pause, Resume and Trigger do.
SELECT pg_notify('pgclaim_schedules', sqlc.arg(name)::text);

-- name: RunByInstant :one
-- One run of a schedule, as Scheduler.Runs reports it, with what its
-- runner reads (as OpenRuns): whether it can be taken now, and the
-- database's time. No row: the instant is not in the ledger.
SELECT r.instant, r.kind, r.state, r.attempt, r.fence, r.holder, r.reason,
       r.missed, r.late, r.overdue, r.started_at, r.finished_at,
       r.lease_until, r.next_attempt_at, r.start_after,
       (CASE r.state
            WHEN 'pending' THEN r.start_after IS NULL OR r.start_after <= now()
            WHEN 'retrying' THEN r.next_attempt_at <= now()
            WHEN 'running' THEN r.lease_until <= now()
            ELSE false
        END)::boolean AS ready,
       now()::timestamptz AS db_now
FROM pgclaim_schedule_runs r
WHERE r.schedule = sqlc.arg(schedule)::text AND r.instant = sqlc.arg(instant)::timestamptz;
