package gate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// isolationLevels runs f on a fresh database whose
// default_transaction_isolation is repeatable read, and on one where it is
// serializable. pools opens an instance's pool on it.
func isolationLevels(t *testing.T, f func(t *testing.T, pools func() *pgxpool.Pool)) {
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(iso, " ", "_"), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			ctx := context.Background()
			if _, err := db.Pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+
				" SET default_transaction_isolation = '"+iso+"'"); err != nil {
				t.Fatal(err)
			}
			pools := func() *pgxpool.Pool {
				p := db.NewPool(t)
				var got string
				if err := p.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil || got != iso {
					t.Fatalf("transaction_isolation = %q, %v; want %q", got, err, iso)
				}
				return p
			}
			f(t, pools)
		})
	}
}

// warnLog records warnings and errors, for tests that assert none mentions
// a serialization failure.
type warnLog struct{ syncBuffer }

func (w *warnLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (w *warnLog) check(t *testing.T) {
	t.Helper()
	if s := w.String(); strings.Contains(s, "40001") || strings.Contains(s, "could not serialize") {
		t.Errorf("serialization failures logged:\n%s", s)
	}
}

// notSerialization fails t on an error that is not nil and not want (a
// sentinel the path may return); it names SQLSTATE 40001 when it is one.
func notSerialization(t *testing.T, what string, err error, want ...error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, w := range want {
		if errors.Is(err, w) {
			return
		}
	}
	t.Errorf("%s: %v", what, err)
}

const contenders = 8

// hourly is a schedule of every full hour (UTC).
type hourly struct{}

func (hourly) Next(t time.Time) time.Time { return t.Truncate(time.Hour).Add(time.Hour) }

// Once (with the advisory lock, and ledger-only), CatchUp and Prune, with
// many instances firing the same ticks at once: one run per tick, every
// other instance skipped, never a serialization failure.
func TestIsolationLedger(t *testing.T) {
	isolationLevels(t, func(t *testing.T, pools func() *pgxpool.Pool) {
		ctx := context.Background()
		var logs warnLog
		for _, ledgerOnly := range []bool{false, true} {
			gates := make([]*gate.Gate, contenders)
			var p0 *pgxpool.Pool
			for i := range gates {
				p := pools()
				if i == 0 {
					p0 = p
				}
				gates[i] = newGate(t, p, fmt.Sprintf("inst-%d", i), gate.Config{
					LedgerOnly: ledgerOnly, Logger: logs.logger(),
				})
			}
			job := fmt.Sprintf("job-ledgeronly-%v", ledgerOnly)
			base := time.Now().Truncate(time.Second)
			const ticks = 40
			var runs [ticks]atomic.Int32
			// Every instance fires tick k at once, then tick k+1 (the job's
			// lock is one for all its ticks).
			var wg sync.WaitGroup
			for k := range ticks {
				for _, g := range gates {
					wg.Add(1)
					go func() {
						defer wg.Done()
						err := g.Once(ctx, job, base.Add(time.Duration(k)*time.Millisecond), func(context.Context, gate.Run) error {
							runs[k].Add(1)
							return nil
						})
						notSerialization(t, "Once", err, gate.ErrSkipped)
					}()
				}
				wg.Wait()
			}
			for k := range runs {
				if n := runs[k].Load(); n != 1 {
					t.Errorf("ledgerOnly=%v: tick %d ran %d times; want 1", ledgerOnly, k, n)
				}
			}

			// CatchUp at once on every instance, for several jobs.
			for j := range 10 {
				name := fmt.Sprintf("catchup-%v-%d", ledgerOnly, j)
				var n atomic.Int32
				for _, g := range gates {
					wg.Add(1)
					go func() {
						defer wg.Done()
						err := g.CatchUp(ctx, name, hourly{}, 2*time.Hour, func(context.Context, gate.Run) error {
							n.Add(1)
							return nil
						})
						notSerialization(t, "CatchUp", err, gate.ErrSkipped)
					}()
				}
				wg.Wait()
				// One instant, unless the instances straddled an hour.
				if rows := len(ledger(t, p0, name)); n.Load() != int32(rows) || rows < 1 {
					t.Errorf("ledgerOnly=%v: catch-up %q ran %d times for %d ticks; want once per tick", ledgerOnly, name, n.Load(), rows)
				}
			}

			// Prune from every instance at once.
			if _, err := p0.Exec(ctx,
				`UPDATE pgclaim_ticks SET started_at = started_at - interval '1 day', fire_at = fire_at - interval '1 day'`); err != nil {
				t.Fatal(err)
			}
			var total int64
			if err := p0.QueryRow(ctx, `SELECT count(*) FROM pgclaim_ticks`).Scan(&total); err != nil {
				t.Fatal(err)
			}
			var pruned atomic.Int64
			for _, g := range gates {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, err := g.Prune(ctx, 3*time.Hour)
					notSerialization(t, "Prune", err)
					pruned.Add(n)
				}()
			}
			wg.Wait()
			if pruned.Load() != total {
				t.Errorf("ledgerOnly=%v: pruned %d ticks; want %d", ledgerOnly, pruned.Load(), total)
			}
		}
		logs.check(t)
	})
}

