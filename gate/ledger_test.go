package gate_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// newGate builds a Gate on pool for holder and closes it at cleanup.
func newGate(t testing.TB, pool *pgxpool.Pool, holder string, cfg gate.Config) *gate.Gate {
	t.Helper()
	cfg.Holder = holder
	g, err := gate.New(pool, cfg)
	if err != nil {
		t.Fatalf("gate.New: %v", err)
	}
	t.Cleanup(g.Close)
	return g
}

// dbNow reads database time.
func dbNow(t testing.TB, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		t.Fatalf("read now(): %v", err)
	}
	return now
}

type tickRow struct {
	holder  string
	fence   int64
	outcome string
	errText *string
	done    bool
}

// ledger returns the ledger rows of job by fire_at (UTC, microseconds).
func ledger(t testing.TB, pool *pgxpool.Pool, job string) map[time.Time]tickRow {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT fire_at, holder, fence, outcome, error, finished_at IS NOT NULL FROM pgclaim_ticks WHERE job = $1`, job)
	if err != nil {
		t.Fatalf("read ledger: %v", err)
	}
	defer rows.Close()
	out := map[time.Time]tickRow{}
	for rows.Next() {
		var at time.Time
		var r tickRow
		if err := rows.Scan(&at, &r.holder, &r.fence, &r.outcome, &r.errText, &r.done); err != nil {
			t.Fatalf("scan ledger: %v", err)
		}
		out[at.UTC()] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read ledger: %v", err)
	}
	return out
}

// TestOnceEightInstancesSkewedClocks: 8 instances, each with its own pool,
// identity and a clock offset of up to ±2 s, fire the same 100 ticks when
// their own clock reaches each one. Every tick runs exactly once and the
// ledger names the instance that ran it.
func TestOnceEightInstancesSkewedClocks(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	const (
		instances = 8
		ticks     = 100
		period    = 10 * time.Millisecond
		maxOffset = 2 * time.Second
	)
	start := time.Now().Add(maxOffset + 200*time.Millisecond).Truncate(period)
	fireAt := func(i int) time.Time { return start.Add(time.Duration(i) * period) }

	var runs [ticks]atomic.Int32
	var ranBy [ticks]atomic.Value
	var skipped, held atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, instances*ticks)
	for k := range instances {
		holder := fmt.Sprintf("instance-%d", k)
		g := newGate(t, db.NewPool(t), holder, gate.Config{})
		offset := time.Duration(rand.Int64N(int64(2*maxOffset))) - maxOffset
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ticks {
				// This instance's clock reads real time + offset, so it
				// fires tick i when real time reaches fireAt(i) - offset;
				// a little scheduling latency on top.
				due := fireAt(i).Add(-offset).Add(time.Duration(rand.Int64N(int64(3 * period))))
				time.Sleep(time.Until(due))
				err := g.Once(context.Background(), "skewed-job", fireAt(i), func(ctx context.Context, run gate.Run) error {
					runs[i].Add(1)
					ranBy[i].Store(run.Holder)
					if !run.FireAt.Equal(fireAt(i).Truncate(time.Microsecond)) {
						return fmt.Errorf("run.FireAt %s, want %s", run.FireAt, fireAt(i))
					}
					time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond))))
					return nil
				})
				switch {
				case err == nil:
				case errors.Is(err, gate.ErrHeld):
					held.Add(1)
				case errors.Is(err, gate.ErrSkipped):
					skipped.Add(1)
				default:
					errs <- fmt.Errorf("%s tick %d: %w", holder, i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	rows := ledger(t, db.Pool, "skewed-job")
	if len(rows) != ticks {
		t.Errorf("ledger has %d ticks, want %d", len(rows), ticks)
	}
	winners := map[string]int{}
	for i := range ticks {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("tick %d ran %d times, want exactly 1", i, n)
			continue
		}
		r, ok := rows[fireAt(i).UTC()]
		if !ok {
			t.Errorf("tick %d missing from ledger", i)
			continue
		}
		if who := ranBy[i].Load().(string); r.holder != who {
			t.Errorf("tick %d: ledger says %q ran it, fn ran on %q", i, r.holder, who)
		}
		if r.outcome != "succeeded" || !r.done {
			t.Errorf("tick %d: outcome %q finished %v, want succeeded and finished", i, r.outcome, r.done)
		}
		winners[r.holder]++
	}
	if got := int(skipped.Load() + held.Load()); got != instances*ticks-ticks {
		t.Errorf("%d skips, want %d", got, instances*ticks-ticks)
	}
	t.Logf("runs per instance: %v; skipped %d (tick claimed) + %d (lock held)", winners, skipped.Load(), held.Load())
}

// TestOnceContendedBurst: 8 instances fire the same 100 ticks at once, in
// their own random order, waiting for the job's lock when another run holds
// it. Every tick runs exactly once, and never two runs at the same time.
func TestOnceContendedBurst(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	const instances, ticks = 8, 100
	base := dbNow(t, db.Pool).Truncate(time.Second)
	var runs [ticks]atomic.Int32
	var running, overlaps atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, instances*ticks)
	for k := range instances {
		g := newGate(t, db.NewPool(t), fmt.Sprintf("burst-%d", k), gate.Config{LockWait: 10 * time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range rand.Perm(ticks) {
				err := g.Once(context.Background(), "burst-job", base.Add(time.Duration(i)*time.Millisecond),
					func(ctx context.Context, run gate.Run) error {
						if running.Add(1) > 1 {
							overlaps.Add(1)
						}
						runs[i].Add(1)
						running.Add(-1)
						return nil
					})
				if err != nil && !errors.Is(err, gate.ErrSkipped) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range ticks {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("tick %d ran %d times, want 1", i, n)
		}
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d runs overlapped another run of the job", n)
	}
	if n := len(ledger(t, db.Pool, "burst-job")); n != ticks {
		t.Errorf("ledger has %d ticks, want %d", n, ticks)
	}
}

func TestOnceRecordsOutcome(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	g := newGate(t, db.Pool, "outcomes", gate.Config{})
	ctx := context.Background()
	now := dbNow(t, db.Pool).Truncate(time.Second)

	var fences []int64
	ok := func(ctx context.Context, run gate.Run) error { fences = append(fences, run.Fence); return nil }
	if err := g.Once(ctx, "job", now, ok); err != nil {
		t.Fatalf("Once: %v", err)
	}
	boom := errors.New("boom")
	if err := g.Once(ctx, "job", now.Add(time.Second), func(ctx context.Context, run gate.Run) error {
		fences = append(fences, run.Fence)
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Once returned %v, want the job's error", err)
	}
	// Same tick again: skipped, fn not called.
	err := g.Once(ctx, "job", now, func(context.Context, gate.Run) error {
		t.Error("a claimed tick ran again")
		return nil
	})
	if !errors.Is(err, gate.ErrSkipped) || errors.Is(err, gate.ErrHeld) {
		t.Fatalf("second Once of a tick: %v, want ErrSkipped (not ErrHeld)", err)
	}
	// The caller's context ends while the job runs: abandoned.
	cctx, cancel := context.WithCancel(ctx)
	err = g.Once(cctx, "job", now.Add(2*time.Second), func(ctx context.Context, run gate.Run) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run returned %v", err)
	}
	// A panic is recorded as abandoned and re-raised.
	func() {
		defer func() {
			if p := recover(); p != "kaput" {
				t.Errorf("recovered %v, want the job's panic", p)
			}
		}()
		_ = g.Once(ctx, "job", now.Add(3*time.Second), func(context.Context, gate.Run) error { panic("kaput") })
		t.Error("Once did not re-panic")
	}()

	rows := ledger(t, db.Pool, "job")
	want := []struct {
		at      time.Time
		outcome string
		errText string
	}{
		{now, "succeeded", ""},
		{now.Add(time.Second), "failed", "boom"},
		{now.Add(2 * time.Second), "abandoned", "context canceled"},
		{now.Add(3 * time.Second), "abandoned", "kaput"},
	}
	for _, w := range want {
		r, ok := rows[w.at.UTC()]
		if !ok {
			t.Errorf("tick %s missing", w.at)
			continue
		}
		got := ""
		if r.errText != nil {
			got = *r.errText
		}
		if r.outcome != w.outcome || !strings.Contains(got, w.errText) || (w.errText == "") != (r.errText == nil) || !r.done {
			t.Errorf("tick %s: outcome %q error %q finished %v; want %q with error containing %q", w.at, r.outcome, got, r.done, w.outcome, w.errText)
		}
		if r.holder != "outcomes" {
			t.Errorf("tick %s: holder %q", w.at, r.holder)
		}
	}
	if len(fences) != 2 || fences[0] <= 0 || fences[1] <= fences[0] {
		t.Errorf("fences %v: want positive and increasing", fences)
	}
	// The lock was released each time: an Exclusive run of the job gets it.
	if err := g.Exclusive(ctx, "job", func(context.Context, gate.Run) error { return nil }); err != nil {
		t.Errorf("Exclusive after Once runs: %v", err)
	}
}

func TestOnceClockSkew(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]gate.Config{
		"locked":      {SkewTolerance: 30 * time.Second},
		"lock-wait":   {SkewTolerance: 30 * time.Second, LockWait: time.Second},
		"ledger-only": {SkewTolerance: 30 * time.Second, LedgerOnly: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			g := newGate(t, db.Pool, "skew", cfg)
			now := dbNow(t, db.Pool)
			for _, off := range []time.Duration{-time.Minute, time.Minute, 24 * time.Hour} {
				err := g.Once(context.Background(), "job", now.Add(off), func(context.Context, gate.Run) error {
					t.Errorf("job ran at offset %s", off)
					return nil
				})
				if !errors.Is(err, gate.ErrClockSkew) {
					t.Errorf("offset %s: %v, want ErrClockSkew", off, err)
				}
			}
			if n := len(ledger(t, db.Pool, "job")); n != 0 {
				t.Errorf("refused ticks left %d ledger rows", n)
			}
			// Within tolerance it runs; the refusals left no lock taken.
			if err := g.Once(context.Background(), "job", now.Add(20*time.Second), noop); err != nil {
				t.Errorf("Once within tolerance: %v", err)
			}
			if n := advisoryLocks(t, db.Pool); n != 0 {
				t.Errorf("%d advisory locks held after the runs", n)
			}
		})
	}
}

func TestOnceLedgerOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	g1 := newGate(t, db.Pool, "one", gate.Config{LedgerOnly: true})
	g2 := newGate(t, db.NewPool(t), "two", gate.Config{LedgerOnly: true})
	now := dbNow(t, db.Pool)
	var runs atomic.Int32
	var wg sync.WaitGroup
	for _, g := range []*gate.Gate{g1, g2, g1, g2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := g.Once(context.Background(), "lo", now, func(ctx context.Context, run gate.Run) error {
				runs.Add(1)
				return nil
			})
			if err != nil && !errors.Is(err, gate.ErrSkipped) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if runs.Load() != 1 {
		t.Errorf("tick ran %d times, want 1", runs.Load())
	}
	rows := ledger(t, db.Pool, "lo")
	if r := rows[now.Truncate(time.Microsecond).UTC()]; len(rows) != 1 || r.outcome != "succeeded" {
		t.Errorf("ledger %v", rows)
	}
	// No advisory lock is left behind.
	if n, err := pgprobe.CountAdvisory(context.Background(), db.Pool, pgprobe.Any); err != nil || n != 0 {
		t.Errorf("advisory locks held: %d (%v)", n, err)
	}
}

// every is a Schedule firing every d, aligned to the Unix epoch.
type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	return t.Truncate(d).Add(d)
}

// TestCatchUpLatestOnce: the job last ran three instants ago and nothing ran
// since. Four instances start together; the latest missed instant runs,
// once, and the earlier missed ones do not.
func TestCatchUpLatestOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	const period = 10 * time.Minute
	sched := every(period)
	now := dbNow(t, db.Pool)
	if now.Sub(now.Truncate(period)) > period-5*time.Second {
		time.Sleep(6 * time.Second) // keep the latest instant stable during the test
		now = dbNow(t, db.Pool)
	}
	latest := now.Truncate(period)
	if _, err := db.Pool.Exec(context.Background(),
		`INSERT INTO pgclaim_ticks (job, fire_at, holder, fence, finished_at, outcome)
		 VALUES ('report', $1, 'old-instance', nextval('pgclaim_fence_seq'), $1, 'succeeded')`,
		latest.Add(-3*period)); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	var ranAt atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k := range 4 {
		g := newGate(t, db.NewPool(t), fmt.Sprintf("starter-%d", k), gate.Config{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := g.CatchUp(context.Background(), "report", sched, time.Hour, func(ctx context.Context, run gate.Run) error {
				runs.Add(1)
				ranAt.Store(run.FireAt)
				time.Sleep(20 * time.Millisecond)
				return nil
			})
			if err != nil && !errors.Is(err, gate.ErrSkipped) {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("catch-up ran %d times, want 1", runs.Load())
	}
	if at := ranAt.Load().(time.Time); !at.Equal(latest) {
		t.Errorf("caught up %s, want the latest instant %s", at, latest)
	}
	rows := ledger(t, db.Pool, "report")
	if len(rows) != 2 {
		t.Errorf("ledger has %d rows, want the old run and the caught-up one: %v", len(rows), rows)
	}
	if r, ok := rows[latest.UTC()]; !ok || r.outcome != "succeeded" {
		t.Errorf("latest instant in ledger: %+v %v", r, ok)
	}
	// A later start-up finds nothing to catch up.
	g := newGate(t, db.Pool, "late", gate.Config{})
	err := g.CatchUp(context.Background(), "report", sched, time.Hour, func(context.Context, gate.Run) error {
		t.Error("caught up twice")
		return nil
	})
	if !errors.Is(err, gate.ErrSkipped) {
		t.Errorf("second catch-up: %v, want ErrSkipped", err)
	}
	// A window holding no instant skips too.
	err = g.CatchUp(context.Background(), "other", every(24*time.Hour*365), time.Second, func(context.Context, gate.Run) error {
		t.Error("ran with no instant in the window")
		return nil
	})
	if !errors.Is(err, gate.ErrSkipped) {
		t.Errorf("empty window: %v, want ErrSkipped", err)
	}
}

func TestPrune(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO pgclaim_ticks (job, fire_at, holder, fence, started_at, finished_at, outcome) VALUES
		  ('p', now() - interval '3 days', 'h', 1, now() - interval '3 days', now() - interval '3 days', 'succeeded'),
		  ('p', now() - interval '2 days', 'h', 2, now() - interval '2 days', NULL, 'running'),
		  ('p', now() - interval '1 hour', 'h', 3, now() - interval '1 hour', now() - interval '1 hour', 'failed')`)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, db.Pool, "pruner", gate.Config{})
	n, err := g.Prune(ctx, 24*time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1 row", n, err)
	}
	var left []int64
	rows, _ := db.Pool.Query(ctx, "SELECT fence FROM pgclaim_ticks ORDER BY fence")
	for rows.Next() {
		var f int64
		_ = rows.Scan(&f)
		left = append(left, f)
	}
	if fmt.Sprint(left) != "[2 3]" {
		t.Errorf("left fences %v, want [2 3] (running and recent kept)", left)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	fn := func(context.Context, gate.Run) error { return nil }
	check := func(what string, err error, field string) {
		t.Helper()
		if !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want ErrInvalid naming %q", what, err, field)
		}
	}
	_, err := gate.New(nil, gate.Config{})
	check("nil pool", err, "pool")
	_, err = gate.New(pool, gate.Config{SkewTolerance: -time.Second})
	check("negative tolerance", err, "Config.SkewTolerance")
	_, err = gate.New(pool, gate.Config{LockWait: -time.Second})
	check("negative wait", err, "Config.LockWait")

	g := newGate(t, pool, "bad", gate.Config{})
	now := time.Now()
	check("Once empty name", g.Once(ctx, "", now, fn), "name")
	check("Once zero fireAt", g.Once(ctx, "j", time.Time{}, fn), "fireAt")
	check("Once nil fn", g.Once(ctx, "j", now, nil), "fn")
	check("Exclusive empty name", g.Exclusive(ctx, "", fn), "name")
	check("Exclusive nil fn", g.Exclusive(ctx, "j", nil), "fn")
	check("CatchUp empty name", g.CatchUp(ctx, "", every(time.Minute), time.Hour, fn), "name")
	check("CatchUp nil sched", g.CatchUp(ctx, "j", nil, time.Hour, fn), "sched")
	check("CatchUp zero window", g.CatchUp(ctx, "j", every(time.Minute), 0, fn), "window")
	check("CatchUp negative window", g.CatchUp(ctx, "j", every(time.Minute), -time.Hour, fn), "window")
	check("CatchUp nil fn", g.CatchUp(ctx, "j", every(time.Minute), time.Hour, nil), "fn")
	_, err = g.Prune(ctx, 0)
	check("Prune zero", err, "olderThan")
	_, err = g.Prune(ctx, -time.Hour)
	check("Prune negative", err, "olderThan")

	if err := g.Once(ctx, "", now, fn); err.Error() != "gate: name: must not be empty" {
		t.Errorf("message %q", err)
	}
	// Nothing reached the database.
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pgclaim_ticks").Scan(&n); err != nil || n != 0 {
		t.Errorf("ledger rows after bad input: %d (%v)", n, err)
	}

	g.Close()
	if err := g.Once(ctx, "j", now, fn); !errors.Is(err, gate.ErrClosed) {
		t.Errorf("Once after Close: %v, want ErrClosed", err)
	}
}

