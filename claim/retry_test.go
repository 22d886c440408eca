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

// TestRetryBackoff: a worker with Retry.Backoff moves a failed row back to
// PAUSED with retry_at set from database time; until then neither
// ClaimBatch nor Claim takes the row, nor does Drain wait for it. Once
// retry_at has passed, the row is claimed and finished.
// With a reason column too, job 2's error is recorded with the delay and
// cleared by its success.
func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	t.Run("retry_at", func(t *testing.T) { t.Parallel(); testRetryBackoff(t, false) })
	t.Run("retry_at and reason", func(t *testing.T) { t.Parallel(); testRetryBackoff(t, true) })
}

func testRetryBackoff(t *testing.T, withReason bool) {
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
		Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3, Backoff: time.Hour},
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

func TestRetryBackoffConfig(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0)
	noWork := func(context.Context, pgx.Tx, Claim[int64]) error { return nil }
	plain, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	with, _ := New[int64](db.Pool, retryTable, pausedOpts)
	for _, tc := range []struct {
		c     *Claimer[int64]
		cfg   WorkerConfig[int64]
		field string
	}{
		{plain, WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2, Backoff: time.Second}, BatchSize: 1}, "Table.RetryAt"},
		{with, WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{Backoff: time.Second}, BatchSize: 1}, "WorkerConfig.Retry.State"},
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

// TestSweeperRetryBackoff: a sweeper with Retry.Backoff moves a stale row with
// attempts left back to PAUSED with retry_at an hour on, so nobody claims
// it at once; a row with no attempts left goes to FAILED, retry_at
// untouched.
func TestSweeperRetryBackoff(t *testing.T) {
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
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3, Backoff: time.Hour}, BatchSize: 10})
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
		{c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{Backoff: time.Hour}, BatchSize: 1}, "SweeperConfig.Retry.State"},
		{c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2, Backoff: -time.Hour}, BatchSize: 1}, "SweeperConfig.Retry.Backoff"},
		{plain, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2, Backoff: time.Hour}, BatchSize: 1}, "Table.RetryAt"},
	} {
		if _, err := NewSweeper(tc.c, tc.cfg); !errors.Is(err, ErrInvalid) || !containsField(err, tc.field) {
			t.Errorf("want an error naming %s, got %v", tc.field, err)
		}
	}
}

// TestRetryPolicyWait pins the wait after each attempt: Backoff, doubled
// with each further attempt up to MaxBackoff when that is above Backoff.
func TestRetryPolicyWait(t *testing.T) {
	for _, tc := range []struct {
		p     RetryPolicy
		waits []time.Duration // after attempts 1, 2, ...
	}{
		{RetryPolicy{}, []time.Duration{0, 0, 0}},
		{RetryPolicy{Backoff: time.Minute}, []time.Duration{time.Minute, time.Minute, time.Minute}},
		{RetryPolicy{Backoff: time.Minute, MaxBackoff: time.Minute}, []time.Duration{time.Minute, time.Minute}},
		{RetryPolicy{Backoff: time.Second, MaxBackoff: 10 * time.Second}, []time.Duration{
			time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}},
		{RetryPolicy{Backoff: 3 * time.Second, MaxBackoff: 4 * time.Second}, []time.Duration{3 * time.Second, 4 * time.Second, 4 * time.Second}},
		{RetryPolicy{Backoff: time.Hour, MaxBackoff: 1<<63 - 1}, []time.Duration{time.Hour, 2 * time.Hour}},
	} {
		for i, want := range tc.waits {
			if got := tc.p.wait(i + 1); got != want {
				t.Errorf("%+v: wait after attempt %d = %v, want %v", tc.p, i+1, got, want)
			}
		}
		if got := tc.p.wait(1 << 40); tc.p.doubles() && got != tc.p.MaxBackoff {
			t.Errorf("%+v: wait after many attempts = %v, want MaxBackoff", tc.p, got)
		}
		// The sweeper's statement doubles Backoff in microseconds at most
		// maxDoublings times, then caps it: the same wait.
		for n := 1; n <= 70; n++ {
			d := micros(tc.p.Backoff) << min(n-1, tc.p.maxDoublings())
			if tc.p.doubles() {
				d = min(d, micros(tc.p.MaxBackoff))
			}
			if want := micros(tc.p.wait(n)); d != want {
				t.Fatalf("%+v: after attempt %d the statement waits %dµs, the worker %dµs", tc.p, n, d, want)
			}
		}
	}
}

