-- Queries of an instance of the push service.

-- name: RecordSend :exec
-- "Sends" a push: one row per hand-over to the provider, written in the
-- transaction that finishes the claim, stamped with the claim's token.
INSERT INTO sent_pushes (push_id, fence, instance) VALUES ($1, $2, $3);

-- name: CountOpen :one
-- Rows a resume run for the instant still has to settle: paused before it
-- and not yet SENT or FAILED. PROCESSING ones are claims of an earlier
-- attempt (its holder died) whose lease has not run out yet.
SELECT count(*) FILTER (WHERE status = 'PAUSED') AS paused,
       count(*) FILTER (WHERE status = 'PROCESSING') AS processing
FROM push_requests
WHERE status IN ('PAUSED', 'PROCESSING') AND paused_at <= sqlc.arg(instant)::timestamptz;

-- name: LatestRun :one
-- The newest ledger row of a schedule: its instant and how it ended.
SELECT instant, state, attempt, fence, holder
FROM pgclaim_schedule_runs WHERE schedule = $1 ORDER BY instant DESC LIMIT 1;