// The abandoned-tick path: ticks left running by dead holders are marked
// abandoned by the instance that next takes the job's lock, while every
// instance fires the next tick at once.
func TestIsolationAbandon(t *testing.T) {
	isolationLevels(t, func(t *testing.T, pools func() *pgxpool.Pool) {
		ctx := context.Background()
		var logs warnLog
		gates := make([]*gate.Gate, contenders)
		var p0 *pgxpool.Pool
		for i := range gates {
			p := pools()
			if i == 0 {
				p0 = p
			}
			gates[i] = newGate(t, p, fmt.Sprintf("inst-%d", i), gate.Config{Logger: logs.logger()})
		}
		var abandoned atomic.Int32
		for round := range 10 {
			job := fmt.Sprintf("abandon-%d", round)
			if _, err := p0.Exec(ctx, `
				INSERT INTO pgclaim_ticks (job, fire_at, holder, fence, started_at)
				VALUES ($1, now() - interval '1 minute', 'dead', nextval('pgclaim_fence_seq'), now() - interval '1 minute')`, job); err != nil {
				t.Fatal(err)
			}
			at := time.Now().Truncate(time.Millisecond)
			var runs atomic.Int32
			var wg sync.WaitGroup
			for _, g := range gates {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := g.Once(ctx, job, at, func(context.Context, gate.Run) error { runs.Add(1); return nil })
					notSerialization(t, "Once", err, gate.ErrSkipped)
				}()
			}
			wg.Wait()
			if runs.Load() != 1 {
				t.Errorf("%s: ran %d times; want 1", job, runs.Load())
			}
			var outcome string
			if err := p0.QueryRow(ctx, `SELECT outcome FROM pgclaim_ticks WHERE job = $1 AND holder = 'dead'`, job).Scan(&outcome); err != nil {
				t.Fatal(err)
			}
			if outcome == "abandoned" {
				abandoned.Add(1)
			} else {
				t.Errorf("%s: dead holder's tick is %q; want abandoned", job, outcome)
			}
		}
		logs.check(t)
	})
}

// Lease takeover: many instances try to take an expired lease at once: one
// gets it, the others ErrHeld; the previous holder's Extend and Release
// find it lost (ErrLockLost), never a serialization failure.
func TestIsolationLease(t *testing.T) {
	isolationLevels(t, func(t *testing.T, pools func() *pgxpool.Pool) {
		ctx := context.Background()
		var logs warnLog
		leases := make([]*gate.Lease, contenders)
		for i := range leases {
			l, err := gate.NewLease(pools(), "shared", gate.LeaseConfig{
				Holder: fmt.Sprintf("inst-%d", i), Logger: logs.logger(),
				AtMost: 200 * time.Millisecond, NoKeepAlive: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			leases[i] = l
		}
		var prev *gate.LeaseHandle
		for round := range 15 {
			time.Sleep(210 * time.Millisecond) // the previous lease expires
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				won  []*gate.LeaseHandle
				last = prev
			)
			if last != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					notSerialization(t, "Extend", last.Extend(ctx), gate.ErrLockLost)
				}()
			}
			for _, l := range leases {
				wg.Add(1)
				go func() {
					defer wg.Done()
					h, err := l.TryAcquire(ctx)
					notSerialization(t, "TryAcquire", err, gate.ErrHeld)
					if err == nil {
						mu.Lock()
						won = append(won, h)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if last != nil {
				notSerialization(t, "Release", last.Release(ctx), gate.ErrLockLost)
			}
			if len(won) > 1 {
				t.Fatalf("round %d: %d holders at once", round, len(won))
			}
			prev = nil
			if len(won) == 1 {
				prev = won[0]
			}
		}
		logs.check(t)
	})
}

// Elector terms: several candidates of each variant campaign at once; each
// leader resigns after a moment, many times over. Terms never overlap, and
// no campaign, renewal or close fails with a serialization failure.
func TestIsolationElector(t *testing.T) {
	isolationLevels(t, func(t *testing.T, pools func() *pgxpool.Pool) {
		for _, lease := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			var logs warnLog
			name := fmt.Sprintf("iso-lease-%v", lease)
			o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: 400 * time.Millisecond, RetryInterval: 5 * time.Millisecond,
				Logger: logs.logger()}
			var terms atomic.Int32
			var wg sync.WaitGroup
			var last *pgxpool.Pool
			for i := range 4 {
				last = pools()
				e := newElector(t, last, name, fmt.Sprintf("inst-%d", i), o)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for terms.Load() < 20 && ctx.Err() == nil {
						lctx, err := e.Campaign(ctx)
						if err != nil {
							notSerialization(t, "Campaign", err, context.DeadlineExceeded)
							return
						}
						terms.Add(1)
						select {
						case <-lctx.Done():
						case <-time.After(20 * time.Millisecond):
						}
						// Resign's statements are bounded by the TTL: on a
						// starved machine one can run out, which is not what
						// this test is about.
						notSerialization(t, "Resign", e.Resign(context.Background()), context.DeadlineExceeded)
						if _, err := e.Prune(context.Background(), time.Hour); err != nil {
							notSerialization(t, "Prune", err)
						}
					}
				}()
			}
			wg.Wait()
			cancel()
			if terms.Load() < 20 {
				t.Errorf("lease=%v: %d terms in 30s; want 20", lease, terms.Load())
			}
			checkTerms(t, last, name)
			logs.check(t)
		}
	})
}
