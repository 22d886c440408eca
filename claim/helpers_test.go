package claim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

// jobsTable is the spec used by most tests; createJobs creates it.
var jobsTable = Table{
	Name:       "jobs",
	Key:        "id",
	State:      "state",
	ClaimedAt:  "claimed_at",
	ClaimedBy:  "claimed_by",
	Fence:      "fence",
	LeaseUntil: "lease_until",
	Attempts:   "attempts",
}

var pausedOpts = Config{From: "PAUSED", To: "PROCESSING", Holder: "test"}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustExec(t testing.TB, db DBTX, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// createJobs creates table jobs with n PAUSED rows (ids 1..n), an effects
// table, and the recommended partial indexes.
func createJobs(t testing.TB, pool *pgxpool.Pool, keyType string, n int) {
	t.Helper()
	mustExec(t, pool, fmt.Sprintf(`CREATE TABLE jobs (
		id %s PRIMARY KEY,
		state text NOT NULL,
		claimed_at timestamptz,
		claimed_by text,
		fence bigint,
		lease_until timestamptz,
		attempts int NOT NULL DEFAULT 0)`, keyType))
	mustExec(t, pool, `CREATE INDEX jobs_paused_idx ON jobs (id) WHERE state = 'PAUSED'`)
	mustExec(t, pool, `CREATE INDEX jobs_processing_idx ON jobs (claimed_at) WHERE state = 'PROCESSING'`)
	mustExec(t, pool, fmt.Sprintf(`CREATE TABLE effects (job_id %s NOT NULL, holder text, fence bigint)`, keyType))
	if n > 0 {
		gen := "g"
		switch keyType {
		case "text":
			gen = "'job-' || g"
		case "uuid":
			gen = "md5(g::text)::uuid"
		}
		mustExec(t, pool, fmt.Sprintf(`INSERT INTO jobs (id, state) SELECT %s, 'PAUSED' FROM generate_series(1, $1) g`, gen), n)
	}
	mustExec(t, pool, `ANALYZE jobs`)
}

func newDB(t testing.TB) *pgtest.Database {
	t.Helper()
	return pgtest.NewDatabase(t)
}

func count(t testing.TB, db DBTX, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return n
}

// addAudit records every state change of jobs in table audit, one row per
// changed row, with the transaction that made it. It uses a statement-level
// trigger with transition tables, so it is cheap for big statements.
func addAudit(t testing.TB, pool *pgxpool.Pool, keyType string) {
	t.Helper()
	mustExec(t, pool, fmt.Sprintf(`CREATE TABLE audit (id %s, old_state text, new_state text, fence bigint, txid bigint)`, keyType))
	mustExec(t, pool, `CREATE FUNCTION audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO audit
  SELECT n.id, o.state, n.state, n.fence, txid_current()
  FROM new_rows n JOIN old_rows o USING (id)
  WHERE o.state IS DISTINCT FROM n.state;
  RETURN NULL;
END $$`)
	mustExec(t, pool, `CREATE TRIGGER jobs_audit AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION audit_fn()`)
}

// exactlyOnce fails t unless every one of n jobs has exactly one effect and
// was claimed (moved PAUSED -> PROCESSING) exactly once.
func exactlyOnce(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	if got := count(t, pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`); got != n {
		t.Errorf("%d of %d rows DONE", got, n)
	}
	if got := count(t, pool, `SELECT count(*) FROM effects`); got != n {
		t.Errorf("%d effects for %d rows", got, n)
	}
	if got := count(t, pool, `SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id HAVING count(*) > 1) d`); got != 0 {
		t.Errorf("%d rows with more than one effect", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.job_id = j.id)`); got != 0 {
		t.Errorf("%d rows without an effect", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM audit WHERE old_state = 'PAUSED' AND new_state = 'PROCESSING'`); got != n {
		t.Errorf("%d claims for %d rows", got, n)
	}
	if got := count(t, pool, `SELECT count(*) FROM (SELECT id FROM audit WHERE new_state = 'PROCESSING' GROUP BY id HAVING count(*) > 1) d`); got != 0 {
		t.Errorf("%d rows claimed more than once", got)
	}
	// Each effect was written by the claim that finished the row.
	if got := count(t, pool, `SELECT count(*) FROM effects e JOIN jobs j ON j.id = e.job_id WHERE e.fence <> j.fence OR e.holder <> j.claimed_by`); got != 0 {
		t.Errorf("%d effects from a holder other than the finishing one", got)
	}
}
