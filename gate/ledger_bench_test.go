package gate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/shedlock"
	"github.com/pgclaim/pgclaim/pgtest"
)

// Benchmarks of one gate cycle (claim, run an empty job, release), with the
// two figures DESIGN.md compares against measured in the same run:
// a bare advisory lock + unlock on a dedicated connection, and a
// ShedLock-style lock-table cycle. Each reports cycles/s and p50/p99 latency.
//
//	go test -run '^$' -bench . -benchtime 3s ./gate/

// cycles runs one cycle b.N times, timing each.
func cycles(b *testing.B, cycle func(i int) error) {
	b.Helper()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		t0 := time.Now()
		if err := cycle(i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	reportLatency(b, lat, elapsed)
}

func reportLatency(b *testing.B, lat []time.Duration, elapsed time.Duration) {
	slices.Sort(lat)
	if len(lat) == 0 {
		return
	}
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func noop(context.Context, gate.Run) error { return nil }

// ledgerDB returns a database whose ledger has a history, as a service's
// would: 20 jobs ("job" among them) with 1000 finished ticks each, analysed.
// On a fresh, empty clone the planner's statistics say the ledger is empty,
// and the plans a connection caches then scan it sequentially until
// autovacuum analyses it, which a short benchmark never sees.
func ledgerDB(b *testing.B) *pgtest.Database {
	b.Helper()
	db := pgtest.NewDatabase(b)
	if _, err := db.Pool.Exec(context.Background(), `
		INSERT INTO pgclaim_ticks (job, fire_at, holder, fence, started_at, finished_at, outcome)
		SELECT CASE WHEN j = 0 THEN 'job' ELSE 'other-' || j END, t, 'history', nextval('pgclaim_fence_seq'),
		       t, t + interval '1 second', 'succeeded'
		FROM generate_series(0, 19) j,
		     generate_series(now() - interval '1000 minutes', now() - interval '1 minute', interval '1 minute') t`); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(context.Background(), `ANALYZE pgclaim_ticks`); err != nil {
		b.Fatal(err)
	}
	return db
}

// BenchmarkOnce: the full gate — skew check, ledger insert and advisory lock
// in one statement, then outcome and unlock in one statement.
func BenchmarkOnce(b *testing.B) {
	db := ledgerDB(b)
	g := newGate(b, db.Pool, "bench", gate.Config{})
	base := dbNow(b, db.Pool)
	ctx := context.Background()
	cycles(b, func(i int) error {
		return g.Once(ctx, "job", base.Add(time.Duration(i)*time.Microsecond), noop)
	})
}

// BenchmarkOnceSkip: a tick another instance already ran (the common case on
// every instance but one).
func BenchmarkOnceSkip(b *testing.B) {
	db := ledgerDB(b)
	g := newGate(b, db.Pool, "bench", gate.Config{})
	at := dbNow(b, db.Pool)
	ctx := context.Background()
	if err := g.Once(ctx, "job", at, noop); err != nil {
		b.Fatal(err)
	}
	cycles(b, func(int) error {
		if err := g.Once(ctx, "job", at, noop); err == nil {
			return fmt.Errorf("tick ran twice")
		}
		return nil
	})
}

// BenchmarkOnceLedgerOnly: ledger without the advisory lock, through the pool.
func BenchmarkOnceLedgerOnly(b *testing.B) {
	db := ledgerDB(b)
	g := newGate(b, db.Pool, "bench", gate.Config{LedgerOnly: true})
	base := dbNow(b, db.Pool)
	ctx := context.Background()
	cycles(b, func(i int) error {
		return g.Once(ctx, "job", base.Add(time.Duration(i)*time.Microsecond), noop)
	})
}

// BenchmarkOnceParallel: 8 jobs gated at once through one Gate, each on
// its own goroutine; b.N cycles in all.
func BenchmarkOnceParallel(b *testing.B) {
	const workers = 8
	db := ledgerDB(b)
	g := newGate(b, db.Pool, "bench", gate.Config{})
	base := dbNow(b, db.Pool)
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := fmt.Sprintf("job-%d", w)
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := g.Once(ctx, job, base.Add(time.Duration(i)*time.Microsecond), noop); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
}

// BenchmarkBaselineAdvisory: pg_try_advisory_lock + pg_advisory_unlock on a
// dedicated connection, nothing else.
func BenchmarkBaselineAdvisory(b *testing.B) {
	db := pgtest.NewDatabase(b)
	conn := dedicated(b, db.Pool)
	ctx := context.Background()
	cycles(b, func(int) error {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(1, 2)").Scan(&ok); err != nil || !ok {
			return fmt.Errorf("lock: %v %v", ok, err)
		}
		if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock(1, 2)").Scan(&ok); err != nil || !ok {
			return fmt.Errorf("unlock: %v %v", ok, err)
		}
		return nil
	})
}

