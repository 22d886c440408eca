package gate_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
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
// time — take the row if free or expired, then unlock by setting lock_until
// to now.
func BenchmarkBaselineShedLock(b *testing.B) {
	db := pgtest.NewDatabase(b)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE shedlock (name text PRIMARY KEY, lock_until timestamptz NOT NULL,
		locked_at timestamptz NOT NULL, locked_by text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	cycles(b, func(int) error {
		tag, err := db.Pool.Exec(ctx, `INSERT INTO shedlock (name, lock_until, locked_at, locked_by)
			VALUES ('job', now() + interval '1 minute', now(), 'bench')
			ON CONFLICT (name) DO UPDATE SET lock_until = EXCLUDED.lock_until, locked_at = EXCLUDED.locked_at,
			    locked_by = EXCLUDED.locked_by
			WHERE shedlock.lock_until <= now()`)
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("lock: %v %v", tag, err)
		}
		_, err = db.Pool.Exec(ctx, `UPDATE shedlock SET lock_until = now() WHERE name = 'job' AND locked_by = 'bench'`)
		return err
	})
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
