-- Leadership terms of gate.Elector. Released migrations are never edited;
-- add a new file.

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

-- +goose Down
DROP TABLE pgclaim_terms;
