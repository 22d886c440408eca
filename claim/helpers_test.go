package claim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/pgtest"
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

var pausedOpts = Options{From: "PAUSED", To: "PROCESSING", Holder: "test"}

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
	mustExec(t, pool, fmt.Sprintf(`CREATE TABLE effects (job_id %s NOT NULL, holder text, token bigint)`, keyType))
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
