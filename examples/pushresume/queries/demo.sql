-- Queries of the demo's orchestrator: seeding, the database clock, and the
-- checks behind the summary.

-- name: SeedPaused :execrows
-- Pushes paused overnight, waiting for the 09:00 resume.
INSERT INTO push_requests (payload, paused_at)
SELECT format('push #%s: your order has shipped', g), now() - interval '10 hours'
FROM generate_series(1, sqlc.arg(n)::int) AS g;

-- name: SeedStuck :execrows
-- Requests a server crashed on yesterday: PROCESSING since age ago, with no
-- lease (claimed by an older release), to be failed by the 24-hour rule.
INSERT INTO push_requests (payload, status, paused_at, claimed_at, claimed_by, fence, attempts)
SELECT format('push #y%s: yesterday''s reminder', g), 'PROCESSING',
       now() - make_interval(secs => sqlc.arg(age_seconds)::float8) - interval '10 hours',
       now() - make_interval(secs => sqlc.arg(age_seconds)::float8),
       sqlc.arg(holder)::text, nextval('pgclaim_fence_seq'), 1
FROM generate_series(1, sqlc.arg(n)::int) AS g;

-- name: ResetDemo :exec
-- Empties the demo's tables before a run on an existing database.
TRUNCATE sent_pushes, push_requests RESTART IDENTITY;

-- name: ResetSchedule :exec
-- Forgets the demo's schedule (its runs go with it, ON DELETE CASCADE): each
-- run of the demo registers it afresh with its own demo clock.
DELETE FROM pgclaim_schedules WHERE name = $1;

-- name: DatabaseNow :one
SELECT clock_timestamp()::timestamptz AS now;

-- name: CountProcessingBy :one
-- The rows one holder has claimed and not finished.
SELECT count(*) FROM push_requests WHERE status = 'PROCESSING' AND claimed_by = $1;

-- name: CountByStatus :many
SELECT status, count(*) AS n FROM push_requests GROUP BY status ORDER BY status;

-- name: CountDuplicateSends :one
-- Pushes sent more than once. The design guarantees zero.
SELECT count(*) FROM (
    SELECT push_id FROM sent_pushes GROUP BY push_id HAVING count(*) > 1
) AS dup;

-- name: CountSentBefore :one
-- Pushes sent before the instant. Workers claim READY rows only, which the
-- instant's resume makes: the design guarantees zero (a worker claiming
-- PAUSED rows would send them as soon as they were paused).
SELECT count(*) FROM sent_pushes WHERE sent_at < sqlc.arg(instant)::timestamptz;

-- name: CountSends :one
SELECT count(*) AS sends, count(DISTINCT push_id) AS pushes FROM sent_pushes;

-- name: SentByInstance :many
SELECT instance, count(*) AS n FROM sent_pushes GROUP BY instance ORDER BY instance;

-- name: CountInconsistent :one
-- Rows whose state and sends disagree: a SENT row without exactly one send,
-- a send of a row that is not SENT, or a send stamped with a fencing token
-- other than the row's final claim.
SELECT
    (SELECT count(*) FROM push_requests p
      WHERE p.status = 'SENT'
        AND (SELECT count(*) FROM sent_pushes s WHERE s.push_id = p.id) <> 1) AS sent_without_one_send,
    (SELECT count(*) FROM sent_pushes s JOIN push_requests p ON p.id = s.push_id
      WHERE p.status <> 'SENT') AS sends_of_unsent,
    (SELECT count(*) FROM sent_pushes s JOIN push_requests p ON p.id = s.push_id
      WHERE s.fence IS DISTINCT FROM p.fence) AS sends_with_stale_fence;

-- name: ScheduleRuns :many
-- The ledger rows of a schedule, oldest first: one per instant, with the
-- attempt and fence that ended it.
SELECT instant, kind, state, attempt, fence, holder, reason
FROM pgclaim_schedule_runs WHERE schedule = $1 ORDER BY instant;

-- name: FailReasons :many
-- Why rows failed, as the sweeper or the worker recorded it, without the
-- fencing token that makes each sweeper reason unique.
SELECT regexp_replace(coalesce(fail_reason, ''), ', fence [0-9]+', '')::text AS reason, count(*) AS n
FROM push_requests WHERE status = 'FAILED' GROUP BY 1 ORDER BY 1;

-- name: DemoTables :one
-- Whether push_requests exists, and whether this demo's migrations made it.
SELECT (to_regclass('push_requests') IS NOT NULL)::bool AS push_requests,
       (to_regclass('pushresume_schema_version') IS NOT NULL)::bool AS version_table;
