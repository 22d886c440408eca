-- Heap-only lease updates. Released migrations are never edited; add a new
-- file.

-- +goose Up
-- Every acquisition, renewal and release of a lease (gate.Lease, the lease
-- elector's locks, the scheduler's lease locks) updates lock_until. The
-- index on lock_until, which no statement reads (the operator's listing
-- reads the table by name), made each of those updates add an entry to it
-- and to the primary key: none could be heap-only. Without it no index
-- covers a column an update changes, so the updates stay on their page.
DROP INDEX IF EXISTS pgclaim_locks_lock_until_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS pgclaim_locks_lock_until_idx ON pgclaim_locks (lock_until);
