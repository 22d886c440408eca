-- Heap-only finishes for the tick ledger. Released migrations are never
-- edited; add a new file.

-- +goose Up
-- Every run finishes its tick with one UPDATE of finished_at, outcome and
-- error. The partial index on running ticks has outcome in its predicate, so
-- that UPDATE could never be heap-only: each finish added a primary-key and a
-- started_at index entry, and left a dead entry in the partial index that
-- every scan of it stepped over until vacuum (a claim that probed it for
-- abandoned ticks ran ~30 µs slower in a tight loop). Indexing (job,
-- started_at) without a predicate serves the same reads: a job's most
-- recently started tick (the one a dead holder leaves running, which the
-- next claim checks) and status views. No index now covers a column a finish
-- changes, and fillfactor 90 leaves room on each page for the finished
-- version, so finishes stay on their page (n_tup_hot_upd = n_tup_upd).
DROP INDEX IF EXISTS pgclaim_ticks_running_idx;
CREATE INDEX IF NOT EXISTS pgclaim_ticks_job_started_at_idx ON pgclaim_ticks (job, started_at);
ALTER TABLE pgclaim_ticks SET (fillfactor = 90);

-- +goose Down
ALTER TABLE pgclaim_ticks RESET (fillfactor);
DROP INDEX IF EXISTS pgclaim_ticks_job_started_at_idx;
CREATE INDEX IF NOT EXISTS pgclaim_ticks_running_idx ON pgclaim_ticks (job, started_at) WHERE outcome = 'running';
