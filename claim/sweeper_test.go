package claim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/harness/roletest"
)

type rowState struct {
	State     string
	ClaimedBy string
	Fence     int64
	ClaimedAt time.Time
	Attempts  int
}

func readRow(t testing.TB, pool *pgxpool.Pool, id int64) rowState {
	t.Helper()
	var r rowState
	err := pool.QueryRow(context.Background(),
		`SELECT state, claimed_by, fence, claimed_at, attempts FROM jobs WHERE id = $1`, id).
		Scan(&r.State, &r.ClaimedBy, &r.Fence, &r.ClaimedAt, &r.Attempts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func makeStale(t testing.TB, pool *pgxpool.Pool, id int64) {
	t.Helper()
	mustExec(t, pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 hours' WHERE id = $1`, id)
}

// TestZombie: a holder's claim goes stale and is swept; another holder
// claims the row. The first holder can no longer finish, extend or release
// it, and the row is left as the second holder has it.
func TestZombie(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 1)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	a, _ := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "a", Logger: logger})
	b, _ := New[int64](db.NewPool(t), jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "b", Logger: logger})
	var swept []Swept[int64]
	sw, err := NewSweeper(b, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2}, BatchSize: 10,
		OnSwept: func(_ context.Context, s []Swept[int64]) { swept = append(swept, s...) }})
	if err != nil {
		t.Fatal(err)
	}

	ca, err := a.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Not stale yet: nothing to sweep.
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 0 {
		t.Fatalf("fresh claim swept: %v %v", got, err)
	}
	makeStale(t, db.Pool, 1)
	got, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != 1 || got[0].State != "PAUSED" || got[0].Fence != ca.Fence ||
		got[0].ClaimedBy != "a" || got[0].Attempts != 1 || len(swept) != 1 {
		t.Fatalf("swept %+v (callback %+v)", got, swept)
	}
	cb, err := b.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if cb.Fence <= ca.Fence || cb.Attempts != 2 {
		t.Fatalf("reclaim %+v after %+v", cb, ca)
	}
	zombie := func(holder *Claimer[int64], cl Claim[int64]) {
		t.Helper()
		before := readRow(t, db.Pool, 1)
		if err := holder.Finish(ctx, cl, "DONE"); !errors.Is(err, ErrLost) {
			t.Fatalf("zombie finish: %v", err)
		}
		if done, lost, err := holder.FinishBatch(ctx, []Claim[int64]{cl}, "DONE"); err != nil || len(done) != 0 || len(lost) != 1 {
			t.Fatalf("zombie finish batch: %v %v %v", done, lost, err)
		}
		if _, err := holder.Extend(ctx, cl, time.Hour); !errors.Is(err, ErrLost) {
			t.Fatalf("zombie extend: %v", err)
		}
		if err := holder.Release(ctx, cl); !errors.Is(err, ErrLost) {
			t.Fatalf("zombie release: %v", err)
		}
		if after := readRow(t, db.Pool, 1); after != before {
			t.Fatalf("zombie changed the row: %+v -> %+v", before, after)
		}
	}
	zombie(a, ca)
	if r := readRow(t, db.Pool, 1); r.State != "PROCESSING" || r.ClaimedBy != "b" || r.Fence != cb.Fence {
		t.Fatalf("row = %+v", r)
	}
	// Both transitions were logged: the sweep and the zombie's lost finish.
	for _, want := range []string{
		fmt.Sprintf(`level=WARN msg="claim: swept stale row" table="\"jobs\"" key=1 state=PAUSED fence=%d claimed_by=a`, ca.Fence),
		fmt.Sprintf(`level=WARN msg="claim: claim lost" op=Finish table="\"jobs\"" key=1 fence=%d`, ca.Fence),
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s; log:\n%s", want, logs.String())
		}
	}

	// The second claim goes stale too; no attempts remain, so it fails.
	makeStale(t, db.Pool, 1)
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 1 || got[0].State != "FAILED" {
		t.Fatalf("second sweep: %+v %v", got, err)
	}
	zombie(b, cb)
	zombie(a, ca)
	// A claimer of failed rows takes it again; both old holders stay out.
	c, _ := New[int64](db.Pool, jobsTable, Config{From: "FAILED", To: "PROCESSING", Holder: "c"})
	cc, err := c.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	zombie(a, ca)
	zombie(b, cb)
	if err := c.Finish(ctx, cc, "DONE"); err != nil {
		t.Fatal(err)
	}
}