// TestOnceLockWaitSkipsClaimedTick: with a lock wait configured, an instance
// firing a tick that another instance is still running skips at once rather
// than waiting for that run to end.
func TestOnceLockWaitSkipsClaimedTick(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	a := newGate(t, db.Pool, "a", gate.Config{})
	b := newGate(t, db.NewPool(t), "b", gate.Config{LockWait: 10 * time.Second})
	at := dbNow(t, db.Pool)
	release := make(chan struct{})
	running := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.Once(ctx, "slow", at, func(context.Context, gate.Run) error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	start := time.Now()
	err := b.Once(ctx, "slow", at, noop)
	if !errors.Is(err, gate.ErrSkipped) || errors.Is(err, gate.ErrHeld) {
		t.Errorf("b: %v, want ErrSkipped (tick claimed)", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("b waited %s for a claimed tick", d)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSkewToleranceGetter: SkewTolerance reports the configured tolerance,
// or the default for zero.
func TestSkewToleranceGetter(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for cfg, want := range map[time.Duration]time.Duration{0: gate.DefaultSkewTolerance, 5 * time.Minute: 5 * time.Minute} {
		g := newGate(t, pool, "h", gate.Config{SkewTolerance: cfg})
		if got := g.SkewTolerance(); got != want {
			t.Errorf("SkewTolerance with Config.SkewTolerance %s = %s, want %s", cfg, got, want)
		}
	}
}
