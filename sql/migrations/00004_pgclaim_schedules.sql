-- Schedules stored in Postgres (package schedule). Released migrations are
-- never edited; add a new file.

-- +goose Up
-- One row per schedule: its definition, as the highest definition version
-- registered so far left it, and its operational state (paused), which
-- registration never touches. Durations are intervals; the package writes
-- them from microseconds.
CREATE TABLE pgclaim_schedules (
    name              text        PRIMARY KEY CHECK (name <> ''),
    spec              text        NOT NULL CHECK (spec <> ''),
    time_zone         text        NOT NULL CHECK (time_zone <> ''),
    version           integer     NOT NULL CHECK (version >= 1),
    -- Catch-up of instants that came due while no instance ran or while
    -- paused: none (each recorded skipped), latest (the newest runs), all
    -- (each within the window, up to the cap, oldest first).
    catch_up          text        NOT NULL CHECK (catch_up IN ('none', 'latest', 'all')),
    catch_up_window   interval    NOT NULL CHECK (catch_up_window >= interval '0'),
    catch_up_cap      integer     NOT NULL CHECK (catch_up_cap >= 1),
    -- An instant due while the previous run still runs: skip (recorded
    -- skipped), buffer_one (runs when the current one ends), buffer_all (every one
    -- runs, oldest first) or replace (the
    -- previous run is cancelled and recorded skipped; the new one runs).
    overlap           text        NOT NULL CHECK (overlap IN ('skip', 'buffer_one', 'buffer_all', 'replace')),
    max_attempts      integer     NOT NULL CHECK (max_attempts >= 1),
    backoff           interval    NOT NULL CHECK (backoff >= interval '0'),
    max_backoff       interval    NOT NULL CHECK (max_backoff >= interval '0'),
    -- An attempt running longer than expected_duration (when > 0) is
    -- overdue; a run whose first attempt started more than late_after after
    -- its instant is late.
    expected_duration interval    NOT NULL CHECK (expected_duration >= interval '0'),
    late_after        interval    NOT NULL DEFAULT interval '10 seconds' CHECK (late_after > interval '0'),
    -- Each scheduled instant's start is delayed by up to jitter (a fixed
    -- amount per instant); the instant itself stays the scheduled one.
    jitter            interval    NOT NULL DEFAULT interval '0' CHECK (jitter >= interval '0'),
    lease             interval    NOT NULL CHECK (lease > interval '0'),
    paused            boolean     NOT NULL DEFAULT false,
    paused_note       text,
    paused_by         text,
    -- paused_at is when the latest pause began and resumed_at when it
    -- ended (NULL while paused): instants between them are not missed.
    paused_at         timestamptz,
    resumed_at        timestamptz,
    -- Scheduler.Prune deleted finished runs of instants up to pruned_until:
    -- those instants are never recorded again nor reported missed.
    pruned_until      timestamptz,
    -- Instants at or before starts_at were never due under this
    -- definition: it is the registration's time, moved when a new version
    -- changes the spec or the zone.
    starts_at         timestamptz NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    CHECK (NOT paused OR (paused_at IS NOT NULL AND resumed_at IS NULL)),
    CHECK (paused OR paused_at IS NULL OR resumed_at IS NOT NULL)
);

-- One row per (schedule, instant) that came due, was triggered or
-- backfilled. The primary key makes each instant claimed once; every row
-- ends succeeded, failed (after its attempts, with reason) or skipped (with
-- reason). fence is the current attempt's fencing token: a finish, renewal
-- or takeover is a compare-and-swap on it.
CREATE TABLE pgclaim_schedule_runs (
    schedule        text        NOT NULL REFERENCES pgclaim_schedules (name) ON DELETE CASCADE,
    instant         timestamptz NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('scheduled', 'triggered', 'backfill')),
    state           text        NOT NULL
        CHECK (state IN ('pending', 'running', 'retrying', 'succeeded', 'failed', 'skipped')),
    attempt         integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    fence           bigint,
    holder          text,
    lease_until     timestamptz,
    next_attempt_at timestamptz,
    -- missed: the instant was recorded after its grace had passed (no
    -- instance recorded it in time); catch-up then decided its fate.
    missed          boolean     NOT NULL DEFAULT false,
    -- A pending run does not start before start_after (its instant plus
    -- its jitter delay); NULL: at once.
    start_after     timestamptz,
    -- late: the first attempt started more than the schedule's late_after
    -- after start_after, or the instant (backfilled runs are never late);
    -- overdue: an attempt ran past the schedule's expected_duration. Both
    -- stay set.
    late            boolean     NOT NULL DEFAULT false,
    overdue         boolean     NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz,
    reason          text,
    PRIMARY KEY (schedule, instant),
    CHECK ((state = 'running') = (lease_until IS NOT NULL)),
    CHECK ((state = 'retrying') = (next_attempt_at IS NOT NULL)),
    CHECK ((state IN ('succeeded', 'failed', 'skipped')) = (finished_at IS NOT NULL)),
    CHECK (state NOT IN ('failed', 'skipped') OR reason IS NOT NULL),
    CHECK (state NOT IN ('running', 'retrying', 'succeeded', 'failed') OR (attempt >= 1 AND fence IS NOT NULL))
);
-- Unfinished runs, for the scheduler's wake-ups (pending, retry due, dead
-- holders).
CREATE INDEX pgclaim_schedule_runs_open_idx ON pgclaim_schedule_runs (schedule, instant)
    WHERE state IN ('pending', 'running', 'retrying');
-- At most one open triggered run per schedule: two operators triggering
-- together get one run.
CREATE UNIQUE INDEX pgclaim_schedule_runs_trigger_idx ON pgclaim_schedule_runs (schedule)
    WHERE kind = 'triggered' AND state IN ('pending', 'running', 'retrying');

-- +goose Down
DROP TABLE pgclaim_schedule_runs;
DROP TABLE pgclaim_schedules;
