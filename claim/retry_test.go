package claim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// retryTable is jobsTable with the retry_at column of retryJobs.
var retryTable = func() Table {
	t := jobsTable
	t.RetryAt = "retry_at"
	return t
}()

// TestRetryDelay: a worker with RetryDelay moves a failed row back to
// PAUSED with retry_at set from database time; until then neither
// ClaimBatch nor Claim takes the row, nor does Drain wait for it. Once
// retry_at has passed, the row is claimed and finished.
// With a reason column too, job 2's error is recorded with the delay and
// cleared by its success.
func TestRetryDelay(t *testing.T) {
	t.Parallel()
	t.Run("retry_at", func(t *testing.T) { t.Parallel(); testRetryDelay(t, false) })
	t.Run("retry_at and reason", func(t *testing.T) { t.Parallel(); testRetryDelay(t, true) })
}

func testRetryDelay(t *testing.T, withReason bool) {
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 3)
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD COLUMN retry_at timestamptz, ADD COLUMN reason text`)
	tbl := retryTable
	if withReason {
		tbl.Reason = "reason"
	}
	c, err := New[int64](db.Pool, tbl, Config{From: "PAUSED", To: "PROCESSING", Holder: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var delays []int
	var ran []int64
	w, err := NewWorker(c, WorkerConfig[int64]{
		// Job 2 fails its first attempt.
		Work: func(_ context.Context, _ pgx.Tx, cl Claim[int64]) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, cl.Key)
			if cl.Key == 2 && cl.Attempts == 1 {
				return errors.New("upstream 503")
			}
			return nil
		},
		Done: "DONE", Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 3,
		RetryDelay: func(attempts int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			delays = append(delays, attempts)
			return time.Hour
		},
		BatchSize: 10, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	stats, err := w.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Succeeded != 2 || stats.Retried != 1 || len(ran) != 3 {
		t.Fatalf("first drain: stats %+v, ran %v; want 2 succeeded, 1 retried, 3 runs", stats, ran)
	}
	if len(delays) != 1 || delays[0] != 1 {
		t.Errorf("RetryDelay called with %v, want [1]", delays)
	}
	var state string
	var wait time.Duration
	if err := db.Pool.QueryRow(ctx, `SELECT state, retry_at - claimed_at FROM jobs WHERE id = 2`).Scan(&state, &wait); err != nil {
		t.Fatal(err)
	}
	if state != "PAUSED" || wait < time.Hour || wait > time.Hour+time.Minute {
		t.Fatalf("job 2: %s, retry_at %s after its claim; want PAUSED, an hour after", state, wait)
	}
	if _, r := readReason(t, db.Pool, 2); withReason != (r != nil && *r == "upstream 503") {
		t.Errorf("job 2 reason after its failure: %v (reason column used: %v)", deref(r), withReason)
	}
	if cls, err := c.ClaimBatch(ctx, 10); err != nil || len(cls) != 0 {
		t.Fatalf("ClaimBatch before retry_at: %v %v, want nothing", cls, err)
	}
	if _, err := c.Claim(ctx, 2); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("Claim before retry_at: %v, want ErrNotClaimed", err)
	}

	// The hour passes.
	mustExec(t, db.Pool, `UPDATE jobs SET retry_at = now() - interval '1 millisecond' WHERE id = 2`)
	stats, err = w.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Succeeded != 1 || len(ran) != 4 || ran[3] != 2 {
		t.Fatalf("second drain: stats %+v, ran %v; want job 2 done", stats, ran)
	}
	if _, r := readReason(t, db.Pool, 2); r != nil {
		t.Errorf("job 2 reason after its success: %v", deref(r))
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE' AND attempts = CASE id WHEN 2 THEN 2 ELSE 1 END`); n != 3 {
		t.Errorf("%d of 3 jobs DONE with the expected attempts", n)
	}

	// A row whose retry_at is NULL or past is claimable by key.
	mustExec(t, db.Pool, `INSERT INTO jobs (id, state, retry_at) VALUES (4, 'PAUSED', NULL), (5, 'PAUSED', now() - interval '1 second')`)
	for _, k := range []int64{4, 5} {
		if _, err := c.Claim(ctx, k); err != nil {
			t.Errorf("Claim of due job %d: %v", k, err)
		}
	}
}

