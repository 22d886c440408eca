package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// effectWork writes one effect for the claim in the finishing transaction.
func effectWork(holder string) func(ctx context.Context, tx pgx.Tx, c Claim[int64]) error {
	return func(ctx context.Context, tx pgx.Tx, c Claim[int64]) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (job_id, holder, fence) VALUES ($1, $2, $3)`, c.Key, holder, c.Fence)
		return err
	}
}

func newWorkerPool(t *testing.T, db interface {
	OpenPool(context.Context) (*pgxpool.Pool, error)
}, conns int32) *pgxpool.Pool {
	t.Helper()
	p, err := db.OpenPool(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	cfg := p.Config()
	p.Close()
	cfg.MaxConns = conns
	p, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestWorkerDrainExactlyOnce: two workers drain the same rows at once; each
// row gets exactly one effect, written in its finishing transaction.
func TestWorkerDrainExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	const rows = 2000
	createJobs(t, db.Pool, "bigint", rows)
	addAudit(t, db.Pool, "bigint")
	var wg sync.WaitGroup
	stats := make([]Stats, 2)
	for i := range 2 {
		holder := fmt.Sprintf("w%d", i)
		pool := newWorkerPool(t, db, 6)
		c, _ := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: holder, Lease: time.Minute})
		w, err := NewWorker(c, WorkerConfig[int64]{Work: effectWork(holder), Done: "DONE", Failed: "FAILED",
			BatchSize: 50, Concurrency: 4, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			stats[i], err = w.Drain(ctx)
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	t.Logf("stats %+v %+v", stats[0], stats[1])
	if s := stats[0].Succeeded + stats[1].Succeeded; s != rows {
		t.Errorf("succeeded %d, want %d", s, rows)
	}
	if c := stats[0].Claimed + stats[1].Claimed; c != rows {
		t.Errorf("claimed %d, want %d", c, rows)
	}
	exactlyOnce(t, db.Pool, rows)
}

// TestWorkerFailures: failed work is retried while attempts remain, then
// failed; panics count as failures; effects of failed attempts roll back.
func TestWorkerFailures(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	const rows = 200
	createJobs(t, db.Pool, "bigint", rows)
	pool := newWorkerPool(t, db, 6)
	c, _ := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w"})
	work := func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
		if err := effectWork("w")(ctx, tx, cl); err != nil {
			return err
		}
		switch {
		case cl.Key == 7:
			panic("boom")
		case cl.Key%25 == 0:
			return errors.New("always fails")
		case cl.Key%10 == 0 && cl.Attempts == 1:
			return errors.New("fails once")
		}
		return nil
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3},
		BatchSize: 16, Concurrency: 3, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v", st)
	// 8 rows (multiples of 25) and row 7 fail 3 times: 2 retries and 1
	// failure each. The 16 other multiples of 10 fail once, then succeed.
	const always, once = 9, 16
	want := Stats{Claimed: rows + 2*always + once, Succeeded: rows - always, Failed: always, Retried: 2*always + once}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'FAILED' AND attempts = 3 AND (id % 25 = 0 OR id = 7)`); n != always {
		t.Errorf("%d rows FAILED after 3 attempts, want %d", n, always)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE' AND attempts = 2`); n != once {
		t.Errorf("%d rows DONE on the second attempt, want %d", n, once)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM effects e JOIN jobs j ON j.id = e.job_id WHERE j.state = 'FAILED'`); n != 0 {
		t.Errorf("%d effects of failed rows survived", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id HAVING count(*) <> 1) d`); n != 0 {
		t.Errorf("%d rows without exactly one effect", n)
	}
}

