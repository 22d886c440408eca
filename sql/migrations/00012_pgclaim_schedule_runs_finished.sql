-- Retention's index: a schedule's finished runs by when they finished.
-- Released migrations are never edited; add a new file.

-- +goose Up
-- Each retention statement takes a schedule's oldest finished runs
-- (ORDER BY finished_at LIMIT 1000). Without an index it scanned and
-- sorted every run of the table for each batch: 147 ms a batch over
-- 864,000 runs on a 2-core machine, and, the table growing with the
-- history retention is there to cut, past the statement's 5 s bound on a
-- first deployment over months of runs, so no batch ever finished. With
-- it a batch reads its 1,000 rows. Built in the migration's transaction, as
-- 00007's index on the same table (pgclaim schema prints one script): the
-- build holds writes to the runs table for its length; the previous
-- release's runs wait, none is lost, and its statements run unchanged
-- (docs/upgrades.md).
CREATE INDEX IF NOT EXISTS pgclaim_schedule_runs_finished_idx ON pgclaim_schedule_runs (schedule, finished_at)
    WHERE finished_at IS NOT NULL;

-- +goose Down
DROP INDEX IF EXISTS pgclaim_schedule_runs_finished_idx;
