package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statements over claims the caller already holds (FinishBatch, Finish,
// Extend, Release, the worker's heartbeat) and the update half of batch
// claims and sweeps must cost in proportion to the rows they touch, also
// when the table's statistics predate a burst of claims: statistics taken
// while every row was PAUSED say that no row is PROCESSING, and a plan
// trusting them once took a second and a half to finish 1,000 claims.
//
// The tests count the rows each statement reads from the table, in its own
// transaction, with pg_stat_xact_user_tables: rows returned by sequential
// scans plus rows fetched through indexes, before any filter. That is a
// property of the plan's shape, not of the machine's speed. Each is checked
// with custom plans (what the server plans with the actual values) and with
// generic plans (what it plans once for a statement it has cached).

const (
	staleRows  = 200_000
	staleBatch = 1000
)

// staleIndexes are the index sets the tests run with, besides the primary
// key: the partial index for batch claims alone (as in the benchmark's
// table), the two recommended partial indexes, and plain indexes on the
// columns the statements compare (which a plan trusting stale statistics
// would prefer to the key).
var staleIndexes = []struct {
	name string
	ddl  []string
	// claims and sweeps select rows by state: bounded only with the
	// partial index that serves each selection.
	claimIndexed, sweepIndexed bool
}{
	{"paused", []string{`CREATE INDEX ON jobs (id) WHERE state = 'PAUSED'`}, true, false},
	{"recommended", []string{
		`CREATE INDEX ON jobs (id) WHERE state = 'PAUSED'`,
		`CREATE INDEX ON jobs (claimed_at) WHERE state = 'PROCESSING'`,
	}, true, true},
	{"plain", []string{
		`CREATE INDEX ON jobs (state)`,
		`CREATE INDEX ON jobs (claimed_at)`,
		`CREATE INDEX ON jobs (lease_until)`,
		`CREATE INDEX ON jobs (fence)`,
	}, false, false},
}

// createStaleJobs creates jobs with staleRows PAUSED rows and the given
// indexes, analyzes it, and turns autovacuum off for it, so that its
// statistics keep saying that every row is PAUSED.
func createStaleJobs(t *testing.T, pool *pgxpool.Pool, ddl []string) {
	t.Helper()
	mustExec(t, pool, `CREATE TABLE jobs (
		id bigint PRIMARY KEY,
		state text NOT NULL,
		claimed_at timestamptz,
		claimed_by text,
		fence bigint,
		lease_until timestamptz,
		attempts int NOT NULL DEFAULT 0) WITH (autovacuum_enabled = false)`)
	for _, s := range ddl {
		mustExec(t, pool, s)
	}
	mustExec(t, pool, `INSERT INTO jobs (id, state) SELECT g, 'PAUSED' FROM generate_series(1, $1::int) g`, staleRows)
	mustExec(t, pool, `ANALYZE jobs`)
}

// planModes are the plan_cache_mode settings statements are measured under.
var planModes = []string{"force_custom_plan", "force_generic_plan"}

// readRows runs fn in a transaction with plan_cache_mode set to mode and
// returns the rows it read from jobs; the transaction commits.
func readRows(t *testing.T, pool *pgxpool.Pool, mode string, fn func(ctx context.Context, tx pgx.Tx) error) int64 {
	t.Helper()
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustExec(t, tx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
	read := func() int64 {
		var n int64
		err := tx.QueryRow(ctx, `SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)
FROM pg_stat_xact_user_tables WHERE relid = 'jobs'::regclass`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	if err := fn(ctx, tx); err != nil {
		t.Fatal(err)
	}
	n := read() - before
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

func checkRead(t *testing.T, what string, read, limit int64) {
	t.Helper()
	if read > limit {
		t.Errorf("%s read %d rows of the table, want at most %d", what, read, limit)
	} else {
		t.Logf("%s read %d rows", what, read)
	}
}

func TestStaleStatistics(t *testing.T) {
	t.Parallel()
	for _, ix := range staleIndexes {
		t.Run(ix.name, func(t *testing.T) {
			t.Parallel()
			staleStatistics(t, ix.ddl, ix.claimIndexed, ix.sweepIndexed)
		})
	}
}

func staleStatistics(t *testing.T, ddl []string, claimIndexed, sweepIndexed bool) {
	db := newDB(t)
	pool := db.Pool
	createStaleJobs(t, pool, ddl)
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "stale", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const n = staleBatch

	// A burst of claims the statistics do not know of: 12 batches.
	var batches [][]Claim[int64]
	// Half of them planned generically, as a statement the server has
	// cached is after a few executions.
	for i := range 12 {
		var batch []Claim[int64]
		mode := planModes[i%len(planModes)]
		read := readRows(t, pool, mode, func(ctx context.Context, tx pgx.Tx) error {
			batch, err = c.WithTx(tx).ClaimBatch(ctx, n)
			return err
		})
		if len(batch) != n {
			t.Fatalf("batch %d: claimed %d rows", i, len(batch))
		}
		if claimIndexed {
			checkRead(t, fmt.Sprintf("ClaimBatch(%d) #%d, %s", n, i, mode), read, 3*n)
		}
		batches = append(batches, batch)
	}
	next := func() []Claim[int64] {
		b := batches[0]
		batches = batches[1:]
		return b
	}

	for _, mode := range planModes {
		batch := next()
		read := readRows(t, pool, mode, func(ctx context.Context, tx pgx.Tx) error {
			done, lost, err := c.WithTx(tx).FinishBatch(ctx, batch, "DONE")
			if err == nil && (len(done) != n || len(lost) != 0) {
				err = fmt.Errorf("done %d, lost %d", len(done), len(lost))
			}
			return err
		})
		checkRead(t, "FinishBatch, "+mode, read, 2*n)

		// The heartbeat, with one claim it cannot find (so that it also
		// runs its second statement, which tells lost from locked).
		batch = next()
		read = readRows(t, pool, mode, func(ctx context.Context, tx pgx.Tx) error {
			cls := append(batch[:n:n], Claim[int64]{Key: batch[0].Key, Fence: batch[0].Fence - 1_000_000})
			lost, err := c.WithTx(tx).heartbeat(ctx, cls, 2*time.Hour)
			if err != nil {
				return err
			}
			for i, l := range lost {
				if l != (i == n) {
					return fmt.Errorf("heartbeat: claim %d lost = %v", i, l)
				}
			}
			return nil
		})
		checkRead(t, "heartbeat (extend, then check held), "+mode, read, 4*n)

		// Single-row statements.
		batch = next()
		read = readRows(t, pool, mode, func(ctx context.Context, tx pgx.Tx) error {
			c := c.WithTx(tx)
			if _, err := c.Extend(ctx, batch[0], 2*time.Hour); err != nil {
				return err
			}
			if err := c.Release(ctx, batch[1]); err != nil {
				return err
			}
			if err := c.Finish(ctx, batch[2], "DONE"); err != nil {
				return err
			}
			if err := c.Finish(ctx, batch[2], "DONE"); !errors.Is(err, ErrLost) {
				return fmt.Errorf("finish again: %v", err)
			}
			_, err := c.Claim(ctx, batch[1].Key)
			return err
		})
		checkRead(t, "Extend, Release, Finish twice, Claim, "+mode, read, 10)
	}

	// The sweeper, over the rows still PROCESSING, after their leases
	// passed; the statistics say that there are none. Then over two more
	// batches, planned generically.
	for i, mode := range planModes {
		if i > 0 {
			for range 2 {
				if _, err := c.ClaimBatch(testCtx(t), n); err != nil {
					t.Fatal(err)
				}
			}
		}
		left := count(t, pool, `SELECT count(*) FROM jobs WHERE state = 'PROCESSING'`)
		mustExec(t, pool, `UPDATE jobs SET lease_until = now() - interval '1 minute' WHERE state = 'PROCESSING'`)
		read := readRows(t, pool, mode, func(ctx context.Context, tx pgx.Tx) error {
			sw, err := NewSweeper(c.WithTx(tx), SweeperConfig[int64]{Failed: "FAILED", BatchSize: n})
			if err != nil {
				return err
			}
			swept, err := sw.Sweep(ctx)
			if err == nil && len(swept) != left {
				err = fmt.Errorf("swept %d of %d rows", len(swept), left)
			}
			return err
		})
		if sweepIndexed {
			checkRead(t, fmt.Sprintf("Sweep of %d rows, %s", left, mode), read, int64(3*left+n))
		}
	}

	// A burst of new PAUSED rows after statistics that say there are none.
	mustExec(t, pool, `UPDATE jobs SET state = 'DONE'`)
	mustExec(t, pool, `ANALYZE jobs`)
	mustExec(t, pool, `UPDATE jobs SET state = 'PAUSED' WHERE id > $1::int`, staleRows/2)
	for _, mode := range planModes {
		read := readRows(t, pool, mode, func(ctx context.Context, tx pgx.Tx) error {
			batch, err := c.WithTx(tx).ClaimBatch(ctx, n)
			if err == nil && len(batch) != n {
				err = fmt.Errorf("claimed %d rows", len(batch))
			}
			return err
		})
		if claimIndexed {
			checkRead(t, "ClaimBatch after a burst of PAUSED rows, "+mode, read, 3*n)
		}
	}
}

// explainer is a DBTX on a transaction that runs every statement twice:
// first under EXPLAIN ANALYZE, rolled back to a savepoint, keeping the
// plan; then for real.
type explainer struct {
	tx    pgx.Tx
	plans []json.RawMessage
}

func (e *explainer) explain(ctx context.Context, sql string, args []any) error {
	if _, err := e.tx.Exec(ctx, "SAVEPOINT pgclaim_explain"); err != nil {
		return err
	}
	var plan json.RawMessage
	if err := e.tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
		return err
	}
	e.plans = append(e.plans, plan)
	_, err := e.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT pgclaim_explain")
	return err
}

func (e *explainer) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := e.explain(ctx, sql, args); err != nil {
		return pgconn.CommandTag{}, err
	}
	return e.tx.Exec(ctx, sql, args...)
}

func (e *explainer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := e.explain(ctx, sql, args); err != nil {
		return nil, err
	}
	return e.tx.Query(ctx, sql, args...)
}

func (e *explainer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := e.explain(ctx, sql, args); err != nil {
		return errRow{err}
	}
	return e.tx.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// planNode is the part of EXPLAIN (FORMAT JSON) the test reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	ActualLoops  float64    `json:"Actual Loops"`
	ActualRows   float64    `json:"Actual Rows"`
	Plans        []planNode `json:"Plans"`
}

// scansOf lists the executed scan nodes on relation rel.
func scansOf(n planNode, rel string, out []planNode) []planNode {
	if n.RelationName == rel && n.ActualLoops > 0 && n.NodeType != "ModifyTable" {
		out = append(out, n)
	}
	for _, c := range n.Plans {
		out = scansOf(c, rel, out)
	}
	return out
}

// TestFinishBatchPlan: FinishBatch of 1,000 claims on a 200,000-row table
// whose statistics say no row is PROCESSING (taken before the claims) runs
// one index scan of the table, looked up by key, and no sequential scan.
// The plan shape that made it slow was a sequential scan of the table
// joined to the 1,000 claims, estimated at one row.
func TestFinishBatchPlan(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createStaleJobs(t, db.Pool, staleIndexes[0].ddl)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	var batch []Claim[int64]
	for range 5 {
		if batch, err = c.ClaimBatch(ctx, staleBatch); err != nil || len(batch) != staleBatch {
			t.Fatalf("claim: %d rows, %v", len(batch), err)
		}
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ex := &explainer{tx: tx}
	done, lost, err := c.WithTx(ex).FinishBatch(ctx, batch, "DONE")
	if err != nil || len(done) != staleBatch || len(lost) != 0 {
		t.Fatalf("FinishBatch: done %d, lost %d, %v", len(done), len(lost), err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(ex.plans) != 1 {
		t.Fatalf("%d statements, want 1", len(ex.plans))
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(ex.plans[0], &plans); err != nil || len(plans) != 1 {
		t.Fatalf("plan %s: %v", ex.plans[0], err)
	}
	scans := scansOf(plans[0].Plan, "jobs", nil)
	if len(scans) != 1 {
		t.Errorf("%d executed scans of jobs, want 1", len(scans))
	}
	for _, s := range scans {
		if s.NodeType == "Seq Scan" || s.ActualLoops != 1 || !strings.HasPrefix(s.IndexName, "jobs_pkey") {
			t.Errorf("scan of jobs: %s on %q, %v loops, want one index scan on jobs_pkey", s.NodeType, s.IndexName, s.ActualLoops)
		}
	}
	if t.Failed() {
		t.Logf("plan: %s", ex.plans[0])
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`); n != staleBatch {
		t.Fatalf("%d rows DONE", n)
	}
}