// TestSweeperRace: a row is finished (or released and claimed again) after
// the sweeper's statement has seen it stale but before it locks it. The
// sweeper must leave it alone. A gate function in the sweeper's Where holds
// the statement at that point, deterministically.
func TestSweeperRace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		act   func(ctx context.Context, c, other *Claimer[int64], cl Claim[int64]) (Claim[int64], error)
		state string
	}{
		{"finished", func(ctx context.Context, c, _ *Claimer[int64], cl Claim[int64]) (Claim[int64], error) {
			return cl, c.Finish(ctx, cl, "DONE")
		}, "DONE"},
		{"reclaimed", func(ctx context.Context, c, other *Claimer[int64], cl Claim[int64]) (Claim[int64], error) {
			if err := c.Release(ctx, cl); err != nil {
				return cl, err
			}
			return other.Claim(ctx, cl.Key)
		}, "PROCESSING"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := newDB(t)
			createJobs(t, db.Pool, "bigint", 1)
			addAudit(t, db.Pool, "bigint")
			mustExec(t, db.Pool, `CREATE FUNCTION sweep_gate() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(4242);
  RETURN true;
END $$`)
			c, _ := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "a"})
			other, _ := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "b"})
			sweepPool := db.NewPool(t)
			sc, _ := New[int64](sweepPool, jobsTable, pausedOpts)
			sw, err := NewSweeper(sc, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10, Where: "sweep_gate()"})
			if err != nil {
				t.Fatal(err)
			}
			cl, err := c.Claim(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			makeStale(t, db.Pool, 1)

			gate, err := db.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer gate.Release()
			if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
				t.Fatal(err)
			}
			type result struct {
				swept []Swept[int64]
				err   error
			}
			res := make(chan result, 1)
			go func() {
				s, err := sw.Sweep(ctx)
				res <- result{s, err}
			}()
			// Wait until the sweeper's statement is blocked in the gate:
			// its snapshot is taken and it has seen the stale row.
			for {
				n, err := pgprobe.CountAdvisory(ctx, db.Pool, pgprobe.Waiting, pgprobe.Single(4242))
				if err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
				select {
				case r := <-res:
					t.Fatalf("sweep returned before the gate: %+v", r)
				case <-time.After(5 * time.Millisecond):
				}
			}
			now, err := tc.act(ctx, c, other, cl)
			if err != nil {
				t.Fatalf("%s while sweeper waits: %v", tc.name, err)
			}
			if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
				t.Fatal(err)
			}
			r := <-res
			if r.err != nil || len(r.swept) != 0 {
				t.Fatalf("sweep: %+v %v", r.swept, r.err)
			}
			row := readRow(t, db.Pool, 1)
			if row.State != tc.state || row.Fence != now.Fence {
				t.Fatalf("row = %+v, want state %s fence %d", row, tc.state, now.Fence)
			}
			if n := count(t, db.Pool, `SELECT count(*) FROM audit WHERE new_state = 'FAILED'`); n != 0 {
				t.Fatalf("%d rows moved to FAILED", n)
			}
		})
	}
}