// TestWorkerCleanShutdown cancels a worker in the middle of a batch: work
// in flight finishes, claims not started are released, and no row is left
// in PROCESSING.
func TestWorkerCleanShutdown(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	const rows = 1000
	createJobs(t, db.Pool, "bigint", rows)
	pool := newWorkerPool(t, db, 6)
	c, _ := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Lease: time.Minute})
	runCtx, cancel := context.WithCancel(ctx)
	var started atomic.Int64
	work := func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
		if started.Add(1) == 30 {
			cancel() // stop while this batch of 100 is far from done
		}
		time.Sleep(5 * time.Millisecond)
		return effectWork("w")(ctx, tx, cl)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", BatchSize: 100, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.Run(runCtx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v", st)
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PROCESSING'`); n != 0 {
		t.Fatalf("%d rows left PROCESSING", n)
	}
	done := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`)
	if st.Claimed != 100 || st.Succeeded != done || st.Released != st.Claimed-done || st.Released == 0 {
		t.Errorf("stats %+v with %d rows DONE", st, done)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM effects`); n != done {
		t.Errorf("%d effects for %d rows DONE", n, done)
	}
	// Released claims do not count as attempts.
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PAUSED' AND attempts <> 0`); n != 0 {
		t.Errorf("%d released rows have attempts", n)
	}
}

// TestWorkerStopTimeout: work that does not end on its own is cancelled
// StopTimeout after the stop, and its claim is released.
func TestWorkerStopTimeout(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 10)
	pool := newWorkerPool(t, db, 6)
	c, _ := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w"})
	runCtx, cancel := context.WithCancel(ctx)
	var started sync.WaitGroup
	started.Add(2)
	work := func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
		started.Done()
		if _, err := tx.Exec(ctx, `INSERT INTO effects (job_id) VALUES ($1)`, cl.Key); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", BatchSize: 5, Concurrency: 2,
		StopTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan Stats, 1)
	go func() {
		st, err := w.Run(runCtx)
		if err != nil {
			t.Error(err)
		}
		res <- st
	}()
	started.Wait()
	stopped := time.Now()
	cancel()
	var st Stats
	select {
	case st = <-res:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if d := time.Since(stopped); d < 100*time.Millisecond {
		t.Errorf("Run returned %v after stop, before StopTimeout", d)
	}
	if st.Claimed != 5 || st.Released != 5 || st.Failed != 0 {
		t.Errorf("stats %+v", st)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PAUSED' AND attempts = 0`); n != 10 {
		t.Errorf("%d of 10 rows back in PAUSED", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects of cancelled work", n)
	}
}

// TestWorkerHeartbeat: work longer than the lease survives a lease sweeper
// because the worker extends the lease; a claim taken away from the worker
// is detected by the heartbeat and its work cancelled.
func TestWorkerHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 2)
	pool := newWorkerPool(t, db, 6)
	const lease = 2 * time.Second // heartbeats every 667ms; a stall of a whole lease would fail the test
	c, _ := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Lease: lease})
	// The sweeper's own claimer has the workers' Lease: it sweeps expired
	// leases only.
	sc, _ := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Lease: lease})
	sw, err := NewSweeper(sc, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go func() { _ = sw.Run(sweepCtx, 20*time.Millisecond) }()

	var cancelled atomic.Bool
	work := func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
		if cl.Key == 1 {
			// Outlive the lease.
			time.Sleep(lease * 5 / 2)
			return effectWork("w")(ctx, tx, cl)
		}
		// Row 2 is taken away while its work runs.
		if _, err := db.Pool.Exec(ctx, `UPDATE jobs SET fence = fence + 1000 WHERE id = 2`); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			cancelled.Store(true)
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("not cancelled")
		}
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", BatchSize: 2, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Succeeded != 1 || st.Lost != 1 || !cancelled.Load() {
		t.Errorf("stats %+v, cancelled %v", st, cancelled.Load())
	}
	if r := readRow(t, db.Pool, 1); r.State != "DONE" {
		t.Errorf("row 1 = %+v", r)
	}
	// Row 2 is no longer the worker's: it stays as the thief left it until
	// its lease runs out and the sweeper takes it.
	if r := readRow(t, db.Pool, 2); r.State != "PROCESSING" && r.State != "FAILED" {
		t.Errorf("row 2 = %+v", r)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("%d effects", n)
	}
}
