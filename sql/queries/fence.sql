-- name: NextFence :one
-- A fresh fencing token (pgclaim_fence(): the WAL timeline in the high
-- bits, so unique and increasing across primary promotions). A bare SELECT
-- writes nothing its commit waits for: the token is durable only once a
-- transaction that wrote WAL after it has committed (see AdvisoryTryLock).
SELECT pgclaim_fence()::bigint AS fence;
