-- pgclaim's own tables: the fencing-token sequence, the tick ledger and the
-- lease-lock table. Released migrations are never edited; add a new file.

-- +goose Up
-- Fencing tokens: every claim, tick and lease gets a fresh, strictly increasing
-- number. A holder whose token is no longer the current one cannot write.
CREATE SEQUENCE pgclaim_fence_seq AS bigint START 1;

-- Tick ledger: one row per (job, scheduled instant). The primary key decides
-- which instance runs the tick: the first INSERT wins, every other one conflicts.
CREATE TABLE pgclaim_ticks (
    job         text        NOT NULL CHECK (job <> ''),
    fire_at     timestamptz NOT NULL,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    outcome     text        NOT NULL DEFAULT 'running'
        CHECK (outcome IN ('running', 'succeeded', 'failed', 'abandoned', 'lost')),
    error       text,
    PRIMARY KEY (job, fire_at)
);
-- Retention prunes by age; the operator's "recent ticks" view reads newest first.
CREATE INDEX pgclaim_ticks_started_at_idx ON pgclaim_ticks (started_at);
-- Ticks still running (for abandoned-run detection and status views).
CREATE INDEX pgclaim_ticks_running_idx ON pgclaim_ticks (job, started_at) WHERE outcome = 'running';

-- Lease locks: ShedLock-style rows with database-time expiry and a fencing token,
-- for places where session advisory locks cannot live (transaction pooling).
CREATE TABLE pgclaim_locks (
    name       text        PRIMARY KEY CHECK (name <> ''),
    holder     text        NOT NULL,
    locked_at  timestamptz NOT NULL,
    lock_until timestamptz NOT NULL,
    fence      bigint      NOT NULL
);
CREATE INDEX pgclaim_locks_lock_until_idx ON pgclaim_locks (lock_until);

-- +goose Down
DROP TABLE pgclaim_locks;
DROP TABLE pgclaim_ticks;
DROP SEQUENCE pgclaim_fence_seq;
