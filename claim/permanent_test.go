package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// permanentBound is how long a Drain or Run that meets an error that cannot
// go away may take at most before the test gives up on it; the call is
// expected to end at once, long before.
const permanentBound = 20 * time.Second

// runBoth runs the worker built by mk with Drain and then with Run (on a
// fresh worker and fresh rows, see reset), each under permanentBound, and
// calls check with the result.
func runBoth(t *testing.T, reset func(), mk func() *Worker[int64], check func(t *testing.T, how string, st Stats, err error)) {
	t.Helper()
	for _, how := range []string{"Drain", "Run"} {
		reset()
		w := mk()
		ctx, cancel := context.WithTimeout(testCtx(t), permanentBound)
		var st Stats
		var err error
		if how == "Drain" {
			st, err = w.Drain(ctx)
		} else {
			st, err = w.Run(ctx)
		}
		ended := ctx.Err()
		cancel()
		if ended != nil {
			t.Errorf("%s: still running after %v (stats %+v, err %v)", how, permanentBound, st, err)
			continue
		}
		check(t, how, st, err)
	}
}

// TestWorkerDoneRejectedByEnum: the state column becomes an enum without
// the Done label after the worker is built. Work runs, its finish fails for
// good: the row is not counted done, its effect rolls back, and Drain and
// Run end at once with an error matching ErrInvalid that names the state.
func TestWorkerDoneRejectedByEnum(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := newWorkerPool(t, db, 6)
	reset := func() {
		mustExec(t, db.Pool, `DROP TABLE IF EXISTS jobs, effects`)
		mustExec(t, db.Pool, `DROP TYPE IF EXISTS job_state`)
		createJobs(t, db.Pool, "bigint", 20)
		pool.Reset()
	}
	mk := func() *Worker[int64] {
		c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		w, err := NewWorker(c, WorkerConfig[int64]{Work: effectWork("w"), Done: "DONE", Failed: "FAILED",
			Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, BatchSize: 5, Concurrency: 2, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, db.Pool, `CREATE TYPE job_state AS ENUM ('PAUSED', 'PROCESSING', 'FAILED')`)
		mustExec(t, db.Pool, `DROP INDEX jobs_paused_idx, jobs_processing_idx`)
		mustExec(t, db.Pool, `ALTER TABLE jobs ALTER COLUMN state TYPE job_state USING state::job_state`)
		return w
	}
	runBoth(t, reset, mk, func(t *testing.T, how string, st Stats, err error) {
		t.Logf("%s: stats %+v, err %v", how, st, err)
		wantInvalid(t, how, err, "WorkerConfig.Done", `"DONE"`)
		if st.Succeeded != 0 {
			t.Errorf("%s: %d claims counted done, whose finish failed", how, st.Succeeded)
		}
		if st.Claimed == 0 || st.Failed+st.Lost+st.Released+st.Unrecorded != st.Claimed {
			t.Errorf("%s: stats %+v: every claim must be accounted for, none as retried or done", how, st)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM effects`); n != 0 {
			t.Errorf("%s: %d effects survived a finish that failed", how, n)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'FAILED'`); n != st.Failed {
			t.Errorf("%s: %d rows FAILED, %d counted", how, n, st.Failed)
		}
	})
}

// TestWorkerFailedRejectedByCheck: a CHECK constraint added after the
// worker is built rejects its Failed state. Work fails, and the failure
// cannot be recorded: each such claim is counted in Stats.Unrecorded, and
// Drain and Run end at once with an error matching ErrInvalid that names
// the state.
func TestWorkerFailedRejectedByCheck(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := newWorkerPool(t, db, 6)
	reset := func() {
		mustExec(t, db.Pool, `DROP TABLE IF EXISTS jobs, effects`)
		createJobs(t, db.Pool, "bigint", 20)
		pool.Reset()
	}
	mk := func() *Worker[int64] {
		c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w"})
		if err != nil {
			t.Fatal(err)
		}
		w, err := NewWorker(c, WorkerConfig[int64]{
			Work:      func(context.Context, pgx.Tx, Claim[int64]) error { return errors.New("work fails") },
			Done:      "DONE",
			Failed:    "FAILED",
			BatchSize: 5, Concurrency: 2, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, db.Pool, `ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('PAUSED', 'PROCESSING', 'DONE'))`)
		return w
	}
	runBoth(t, reset, mk, func(t *testing.T, how string, st Stats, err error) {
		t.Logf("%s: stats %+v, err %v", how, st, err)
		wantInvalid(t, how, err, "WorkerConfig.Failed", `"FAILED"`)
		if st.Unrecorded == 0 || st.Failed != 0 || st.Succeeded != 0 {
			t.Errorf("%s: stats %+v: want the unrecorded failures counted, none failed or done", how, st)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PROCESSING'`); n != st.Unrecorded {
			t.Errorf("%s: %d rows left PROCESSING, %d counted unrecorded", how, n, st.Unrecorded)
		}
	})
}

// TestWorkerClaimFailsForGood: a claim statement that cannot succeed — a
// column Config.Where names that the table lacks, or a From state that is
// not a label of the column's enum — ends Drain and Run at once with an
// error matching ErrInvalid that names the column or the state, instead of
// being retried every PollInterval.
func TestWorkerClaimFailsForGood(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := newWorkerPool(t, db, 6)
	cases := []struct {
		name  string
		opts  Config
		alter string
		names []string
	}{
		{"undefined column", Config{From: "PAUSED", To: "PROCESSING", Where: "tenant = 1"}, "", []string{`"tenant"`}},
		{"enum", Config{From: "Paused", To: "PROCESSING"},
			`CREATE TYPE job_state AS ENUM ('PAUSED', 'PROCESSING', 'DONE', 'FAILED');
			 DROP INDEX jobs_paused_idx, jobs_processing_idx;
			 ALTER TABLE jobs ALTER COLUMN state TYPE job_state USING state::job_state`, []string{`"Paused"`, "Config.From"}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			reset := func() {
				mustExec(t, db.Pool, `DROP TABLE IF EXISTS jobs, effects`)
				mustExec(t, db.Pool, `DROP TYPE IF EXISTS job_state`)
				createJobs(t, db.Pool, "bigint", 5)
				pool.Reset()
			}
			mk := func() *Worker[int64] {
				c, err := New[int64](pool, jobsTable, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				w, err := NewWorker(c, WorkerConfig[int64]{Work: effectWork("w"), Done: "DONE", Failed: "FAILED",
					BatchSize: 5, PollInterval: 10 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if tc.alter != "" {
					mustExec(t, db.Pool, tc.alter)
				}
				return w
			}
			runBoth(t, reset, mk, func(t *testing.T, how string, st Stats, err error) {
				t.Logf("%s: stats %+v, err %v", how, st, err)
				wantInvalid(t, how, err, tc.names...)
				if st.Claimed != 0 {
					t.Errorf("%s: stats %+v, want nothing claimed", how, st)
				}
			})
		})
	}
}

// TestPermanentCodes: the SQLSTATEs a worker takes as failures that cannot
// go away, and some that can.
func TestPermanentCodes(t *testing.T) {
	for code, want := range map[string]bool{
		"42703": true, "42P01": true, "42883": true, "42804": true, "42601": true, "42501": true,
		"3F000": true, "22P02": true, "22001": true, "23502": true, "23514": true, "0A000": true,
		"40001": false, "40P01": false, "08006": false, "57014": false, "23505": false, "23503": false,
		"25006": false, "53300": false,
	} {
		err := fmt.Errorf("claim: ClaimBatch: %w", &pgconn.PgError{Code: code})
		if got := permanent(err); got != want {
			t.Errorf("permanent(%s) = %v, want %v", code, got, want)
		}
	}
	if permanent(errors.New("plain")) || permanent(context.DeadlineExceeded) {
		t.Error("an error without SQLSTATE taken as permanent")
	}
}
