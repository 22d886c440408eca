-- Leadership terms of gate.Elector, and HOT updates for lease locks.
-- Released migrations are never edited; add a new file.

-- +goose Up
-- One row per term won: who led which election, with which fencing token,
-- from when to when (database time). The open term (ended_at IS NULL) is the
-- current leader; the partial unique index lets at most one exist per
-- election. A checker verifies that no two terms of an election overlap:
-- every ended_at is at or before the next term's started_at.
--
-- The lease variant of the elector keeps its lease in lease_until and renews
-- it; the advisory variant holds a session advisory lock instead and leaves
-- lease_until NULL.
CREATE TABLE pgclaim_terms (
    election    text        NOT NULL CHECK (election <> ''),
    term        bigint      NOT NULL,
    holder      text        NOT NULL,
    method      text        NOT NULL CHECK (method IN ('advisory', 'lease')),
    started_at  timestamptz NOT NULL,
    lease_until timestamptz,
    ended_at    timestamptz,
    end_reason  text CHECK (end_reason IN ('resigned', 'lost', 'expired', 'superseded')),
    PRIMARY KEY (election, term),
    CHECK ((ended_at IS NULL) = (end_reason IS NULL)),
    CHECK (ended_at IS NULL OR ended_at >= started_at),
    CHECK ((method = 'lease') = (lease_until IS NOT NULL))
);
CREATE UNIQUE INDEX pgclaim_terms_open_idx ON pgclaim_terms (election) WHERE ended_at IS NULL;
-- Retention and "recent terms" views read by start time.
CREATE INDEX pgclaim_terms_started_at_idx ON pgclaim_terms (started_at);

-- Every acquisition, extension and release of a lease lock updates
-- lock_until. Indexed, that column forces each update to add index entries
-- (no heap-only tuple update), and a hot lock row bloats its primary key
-- until vacuum: the lease cycle ran 1.5-5x slower than with the index
-- dropped (BenchmarkLeaseCycle). The table holds one row per lock name and
-- is read whole, so the index bought nothing.
DROP INDEX IF EXISTS pgclaim_locks_lock_until_idx;

-- +goose Down
CREATE INDEX pgclaim_locks_lock_until_idx ON pgclaim_locks (lock_until);
DROP TABLE pgclaim_terms;
