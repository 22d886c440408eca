package gate_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/harness/shedlock"
	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/store"
)

// leaseLatency adds p50 and p99 of ds (in µs) to the benchmark's output.
func leaseLatency(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkLeaseCycle measures one lock + unlock of a free lock, each
// variant on the same database: gate.Lease (TryAcquire + Release, with and
// without its keep-alive goroutine), and the baseline "shedlock-sql": the
// ShedLock-style cycle of package harness/shedlock against a table of
// ShedLock's shape, with database time — an upsert that takes the row only when expired, and
// an unlock that keeps at-least, scoped by name and holder (no fencing
// token).
func BenchmarkLeaseCycle(b *testing.B) {
	pool := pgtest.Pool(b)
	ctx := context.Background()
	if err := shedlock.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}

	leaseCycle := func(o gate.LeaseConfig) func() error {
		l := newLease(b, pool, "bench", "a", o)
		return func() error {
			h, err := l.TryAcquire(ctx)
			if err != nil {
				return err
			}
			return h.Release(ctx)
		}
	}
	for _, c := range []struct {
		name  string
		cycle func() error
	}{
		{"lease", leaseCycle(gate.LeaseConfig{AtMost: time.Minute})},
		{"lease-nokeepalive", leaseCycle(gate.LeaseConfig{AtMost: time.Minute, NoKeepAlive: true})},
		{"shedlock-sql", func() error {
			took, err := shedlock.Lock(ctx, pool, "bench", "a", time.Minute)
			if err != nil {
				return err
			}
			if !took {
				return errors.New("shedlock row not taken")
			}
			return shedlock.Unlock(ctx, pool, "bench", "a", 0)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, 1024)
			for b.Loop() {
				t0 := time.Now()
				if err := c.cycle(); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t0))
			}
			leaseLatency(b, ds)
		})
	}
}

// BenchmarkElectorTakeover measures how long after the leader resigns, or
// its backend is terminated, a waiting standby leads (ms/takeover). Two
// instances take turns. The lease standby polls every 10ms, so it takes
// over after about half of that on average.
func BenchmarkElectorTakeover(b *testing.B) {
	for _, c := range []struct {
		name  string
		lease bool
		kill  bool
	}{
		{"advisory/resign", false, false},
		{"advisory/terminate", false, true},
		{"lease/resign", true, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			db := pgtest.NewDatabase(b)
			srv := pgtest.Shared(b)
			ctx := context.Background()
			o := gate.ElectorConfig{Mechanism: mechanism(c.lease), TTL: 2 * time.Second, RetryInterval: 10 * time.Millisecond}
			es := []*gate.Elector{
				newElector(b, db.NewPool(b), "bench", "a", o),
				newElector(b, db.NewPool(b), "bench", "b", o),
			}
			won := make(chan time.Time, 1)
			campaign := func(e *gate.Elector) {
				go func() {
					if _, err := e.Campaign(ctx); err == nil {
						won <- time.Now()
					}
				}()
			}
			campaign(es[0])
			<-won
			leader := 0
			var total time.Duration
			var ds []time.Duration
			b.ResetTimer()
			for b.Loop() {
				b.StopTimer()
				standby := 1 - leader
				campaign(es[standby])
				if c.lease {
					// past the standby's first try, at a random phase
					// of its polling
					time.Sleep(o.RetryInterval + rand.N(o.RetryInterval))
				} else {
					waitForWaiter(b, db.Pool, "bench")
				}
				b.StartTimer()
				t0 := time.Now()
				if c.kill {
					pid, err := electionHolderPID(ctx, db.Pool, "bench")
					if err != nil {
						b.Fatal(err)
					}
					if err := srv.Terminate(ctx, pid); err != nil {
						b.Fatal(err)
					}
				} else if err := es[leader].Resign(ctx); err != nil {
					b.Fatal(err)
				}
				at := <-won
				d := at.Sub(t0)
				total += d
				ds = append(ds, d)
				b.StopTimer()
				if c.kill {
					for es[leader].IsLeader() {
						time.Sleep(time.Millisecond)
					}
				}
				leader = standby
				b.StartTimer()
			}
			b.StopTimer()
			es[leader].Resign(ctx)
			b.ReportMetric(float64(total.Microseconds())/1e3/float64(len(ds)), "ms/takeover")
			leaseLatency(b, ds)
		})
	}
}

// waitForWaiter returns once a session waits for the election's lock.
func waitForWaiter(b *testing.B, pool *pgxpool.Pool, name string) {
	class, key := gate.ElectionKey(name)
	for range 1000 {
		n, err := pgprobe.CountAdvisory(context.Background(), pool, pgprobe.Waiting, pgprobe.Pair(class, key))
		if err != nil && !errors.Is(err, context.Canceled) {
			b.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	b.Fatal("no standby waiting for the election lock")
}

// BenchmarkLeaseVsShedLock measures DESIGN.md's target for leases side by
// side with ShedLock's statements on the same database, alternating which
// goes first each iteration: "do" runs one Lease.Do cycle (acquire, an
// empty job, release), "statements" the lease's own two statements from
// package store with nothing of the library around them, whose gap to
// ShedLock's is what the fencing token costs.
func BenchmarkLeaseVsShedLock(b *testing.B) {
	pool := pgtest.Pool(b)
	ctx := context.Background()
	shed := shedLockCycle(b, pool)
	l := newLease(b, pool, "bench-do", "a", gate.LeaseConfig{AtMost: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	q := store.New(lockcore.ReadCommitted{Pool: pool})
	for _, c := range []struct {
		name  string
		cycle func(int) error
	}{
		{"do", func(int) error { return l.Do(ctx, noop) }},
		{"statements", func(int) error {
			row, err := q.AcquireLease(ctx, store.AcquireLeaseParams{Name: "bench-sql", Holder: "a", AtMostUs: time.Minute.Microseconds()})
			if err != nil {
				return err
			}
			n, err := q.ReleaseLease(ctx, store.ReleaseLeaseParams{Name: "bench-sql", Fence: row.Fence})
			if err == nil && n != 1 {
				err = errors.New("lease not released")
			}
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) { sideBySide(b, "lease", c.cycle, "shedlock", shed) })
	}
}