// TestTwoSweepers: two sweepers, each with its own pool, sweep 100,000
// stale rows at once. Every row moves exactly once, and no transaction
// moves more than one batch of rows.
func TestTwoSweepers(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	const rows, batch = 100000, 1000
	createJobs(t, db.Pool, "bigint", rows)
	mustExec(t, db.Pool, `UPDATE jobs SET state = 'PROCESSING', claimed_at = now() - interval '2 hours',
		claimed_by = 'dead', fence = nextval('pgclaim_fence_seq'), attempts = id % 3`)
	mustExec(t, db.Pool, `VACUUM ANALYZE jobs`)
	addAudit(t, db.Pool, "bigint")

	var wg sync.WaitGroup
	got := make([][]Swept[int64], 2)
	errs := make([]error, 2)
	for i := range 2 {
		c, _ := New[int64](db.NewPool(t), jobsTable, pausedOpts)
		sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2}, BatchSize: batch})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = sw.Sweep(ctx)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("sweeper 1 moved %d rows, sweeper 2 moved %d", len(got[0]), len(got[1]))
	if n := len(got[0]) + len(got[1]); n != rows {
		t.Errorf("sweepers report %d rows, want %d", n, rows)
	}
	seen := make(map[int64]bool, rows)
	for _, g := range got {
		for _, s := range g {
			if seen[s.Key] {
				t.Fatalf("row %d reported twice", s.Key)
			}
			seen[s.Key] = true
			want := "FAILED"
			if s.Key%3 < 2 {
				want = "PAUSED"
			}
			if s.State != want {
				t.Fatalf("row %d (attempts %d) moved to %s, want %s", s.Key, s.Attempts, s.State, want)
			}
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM audit`); n != rows {
		t.Errorf("%d moves recorded, want %d", n, rows)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT id) FROM audit`); n != rows {
		t.Errorf("%d distinct rows moved, want %d", n, rows)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PROCESSING'`); n != 0 {
		t.Errorf("%d rows still PROCESSING", n)
	}
	if n := count(t, db.Pool, `SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM audit GROUP BY txid) s`); n > batch {
		t.Errorf("one transaction moved %d rows, more than a batch of %d", n, batch)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT txid) FROM audit`); n < rows/batch {
		t.Errorf("%d transactions for %d rows in batches of %d", n, rows, batch)
	}
}

// TestSweepLease: rows with a lease are stale when the lease has passed,
// whatever their claimed_at; rows without a lease go by StaleAfter.
func TestSweepLease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 4)
	leased, _ := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Lease: time.Hour})
	plain, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	for id := int64(1); id <= 2; id++ {
		if _, err := leased.Claim(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for id := int64(3); id <= 4; id++ {
		if _, err := plain.Claim(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// 1: lease valid, claimed long ago (a long job heartbeating) - kept.
	// 2: lease expired a moment ago - swept.
	// 3: no lease, claimed long ago - swept.
	// 4: no lease, claimed just now - kept.
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '1 day' WHERE id IN (1, 3)`)
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 millisecond' WHERE id = 2`)
	sw, err := NewSweeper(plain, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("swept %+v", got)
	}
	states := map[int64]string{}
	for id := int64(1); id <= 4; id++ {
		states[id] = readRow(t, db.Pool, id).State
	}
	if states[1] != "PROCESSING" || states[2] != "FAILED" || states[3] != "FAILED" || states[4] != "PROCESSING" {
		t.Fatalf("states %v", states)
	}
	// Expired leases only.
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = 1`)
	onlyLease, err := NewSweeper(leased, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := onlyLease.Sweep(ctx); err != nil || len(got) != 1 || got[0].Key != 1 {
		t.Fatalf("lease-only sweep: %+v %v", got, err)
	}
}

// TestSweeperRun: Run sweeps periodically and returns nil when cancelled.
func TestSweeperRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 3)
	c, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	swept := make(chan int64, 10)
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10,
		OnSwept: func(_ context.Context, s []Swept[int64]) {
			for _, x := range s {
				swept <- x.Key
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sw.Run(runCtx, 20*time.Millisecond) }()
	for id := int64(1); id <= 3; id++ {
		if _, err := c.Claim(ctx, id); err != nil {
			t.Fatal(err)
		}
		makeStale(t, db.Pool, id)
		select {
		case k := <-swept:
			if k != id {
				t.Fatalf("swept %d, want %d", k, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("row %d not swept", id)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// A sweep the server refuses for good (here UPDATE on the table was revoked
// from the sweeper's role after it started) ends Sweeper.Run with the server's error,
// and ends a Worker's run whose Recover sweeps with it: neither logs it at
// every period forever.
func TestSweepRefusedEndsRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 2)
	reader := roletest.New(t, db, `GRANT SELECT, UPDATE ON jobs TO ROLE`)
	c, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	rc, _ := New[int64](reader.Pool, jobsTable, pausedOpts)
	sw, err := NewSweeper(rc, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(rc, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, Recover: sw, RecoverEvery: 20 * time.Millisecond,
		SkipVerify: true, Work: func(context.Context, pgx.Tx, Claim[int64]) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `REVOKE UPDATE ON jobs FROM `+reader.Ident())
	if _, err := c.Claim(ctx, 1); err != nil {
		t.Fatal(err)
	}
	makeStale(t, db.Pool, 1)
	ends := func(what string, run func(context.Context) error) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := run(rctx)
		var pe *pgconn.PgError
		if rctx.Err() != nil || !errors.As(err, &pe) || pe.Code != "42501" {
			t.Fatalf("%s: returned %v (context: %v); want the refusal at once", what, err, rctx.Err())
		}
		if !strings.Contains(err.Error(), "GRANT UPDATE ON TABLE public.jobs") {
			t.Errorf("%s: %v; want the GRANT that fixes it", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	// The worker sweeps first, before it claims: its run ends in the sweep.
	ends("Sweeper.Run", func(ctx context.Context) error { return sw.Run(ctx, 20*time.Millisecond) })
	ends("Worker.Run with Recover", func(ctx context.Context) error { _, err := w.Run(ctx); return err })
}