// TestRetryPolicyCheck: the policy's own checks, the same for a worker and
// a sweeper, each naming the field at fault (no server needed).
func TestRetryPolicyCheck(t *testing.T) {
	c, err := New[int64](&sqlRecorder{}, retryTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New[int64](&sqlRecorder{}, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	noAttempts, err := New[int64](&sqlRecorder{}, Table{Name: "jobs", Key: "id", State: "state", ClaimedAt: "claimed_at", RetryAt: "retry_at"}, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	ok := RetryPolicy{State: "PAUSED", MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute}
	with := func(f func(*RetryPolicy)) RetryPolicy { p := ok; f(&p); return p }
	for _, tc := range []struct {
		c     *Claimer[int64]
		p     RetryPolicy
		field string // "" for valid
	}{
		{c, RetryPolicy{}, ""},
		{c, ok, ""},
		{c, with(func(p *RetryPolicy) { p.MaxBackoff = 0 }), ""},
		{c, with(func(p *RetryPolicy) { p.MaxBackoff = p.Backoff }), ""},
		{plain, RetryPolicy{State: "PAUSED", MaxAttempts: 3}, ""},
		{c, with(func(p *RetryPolicy) { p.State = "PROCESSING" }), "Retry.State"},
		{c, with(func(p *RetryPolicy) { p.MaxAttempts = -1 }), "Retry.MaxAttempts"},
		{c, with(func(p *RetryPolicy) { p.MaxAttempts = 0 }), "Retry.MaxAttempts"},
		{c, RetryPolicy{MaxAttempts: 3}, "Retry.State"},
		{c, RetryPolicy{Backoff: time.Second}, "Retry.State"},
		{noAttempts, RetryPolicy{State: "PAUSED", MaxAttempts: 3}, "Table.Attempts"},
		{c, with(func(p *RetryPolicy) { p.Backoff = -time.Second }), "Retry.Backoff"},
		{c, with(func(p *RetryPolicy) { p.MaxBackoff = -time.Second }), "Retry.MaxBackoff"},
		{c, with(func(p *RetryPolicy) { p.Backoff = 0 }), "Retry.Backoff"},
		{c, with(func(p *RetryPolicy) { p.MaxBackoff = time.Millisecond }), "Retry.MaxBackoff"},
		{c, with(func(p *RetryPolicy) { p.Backoff, p.MaxBackoff = time.Nanosecond, 0 }), "Retry.Backoff"},
		{plain, with(func(p *RetryPolicy) { p.MaxBackoff = 0 }), "Table.RetryAt"},
	} {
		for _, cfg := range []string{"WorkerConfig", "SweeperConfig"} {
			err := tc.p.check(cfg+".Retry", tc.c.c)
			if cfg == "SweeperConfig" {
				_, err = NewSweeper(tc.c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: tc.p, BatchSize: 1, SkipVerify: true})
			}
			field := tc.field
			if strings.HasPrefix(field, "Retry.") {
				field = cfg + "." + field
			}
			switch {
			case field == "" && err != nil:
				t.Errorf("%s.Retry %+v: %v, want no error", cfg, tc.p, err)
			case field != "" && (!errors.Is(err, ErrInvalid) || !containsField(err, field)):
				t.Errorf("%s.Retry %+v: %v, want an error naming %s", cfg, tc.p, err, field)
			}
		}
	}
}

// TestRetryBackoffDoubles: with MaxBackoff above Backoff, the worker and the
// sweeper set the same waits from a row's attempts: Backoff after the first
// claim, doubled with each further one, capped at MaxBackoff.
func TestRetryBackoffDoubles(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 3)
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD COLUMN retry_at timestamptz`)
	c, err := New[int64](db.Pool, retryTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	retry := RetryPolicy{State: "PAUSED", MaxAttempts: 10, Backoff: time.Hour, MaxBackoff: 5 * time.Hour}
	// attempts before the claim → the wait after it fails.
	want := map[int64]time.Duration{1: time.Hour, 2: 2 * time.Hour, 3: 5 * time.Hour}
	mustExec(t, db.Pool, `UPDATE jobs SET attempts = CASE id WHEN 1 THEN 0 WHEN 2 THEN 1 ELSE 3 END`)
	w, err := NewWorker(c, WorkerConfig[int64]{
		Work: func(context.Context, pgx.Tx, Claim[int64]) error { return errors.New("upstream 503") },
		Done: "DONE", Failed: "FAILED", Retry: retry, BatchSize: 10, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := w.Drain(ctx); err != nil || st.Retried != 3 {
		t.Fatalf("drain: %+v %v, want 3 retried", st, err)
	}
	for id, d := range want {
		var state string
		var wait time.Duration
		if err := db.Pool.QueryRow(ctx, `SELECT state, retry_at - claimed_at FROM jobs WHERE id = $1`, id).Scan(&state, &wait); err != nil {
			t.Fatal(err)
		}
		if state != "PAUSED" || wait < d || wait > d+time.Minute {
			t.Errorf("worker, job %d: %s, retry_at %v after its claim; want PAUSED, %v after", id, state, wait, d)
		}
	}

	mustExec(t, db.Pool, `INSERT INTO jobs (id, state) VALUES (4, 'PAUSED'), (5, 'PAUSED'), (6, 'PAUSED')`)
	for id := int64(4); id <= 6; id++ {
		if _, err := c.Claim(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	want = map[int64]time.Duration{4: time.Hour, 5: 2 * time.Hour, 6: 5 * time.Hour}
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 hours', attempts = CASE id WHEN 4 THEN 1 WHEN 5 THEN 2 ELSE 4 END WHERE id >= 4`)
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: retry, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if swept, err := sw.Sweep(ctx); err != nil || len(swept) != 3 {
		t.Fatalf("sweep: %v %v", swept, err)
	}
	for id, d := range want {
		var state string
		var wait time.Duration
		if err := db.Pool.QueryRow(ctx, `SELECT state, retry_at - now() FROM jobs WHERE id = $1`, id).Scan(&state, &wait); err != nil {
			t.Fatal(err)
		}
		if state != "PAUSED" || wait < d-time.Minute || wait > d {
			t.Errorf("sweeper, job %d: %s, retry in %v; want PAUSED, retry in %v", id, state, wait, d)
		}
	}
}
