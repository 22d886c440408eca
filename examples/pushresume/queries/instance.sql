-- Queries of an instance of the push service.

-- name: RecordSend :exec
-- "Sends" a push: one row per hand-over to the provider, written in the
-- transaction that finishes the claim, stamped with the claim's token.
INSERT INTO sent_pushes (push_id, fence, instance) VALUES ($1, $2, $3);

-- name: CountDue :one
-- PAUSED rows the latest run of the job should have resumed: paused before
-- its scheduled instant. Non-zero while no run is going means a run was cut
-- short (its holder died) or rows came back from the sweeper for a retry.
SELECT count(*) FROM push_requests
WHERE status = 'PAUSED'
  AND paused_at <= (SELECT max(fire_at) FROM pgclaim_ticks WHERE job = sqlc.arg(job)::text);

-- name: TickAt :one
-- The ledger row of one tick: who took it and how it ended.
SELECT holder, fence, outcome FROM pgclaim_ticks WHERE job = $1 AND fire_at = $2;
