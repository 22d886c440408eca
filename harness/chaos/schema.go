package chaos

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// schema is the workload's own schema, applied on top of pgclaim's
// migrations. Nothing here hides a duplicate: effect tables have no unique
// constraint, so a row or instant that took effect twice shows up as two rows.
const schema = `
-- The claimed rows: the field's "paused pushes".
CREATE TABLE chaos_rows (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state       text        NOT NULL DEFAULT 'PAUSED'
        CHECK (state IN ('PAUSED', 'PROCESSING', 'DONE', 'FAILED')),
    claimed_at  timestamptz,
    claimed_by  text,
    fence       bigint,
    lease_until timestamptz,
    attempts    int         NOT NULL DEFAULT 0,
    reason      text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chaos_rows_paused_idx ON chaos_rows (id) WHERE state = 'PAUSED';
CREATE INDEX chaos_rows_processing_idx ON chaos_rows (lease_until) WHERE state = 'PROCESSING';

-- A row moved to FAILED always carries a reason: the worker writes its own
-- with the finish, and the sweeper (claim.Table.Reason) says why it failed a
-- row whose holder died or hung on every attempt.

-- One row per effect, written in the transaction that finishes the claim.
CREATE TABLE chaos_effects (
    row_id   bigint      NOT NULL,
    fence    bigint      NOT NULL,
    instance text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX chaos_effects_row_idx ON chaos_effects (row_id);

-- One row per run of the shared gate.Once job (tickJob), written by the
-- job: a tick that took effect twice shows as two rows of one fire_at.
CREATE TABLE chaos_tick_effects (
    fire_at  timestamptz NOT NULL,
    fence    bigint      NOT NULL,
    instance text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every finish a worker attempted, with its token and what came of it,
-- written after the finishing transaction ended (so refused ones stay).
CREATE TABLE chaos_audit (
    row_id   bigint      NOT NULL,
    fence    bigint      NOT NULL,
    instance text        NOT NULL,
    result   text        NOT NULL CHECK (result IN ('done', 'failed', 'retry', 'lost', 'error')),
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX chaos_audit_row_idx ON chaos_audit (row_id);

-- Rows the sweepers moved (from OnSwept).
CREATE TABLE chaos_sweeps (
    row_id   bigint      NOT NULL,
    fence    bigint      NOT NULL,
    state    text        NOT NULL,
    instance text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The schedules' job (chaos-s/<group>/<n>, one-second specs): one row per
-- attempt that started (written first thing, through the run's fence), and
-- one row per effect (written at the end, through the fence): an attempt
-- whose run was taken over, or whose lease expired, writes nothing.
CREATE TABLE chaos_sched_attempts (
    schedule text        NOT NULL,
    instant  timestamptz NOT NULL,
    attempt  int         NOT NULL,
    fence    bigint      NOT NULL,
    instance text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX chaos_sched_attempts_idx ON chaos_sched_attempts (schedule, instant);
CREATE TABLE chaos_sched_effects (LIKE chaos_sched_attempts INCLUDING DEFAULTS);
CREATE INDEX chaos_sched_effects_idx ON chaos_sched_effects (schedule, instant);

-- Every lease the database granted a run's attempt (its start and each
-- renewal), logged by a trigger in the granting transaction: the checks
-- compare the job's writes with the lease the database actually held, not
-- with one guessed from the host's clock (a renewal sent just before a
-- SIGSTOP can run at a starved server seconds later, and extend the lease
-- from then).
-- The harness's stall probe (stall.go) updates its one row.
CREATE TABLE chaos_probe (at timestamptz NOT NULL);
INSERT INTO chaos_probe VALUES (now());
CREATE TABLE chaos_sched_leases (
    schedule    text        NOT NULL,
    instant     timestamptz NOT NULL,
    fence       bigint      NOT NULL,
    lease_until timestamptz NOT NULL
);
CREATE FUNCTION chaos_log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_until IS NOT NULL AND NEW.fence IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.lease_until IS DISTINCT FROM OLD.lease_until) THEN
        INSERT INTO chaos_sched_leases VALUES (NEW.schedule, NEW.instant, NEW.fence, NEW.lease_until);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_log_lease AFTER INSERT OR UPDATE OF lease_until ON pgclaim_schedule_runs
    FOR EACH ROW EXECUTE FUNCTION chaos_log_lease();

-- Writes of the job the fence refused, and the scheduler's events (lost,
-- taken over, missed) as the instances saw them (best effort: a killed
-- process loses what it had not written yet).
CREATE TABLE chaos_sched_events (
    kind     text        NOT NULL,
    schedule text        NOT NULL,
    instant  timestamptz,
    attempt  int         NOT NULL,
    fence    bigint      NOT NULL,
    instance text        NOT NULL,
    detail   text        NOT NULL DEFAULT '',
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Schedule pauses the harness injected (database time: pause committed,
-- resume begun).
CREATE TABLE chaos_sched_pauses (
    schedule   text        NOT NULL,
    paused_at  timestamptz NOT NULL,
    resumed_at timestamptz
);

-- Leader heartbeats, written only while the writer's term is open.
CREATE TABLE chaos_leader_log (
    election text        NOT NULL,
    term     bigint      NOT NULL,
    instance text        NOT NULL,
    at       timestamptz NOT NULL
);
`

// templateName names the pgtest template holding pgclaim's migrations and
// the workload schema.
const templateName = "chaos"

func setupSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, schema)
	return err
}