// BenchmarkBaselineShedLock: the lock-table cycle of ShedLock with database
// time (harness/shedlock) — take the row if free or expired, then unlock,
// keeping no at-least.
func BenchmarkBaselineShedLock(b *testing.B) {
	db := pgtest.NewDatabase(b)
	cycles(b, shedLockCycle(b, db.Pool))
}

// shedLockCycle creates ShedLock's table (package harness/shedlock, the
// one baseline every pgclaim benchmark compares with) in pool's database and
// returns one lock + unlock cycle on it.
func shedLockCycle(b *testing.B, pool *pgxpool.Pool) func(int) error {
	ctx := context.Background()
	if err := shedlock.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	return func(int) error {
		took, err := shedlock.Lock(ctx, pool, "job", "bench", time.Minute)
		if err != nil || !took {
			return fmt.Errorf("lock: %v %v", took, err)
		}
		return shedlock.Unlock(ctx, pool, "job", "bench", 0)
	}
}

// BenchmarkOnceVsShedLock measures DESIGN.md's target side by side: each
// iteration runs one full Once cycle (ledger + advisory exclusion, empty
// job) and one ShedLock-style cycle on the same database.
func BenchmarkOnceVsShedLock(b *testing.B) {
	db := ledgerDB(b)
	g := newGate(b, db.Pool, "bench", gate.Config{})
	shed := shedLockCycle(b, db.Pool)
	base := dbNow(b, db.Pool)
	ctx := context.Background()
	sideBySide(b, "once", func(i int) error {
		return g.Once(ctx, "job", base.Add(time.Duration(i)*time.Microsecond), noop)
	}, "shedlock", shed)
}

// sideBySide runs cycles a and base alternately, b.N each, switching which
// goes first every iteration, so load on the machine falls on both alike.
// It reports the p50 of each, their ratio, and the median of the
// per-iteration differences.
func sideBySide(b *testing.B, nameA string, a func(int) error, nameBase string, base func(int) error) {
	b.Helper()
	latA := make([]time.Duration, 0, b.N)
	latB := make([]time.Duration, 0, b.N)
	timed := func(f func(int) error, i int, lat *[]time.Duration) {
		t0 := time.Now()
		if err := f(i); err != nil {
			b.Fatal(err)
		}
		*lat = append(*lat, time.Since(t0))
	}
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			timed(a, i, &latA)
			timed(base, i, &latB)
		} else {
			timed(base, i, &latB)
			timed(a, i, &latA)
		}
	}
	b.StopTimer()
	diff := make([]time.Duration, b.N)
	for i := range diff {
		diff[i] = latA[i] - latB[i]
	}
	slices.Sort(latA)
	slices.Sort(latB)
	slices.Sort(diff)
	p50A, p50B := latA[b.N/2], latB[b.N/2]
	b.ReportMetric(float64(p50A.Microseconds()), nameA+"-p50-µs")
	b.ReportMetric(float64(p50B.Microseconds()), nameBase+"-p50-µs")
	b.ReportMetric(float64(p50A)/float64(p50B), nameA+"/"+nameBase)
	b.ReportMetric(float64(diff[b.N/2].Microseconds()), "diff-p50-µs")
}

// dedicated takes a connection out of pool for the benchmark's length.
func dedicated(b testing.TB, pool *pgxpool.Pool) *pgx.Conn {
	b.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	conn := c.Hijack()
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// BenchmarkOnceFiredTogether: 8 instances (each a Gate with its own pool)
// fire each tick at once, every Once on a goroutine of its own as a cron
// library starts one per run, and the next tick when all have returned;
// b.N ticks, each run once.
func BenchmarkOnceFiredTogether(b *testing.B) {
	const instances = 8
	db := ledgerDB(b)
	gs := make([]*gate.Gate, instances)
	for i := range gs {
		gs[i] = newGate(b, db.NewPool(b), fmt.Sprintf("i%d", i), gate.Config{Logger: slog.New(slog.DiscardHandler)})
	}
	base := dbNow(b, db.Pool)
	ctx := context.Background()
	var ran atomic.Int64
	job := func(context.Context, gate.Run) error { ran.Add(1); return nil }
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		var wg sync.WaitGroup
		for _, g := range gs {
			wg.Go(func() {
				err := g.Once(ctx, "job", base.Add(time.Duration(i)*time.Microsecond), job)
				if err != nil && !errors.Is(err, gate.ErrSkipped) {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ticks/s")
	if n := ran.Load(); n != int64(b.N) {
		b.Fatalf("%d ticks ran %d times in all, want each once", b.N, n)
	}
}
