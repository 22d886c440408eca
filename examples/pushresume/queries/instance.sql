-- Queries of an instance of the push service.

-- name: ResumePaused :execrows
-- The 09:00 job's resume: the pushes paused before the instant become READY,
-- in one statement. The table's trigger announces them at its commit, and
-- every instance's worker claims them at once. A second attempt of the
-- instant finds nothing left PAUSED and moves nothing.
UPDATE push_requests SET status = 'READY'
WHERE status = 'PAUSED' AND paused_at <= sqlc.arg(instant)::timestamptz;

-- name: RecordSend :exec
-- "Sends" a push: one row per hand-over to the provider, written in the
-- transaction that finishes the claim, stamped with the claim's token.
INSERT INTO sent_pushes (push_id, fence, instance) VALUES ($1, $2, $3);

-- name: CountOpen :one
-- Rows a resume run for the instant still waits for: paused before it and
-- not yet SENT or FAILED. PAUSED ones are not resumed yet; READY ones wait
-- for a worker; PROCESSING ones are claims being sent, or the claims of an
-- instance that died, until their lease runs out and a sweep gives them
-- back.
SELECT count(*) FILTER (WHERE status = 'PAUSED') AS paused,
       count(*) FILTER (WHERE status = 'READY') AS ready,
       count(*) FILTER (WHERE status = 'PROCESSING') AS processing
FROM push_requests
WHERE status IN ('PAUSED', 'READY', 'PROCESSING') AND paused_at <= sqlc.arg(instant)::timestamptz;

-- name: ProcessingByHolder :many
-- The claims under way on rows paused before the instant, per holder.
SELECT coalesce(claimed_by, '')::text AS holder, count(*) AS n
FROM push_requests
WHERE status = 'PROCESSING' AND paused_at <= sqlc.arg(instant)::timestamptz
GROUP BY 1 ORDER BY 1;

-- name: LatestRun :one
-- The newest ledger row of a schedule: its instant and how it ended.
SELECT instant, state, attempt, fence, holder
FROM pgclaim_schedule_runs WHERE schedule = $1 ORDER BY instant DESC LIMIT 1;
