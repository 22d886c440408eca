package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/pgtest"
)

// reasonTable is jobsTable with the reason column of reasonJobs.
var reasonTable = func() Table {
	t := jobsTable
	t.Reason = "reason"
	return t
}()

// reasonJobs returns a database with n PAUSED jobs (see createJobs) and a
// reason column.
func reasonJobs(t testing.TB, n int) *pgtest.Database {
	t.Helper()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", n)
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD COLUMN reason text`)
	return db
}

// readReason returns the state and reason of job id ("" for NULL, and
// whether it was NULL).
func readReason(t testing.TB, db DBTX, id int64) (state string, reason *string) {
	t.Helper()
	if err := db.QueryRow(context.Background(), `SELECT state, reason FROM jobs WHERE id = $1`, id).Scan(&state, &reason); err != nil {
		t.Fatal(err)
	}
	return state, reason
}

// TestWorkerReason: the worker records the error of a failed attempt with
// the move to Retry and then to Failed, clears it when a later attempt
// succeeds, and cuts a long error text.
func TestWorkerReason(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := reasonJobs(t, 3)
	c, err := New[int64](db.Pool, reasonTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	// Job 1 fails on every attempt, job 2 on its first only, job 3 fails
	// with an error text far beyond the limit.
	long := strings.Repeat("é", 3000)
	work := func(_ context.Context, _ pgx.Tx, cl Claim[int64]) error {
		switch {
		case cl.Key == 1:
			return fmt.Errorf("attempt %d of job 1: upstream said 503", cl.Attempts)
		case cl.Key == 2 && cl.Attempts == 1:
			return errors.New("job 2: timeout")
		case cl.Key == 3:
			return errors.New(long)
		}
		return nil
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2},
		BatchSize: 10, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	stats, err := w.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Failed != 2 || stats.Succeeded != 1 || stats.Retried != 3 {
		t.Errorf("stats %+v, want 2 failed, 1 succeeded, 3 retried", stats)
	}
	if st, r := readReason(t, db.Pool, 1); st != "FAILED" || r == nil || *r != "attempt 2 of job 1: upstream said 503" {
		t.Errorf("job 1: %s, reason %v; want FAILED with the last attempt's error", st, deref(r))
	}
	if st, r := readReason(t, db.Pool, 2); st != "DONE" || r != nil {
		t.Errorf("job 2: %s, reason %v; want DONE with the reason cleared", st, deref(r))
	}
	st, r := readReason(t, db.Pool, 3)
	if st != "FAILED" || r == nil {
		t.Fatalf("job 3: %s, reason %v; want FAILED with a reason", st, deref(r))
	}
	if len(*r) > maxReason || !strings.HasPrefix(long, *r) || len(*r) < maxReason-4 {
		t.Errorf("job 3: reason of %d bytes; want the first %d bytes of the error, cut at a character", len(*r), maxReason)
	}
}

// deref shows a nullable reason.
func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", *s)
}

// TestSweeperReason: the sweeper records why it moved each stale row, in
// the table and in Swept, for a row whose lease expired and for one
// claimed without a lease too long ago. A row finished by hand keeps the
// reason its holder wrote.
func TestSweeperReason(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := reasonJobs(t, 3)
	leased, _ := New[int64](db.Pool, reasonTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "app-1:8103", Lease: time.Minute})
	plain, _ := New[int64](db.Pool, reasonTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "app-2:8103"})
	c1, err := leased.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := plain.Claim(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 second', claimed_at = claimed_at - interval '2 hours' WHERE id = 1`)
	makeStale(t, db.Pool, 2)

	sw, err := NewSweeper(plain, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	swept, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) != 2 {
		t.Fatalf("swept %d rows, want 2: %+v", len(swept), swept)
	}
	want := map[int64][]string{
		1: {"claim: swept: lease expired at ", fmt.Sprintf("(claim by app-1:8103, fence %d, attempt 1)", c1.Fence)},
		2: {"claim: swept: claimed at ", ", more than 1h0m0s ago", fmt.Sprintf("(claim by app-2:8103, fence %d, attempt 1)", c2.Fence)},
	}
	for _, s := range swept {
		st, r := readReason(t, db.Pool, s.Key)
		if st != "FAILED" || r == nil {
			t.Errorf("job %d: %s, reason %v; want FAILED with a reason", s.Key, st, deref(r))
			continue
		}
		if *r != s.Reason {
			t.Errorf("job %d: Swept.Reason %q, table %q", s.Key, s.Reason, *r)
		}
		for _, part := range want[s.Key] {
			if !strings.Contains(*r, part) {
				t.Errorf("job %d: reason %q lacks %q", s.Key, *r, part)
			}
		}
	}
	// A sweeper on a table without the column still reports why.
	bare, _ := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "app-3"})
	if _, err := bare.Claim(ctx, 3); err != nil {
		t.Fatal(err)
	}
	makeStale(t, db.Pool, 3)
	sw, err = NewSweeper(bare, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	swept, err = sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) != 1 || !strings.Contains(swept[0].Reason, "(claim by app-3, fence") {
		t.Fatalf("swept without a reason column: %+v", swept)
	}
	if _, r := readReason(t, db.Pool, 3); r != nil {
		t.Errorf("a sweeper without Table.Reason wrote the column: %q", *r)
	}
}

// TestReasonLost: a worker cannot write a reason on a row it lost, and
// Release leaves the reason alone.
func TestReasonLost(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := reasonJobs(t, 1)
	a, _ := New[int64](db.Pool, reasonTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "a"})
	cl, err := a.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET state = 'DONE', reason = 'by hand' WHERE id = 1`)
	if err := a.finishWith(ctx, cl, "FAILED", errors.New("late failure"), 0); !errors.Is(err, ErrLost) {
		t.Fatalf("finish of a lost claim: %v, want ErrLost", err)
	}
	if st, r := readReason(t, db.Pool, 1); st != "DONE" || r == nil || *r != "by hand" {
		t.Errorf("row changed by a lost claim: %s, reason %v", st, deref(r))
	}
	mustExec(t, db.Pool, `UPDATE jobs SET state = 'PAUSED' WHERE id = 1`)
	cl, err = a.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if st, r := readReason(t, db.Pool, 1); st != "PAUSED" || r == nil || *r != "by hand" {
		t.Errorf("after Release: %s, reason %v; want PAUSED with the reason kept", st, deref(r))
	}
}

// With FailAfter equal to StaleAfter, a row swept for its claim's age says
// so once: "claimed at T, more than 24h0m0s ago", not that and "claimed
// more than 24h0m0s ago" again.
func TestSweepReasonSaysItOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 1)
	plain, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	if _, err := plain.Claim(ctx, 1); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 days' WHERE id = 1`)
	sw, err := NewSweeper(plain, SweeperConfig[int64]{StaleAfter: 24 * time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, FailAfter: 24 * time.Hour, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	got, err := sw.Sweep(ctx)
	if err != nil || len(got) != 1 {
		t.Fatalf("Sweep = %+v, %v", got, err)
	}
	if r := got[0].Reason; strings.Count(r, "24h0m0s ago") != 1 || got[0].State != "FAILED" {
		t.Errorf("reason %q (state %s): want the age stated once, FAILED", r, got[0].State)
	}
}
