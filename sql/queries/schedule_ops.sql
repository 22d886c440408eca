-- name: ScheduleStatuses :many
-- Per schedule (all, or the one named): its latest outcome — the newest
-- run by instant that is no longer pending, of an instant that has come (a
-- future instant run early by RunAt is not the latest) — the number of its open runs
-- (pending, running, retrying), of its rows recorded missed, late and
-- overdue. No run
-- yet: last_kind and last_state are '' and last_instant is NULL.
SELECT s.name,
       l.instant AS last_instant, COALESCE(l.kind, '')::text AS last_kind, COALESCE(l.state, '')::text AS last_state,
       COALESCE(l.attempt, 0)::int4 AS last_attempt,
       l.reason AS last_reason, l.started_at AS last_started_at, l.finished_at AS last_finished_at,
       (SELECT count(*) FROM pgclaim_schedule_runs r
        WHERE r.schedule = s.name AND r.state IN ('pending', 'running', 'retrying'))::bigint AS open_runs,
       (SELECT count(*) FROM pgclaim_schedule_runs r
        WHERE r.schedule = s.name AND r.missed)::bigint AS missed_recorded,
       (SELECT count(*) FROM pgclaim_schedule_runs r
        WHERE r.schedule = s.name AND r.late)::bigint AS late_runs,
       (SELECT count(*) FROM pgclaim_schedule_runs r
        WHERE r.schedule = s.name AND r.overdue)::bigint AS overdue_runs
FROM pgclaim_schedules s
LEFT JOIN LATERAL (
    SELECT r.instant, r.kind, r.state, r.attempt, r.reason, r.started_at, r.finished_at
    FROM pgclaim_schedule_runs r
    WHERE r.schedule = s.name AND r.state <> 'pending' AND r.instant <= now()
    ORDER BY r.instant DESC
    LIMIT 1
) l ON true
WHERE sqlc.narg(name)::text IS NULL OR s.name = sqlc.narg(name)::text
ORDER BY s.name;

-- name: LedgerInstants :many
-- The instants of a schedule's runs of any kind in (after, upto].
SELECT instant FROM pgclaim_schedule_runs
WHERE schedule = sqlc.arg(schedule)::text
  AND instant > sqlc.arg(after)::timestamptz AND instant <= sqlc.arg(upto)::timestamptz
ORDER BY instant;

-- name: BackfillRuns :one
-- Record instants of a schedule as pending runs of kind backfill, each
-- unless the ledger has it already (ON CONFLICT DO NOTHING on the primary
-- key (schedule, instant): two overlapping backfills record each instant
-- once). Only while the stored spec and zone are the ones the instants
-- were computed from (matched = 0 otherwise, and nothing is recorded).
-- Notifies every instance when it recorded anything. Returns the instants
-- this statement recorded.
WITH s AS (
    SELECT name FROM pgclaim_schedules
    WHERE name = sqlc.arg(schedule)::text AND spec = sqlc.arg(spec)::text AND time_zone = sqlc.arg(time_zone)::text
), ins AS (
    INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, created_at)
    SELECT s.name, u.instant, 'backfill', 'pending', now()
    FROM s CROSS JOIN unnest(sqlc.arg(instants)::timestamptz[]) AS u(instant)
    ON CONFLICT DO NOTHING
    RETURNING instant
), n AS (
    SELECT pg_notify('pgclaim_schedules', s.name) FROM s WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT (SELECT count(*) FROM s)::bigint AS matched,
       COALESCE((SELECT array_agg(instant ORDER BY instant) FROM ins), '{}')::timestamptz[] AS recorded,
       (SELECT count(*) FROM n)::bigint AS notified;

-- name: RecentRuns :many
-- A schedule's newest runs by instant, of every kind and state.
SELECT r.instant, r.kind, r.state, r.attempt, r.fence, r.holder, r.reason,
       r.missed, r.late, r.overdue, r.started_at, r.finished_at
FROM pgclaim_schedule_runs r
WHERE r.schedule = sqlc.arg(schedule)::text
ORDER BY r.instant DESC
LIMIT sqlc.arg(max_runs)::int4;

-- name: CancelBackfill :one
-- Record a schedule's backfilled runs that have not started (pending) as
-- skipped with reason: a compare-and-swap on their state, so a run an
-- instance claims meanwhile runs and is not cancelled. found is 0 when no
-- schedule of that name is stored.
WITH s AS (
    SELECT name FROM pgclaim_schedules WHERE name = sqlc.arg(schedule)::text
), u AS (
    UPDATE pgclaim_schedule_runs r
    SET state = 'skipped', finished_at = now(), reason = sqlc.arg(reason)::text
    FROM s
    WHERE r.schedule = s.name AND r.kind = 'backfill' AND r.state = 'pending'
    RETURNING r.instant
)
SELECT (SELECT count(*) FROM s)::bigint AS found,
       (SELECT count(*) FROM u)::bigint AS cancelled,
       (SELECT min(instant) FROM u)::timestamptz AS first_instant,
       (SELECT max(instant) FROM u)::timestamptz AS last_instant;
