-- name: NextFence :one
-- A fresh fencing token: strictly increasing, never reused.
SELECT nextval('pgclaim_fence_seq')::bigint AS fence;