func TestRetryDelayConfig(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0)
	delay := func(int) time.Duration { return time.Second }
	noWork := func(context.Context, pgx.Tx, Claim[int64]) error { return nil }
	plain, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	with, _ := New[int64](db.Pool, retryTable, pausedOpts)
	for _, tc := range []struct {
		c     *Claimer[int64]
		cfg   WorkerConfig[int64]
		field string
	}{
		{plain, WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 2, RetryDelay: delay, BatchSize: 1}, "Table.RetryAt"},
		{with, WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", RetryDelay: delay, BatchSize: 1}, "WorkerConfig.Retry"},
	} {
		_, err := NewWorker(tc.c, tc.cfg)
		if !errors.Is(err, ErrInvalid) || !containsField(err, tc.field) {
			t.Errorf("want an error naming %s, got %v", tc.field, err)
		}
	}
	if _, err := New[int64](db.Pool, Table{Name: "jobs", Key: "id", State: "state", ClaimedAt: "claimed_at", RetryAt: "claimed_at"}, pausedOpts); !errors.Is(err, ErrInvalid) || !containsField(err, "Table.RetryAt") {
		t.Errorf("RetryAt on ClaimedAt's column: %v", err)
	}
	// Verify names a RetryAt column of the wrong type.
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD COLUMN retry_at timestamp`)
	if err := with.Verify(context.Background()); !containsField(err, "Table.RetryAt") {
		t.Errorf("Verify with retry_at timestamp: %v", err)
	}
}

// containsField reports whether err names field the way invalid does.
func containsField(err error, field string) bool {
	return err != nil && strings.Contains(err.Error(), "claim: "+field+": ")
}

// TestSweeperRetryAfter: a sweeper with RetryAfter moves a stale row with
// attempts left back to PAUSED with retry_at an hour on, so nobody claims
// it at once; a row with no attempts left goes to FAILED, retry_at
// untouched.
func TestSweeperRetryAfter(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 2)
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD COLUMN retry_at timestamptz`)
	c, err := New[int64](db.Pool, retryTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ClaimBatch(ctx, 2); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 hours', attempts = CASE id WHEN 1 THEN 1 ELSE 3 END`)
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 3,
		RetryAfter: time.Hour, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if swept, err := sw.Sweep(ctx); err != nil || len(swept) != 2 {
		t.Fatalf("sweep: %v %v", swept, err)
	}
	var state string
	var wait *time.Duration
	if err := db.Pool.QueryRow(ctx, `SELECT state, retry_at - now() FROM jobs WHERE id = 1`).Scan(&state, &wait); err != nil {
		t.Fatal(err)
	}
	if state != "PAUSED" || wait == nil || *wait < 59*time.Minute || *wait > time.Hour {
		t.Fatalf("job 1: %s, retry in %v; want PAUSED, retry in about an hour", state, wait)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT state, retry_at - now() FROM jobs WHERE id = 2`).Scan(&state, &wait); err != nil {
		t.Fatal(err)
	}
	if state != "FAILED" || wait != nil {
		t.Fatalf("job 2: %s, retry in %v; want FAILED with retry_at NULL", state, wait)
	}
	if cls, err := c.ClaimBatch(ctx, 10); err != nil || len(cls) != 0 {
		t.Fatalf("ClaimBatch right after the sweep: %v %v, want nothing", cls, err)
	}

	plain, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	for _, tc := range []struct {
		c     *Claimer[int64]
		cfg   SweeperConfig[int64]
		field string
	}{
		{c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", RetryAfter: time.Hour, BatchSize: 1}, "SweeperConfig.Retry"},
		{c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 2, RetryAfter: -time.Hour, BatchSize: 1}, "SweeperConfig.RetryAfter"},
		{plain, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 2, RetryAfter: time.Hour, BatchSize: 1}, "Table.RetryAt"},
	} {
		if _, err := NewSweeper(tc.c, tc.cfg); !errors.Is(err, ErrInvalid) || !containsField(err, tc.field) {
			t.Errorf("want an error naming %s, got %v", tc.field, err)
		}
	}
}
