-- Finding a schedule's running and retrying runs without reading its
-- backlog. Released migrations are never edited; add a new file.

-- +goose Up
-- Each pass of a schedule's runner reads the schedule's running and
-- retrying runs (and a few of its oldest pending ones). Through the index
-- of open runs that read stepped over every pending run of the schedule,
-- so working off a backlog of n instants (a catch-up, a backfill) cost
-- time quadratic in n. This index holds only the runs being attempted:
-- one or a few per schedule. A claim adds an entry (no update that makes a
-- run running could be heap-only anyway, as state is in the open index's
-- predicate); a lease renewal changes no indexed column and stays
-- heap-only.
CREATE INDEX IF NOT EXISTS pgclaim_schedule_runs_active_idx ON pgclaim_schedule_runs (schedule, instant)
    WHERE state IN ('running', 'retrying');

-- +goose Down
DROP INDEX IF EXISTS pgclaim_schedule_runs_active_idx;
