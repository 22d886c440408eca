package gate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/store"
)

// Silent network: the network between a holder and the server goes quiet
// (sockets open, nothing answered) while a run holds its lock; a second
// instance, connected directly, tries to take the job over all along. The
// holder's run must be cancelled before the successor's run starts. The
// tests log both times, measured from the moment the network fell silent.

// serverDropAfter is the soonest the server frees the advisory locks of a
// client whose network went silent: its TCP keepalive (tcp_keepalives_idle
// 5 s, interval 2 s, count 3, set on every lock connection) gives up 11 s
// after the last packet it received, and a quiet connection exchanges a
// keepalive at least every 5 s, so at least 6 s after the silence began.
// The blackhole keeps the server's side of the socket alive, so the test
// ends the holder's session itself at that moment, as the keepalive would.
const serverDropAfter = 6 * time.Second

// blackholePool opens a pool on db through a blackhole.
func blackholePool(t *testing.T, db *pgtest.Database) (*pgxpool.Pool, *pgprobe.Blackhole) {
	t.Helper()
	cfg, bh := pgprobe.BlackholeConfig(t, db.Pool)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(bh.Cut) // first: what still waits on the silent network fails
	return pool, bh
}

// silentRun is what a silent-network test measured.
type silentRun struct {
	silentAt   time.Time // the network fell silent
	cancelled  time.Time // the holder's run saw its context end
	cause      error     // why
	succeeded  time.Time // the successor's run started
	returned   error     // what the holder's call returned
	returnedAt time.Time
}

// check asserts the ordering invariant and logs the figures.
func (r silentRun) check(t *testing.T, what string) {
	t.Helper()
	t.Logf("%s: holder's run cancelled %v after the network went silent (cause: %v); successor's run started %v after; margin %v; holder returned %v after",
		what, r.cancelled.Sub(r.silentAt).Round(time.Millisecond), r.cause, r.succeeded.Sub(r.silentAt).Round(time.Millisecond),
		r.succeeded.Sub(r.cancelled).Round(time.Millisecond), r.returnedAt.Sub(r.silentAt).Round(time.Millisecond))
	if r.cancelled.IsZero() {
		t.Fatalf("%s: the holder's run was never cancelled; the successor started %v after the network went silent", what, r.succeeded.Sub(r.silentAt))
	}
	if !r.cancelled.Before(r.succeeded) {
		t.Errorf("%s: runs overlapped by %v: the holder's run was cancelled %v after the network went silent, the successor's started %v after",
			what, r.cancelled.Sub(r.succeeded), r.cancelled.Sub(r.silentAt), r.succeeded.Sub(r.silentAt))
	}
	if !errors.Is(r.cause, gate.ErrLockLost) {
		t.Errorf("%s: cause %v; want ErrLockLost", what, r.cause)
	}
	if !errors.Is(r.returned, gate.ErrLockLost) {
		t.Errorf("%s: holder returned %v; want ErrLockLost", what, r.returned)
	}
}

// measureSilent runs hold (the holder's call, whose job is the given fn),
// silences the network after quietAfter into the run, calls silenced once
// it is silent, and runs succeed (the successor's attempt, returning true
// once its run started) every 10 ms until it starts.
func measureSilent(t *testing.T, bh *pgprobe.Blackhole, quietAfter time.Duration,
	hold func(fn gate.Func) error, silenced func(), succeed func(started *time.Time) (bool, error)) silentRun {
	t.Helper()
	var r silentRun
	running := make(chan struct{})
	cancelled := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.returned = hold(func(ctx context.Context, _ gate.Run) error {
			close(running)
			<-ctx.Done()
			r.cancelled, r.cause = time.Now(), context.Cause(ctx)
			close(cancelled)
			return ctx.Err()
		})
		r.returnedAt = time.Now()
	}()
	select {
	case <-running:
	case <-done:
		t.Fatalf("holder did not run: %v", r.returned)
	}
	time.Sleep(quietAfter)
	r.silentAt = time.Now()
	bh.Silence()
	if silenced != nil {
		silenced()
	}
	limit := time.Now().Add(20 * time.Second)
	for {
		ok, err := succeed(&r.succeeded)
		if err != nil {
			t.Fatalf("successor: %v", err)
		}
		if ok {
			break
		}
		if time.Now().After(limit) {
			t.Fatal("the successor did not run within 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-cancelled:
	case <-time.After(time.Until(limit)):
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the holder's call did not return within 20 s of its run's cancellation")
	}
	return r
}

// TestSilentNetworkAdvisory: a run of Exclusive or Once whose lock
// connection goes silent is cancelled (ErrLockLost) before the server can
// free its lock for another instance (serverDropAfter), and so before the
// successor's run starts. It pings as in production, so it runs alone;
// its two cases run side by side.
func TestSilentNetworkAdvisory(t *testing.T) {
	t.Cleanup(gate.UseProductionPing())
	srv := pgtest.Shared(t)
	for _, kind := range []string{"exclusive", "once"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			pool, bh := blackholePool(t, db)
			holder := newGate(t, pool, "silent", gate.Config{})
			successor := newGate(t, db.Pool, "direct", gate.Config{})
			at := time.Now().Truncate(time.Second)
			var pid uint32
			hold := func(fn gate.Func) error {
				job := func(ctx context.Context, run gate.Run) error {
					pid = holderPID(t, db.Pool, "job")
					return fn(ctx, run)
				}
				if kind == "once" {
					return holder.Once(context.Background(), "job", at, job)
				}
				return holder.Exclusive(context.Background(), "job", job)
			}
			// The server frees the lock when its keepalive gives up on
			// the silent client, at the soonest.
			silenced := func() {
				time.AfterFunc(serverDropAfter, func() {
					if err := srv.Terminate(context.Background(), pid); err != nil {
						t.Errorf("terminate the silent holder's session: %v", err)
					}
				})
			}
			succeed := func(started *time.Time) (bool, error) {
				fn := func(context.Context, gate.Run) error { *started = time.Now(); return nil }
				var err error
				if kind == "once" {
					err = successor.Once(context.Background(), "job", at.Add(time.Second), fn)
				} else {
					err = successor.Exclusive(context.Background(), "job", fn)
				}
				if errors.Is(err, gate.ErrHeld) {
					return false, nil
				}
				return err == nil, err
			}
			// 1.5 s into the run: between two pings of the watcher.
			r := measureSilent(t, bh, 1500*time.Millisecond, hold, silenced, succeed)
			r.check(t, kind)
		})
	}
}

// TestSilentNetworkLease: a Lease.Do run whose pool goes silent is cancelled
// (its renewals go unanswered) before the lease runs out in the database
// and the successor's TryAcquire takes it.
func TestSilentNetworkLease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	pool, bh := blackholePool(t, db)
	o := gate.LeaseConfig{AtMost: 2 * time.Second}
	holder := newLease(t, pool, "job", "silent", o)
	successor := newLease(t, db.Pool, "job", "direct", o)
	hold := func(fn gate.Func) error { return holder.Do(context.Background(), fn) }
	succeed := func(started *time.Time) (bool, error) {
		h, err := successor.TryAcquire(context.Background())
		if errors.Is(err, gate.ErrHeld) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		*started = time.Now()
		return true, h.Release(context.Background())
	}
	// Just after a renewal (every AtMost/3).
	r := measureSilent(t, bh, o.AtMost/3+o.AtMost/10, hold, nil, succeed)
	r.check(t, "lease")
}

// TestSilentNetworkElector: a leader whose network goes silent steps down
// (its leadership context ends) before a standby, connected directly, can
// lead. For the advisory variant the server drops the leader's session at
// once (as a failover would: the promoted server holds no lock), so the
// standby gets the lock at once and must wait out the TTL for the silent
// leader's term.
func TestSilentNetworkElector(t *testing.T) {
	t.Parallel()
	srv := pgtest.Shared(t)
	for _, m := range []gate.Mechanism{gate.LeaseRow, gate.Advisory} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			pool, bh := blackholePool(t, db)
			o := gate.ElectorConfig{Mechanism: m, TTL: 2 * time.Second}
			leader := newElector(t, pool, "e", "silent", o)
			standby := newElector(t, db.Pool, "e", "direct", o)
			lctx, err := leader.Campaign(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = leader.Resign(context.Background()) })
			steppedc := make(chan time.Time, 1)
			context.AfterFunc(lctx, func() { steppedc <- time.Now() })
			var pid uint32
			if m == gate.Advisory {
				class, key := gate.ElectionKey("e")
				p, err := store.New(db.Pool).AdvisoryHolder(context.Background(), store.AdvisoryHolderParams{LockClass: class, LockKey: key})
				if err != nil {
					t.Fatal(err)
				}
				pid = uint32(p)
			}
			led := make(chan time.Time, 1)
			sctx, stop := context.WithCancel(context.Background())
			defer stop()
			go func() {
				if _, err := standby.Campaign(sctx); err == nil {
					led <- time.Now()
				}
			}()
			t.Cleanup(func() { _ = standby.Resign(context.Background()) })
			time.Sleep(o.TTL/4 + o.TTL/20) // just after a confirmation
			silentAt := time.Now()
			bh.Silence()
			if m == gate.Advisory {
				if err := srv.Terminate(context.Background(), pid); err != nil {
					t.Fatal(err)
				}
			}
			var ledAt time.Time
			select {
			case ledAt = <-led:
			case <-time.After(20 * time.Second):
				t.Fatal("the standby did not lead within 20 s")
			}
			var stepped time.Time
			select {
			case stepped = <-steppedc:
			case <-time.After(time.Second):
			}
			if stepped.IsZero() {
				t.Fatalf("%v: the silent leader had not stepped down when the standby led, %v after the network went silent", m, ledAt.Sub(silentAt))
			}
			t.Logf("%v: silent leader stepped down %v after the network went silent (cause: %v); standby led %v after; margin %v",
				m, stepped.Sub(silentAt).Round(time.Millisecond), context.Cause(lctx), ledAt.Sub(silentAt).Round(time.Millisecond), ledAt.Sub(stepped).Round(time.Millisecond))
			if !stepped.Before(ledAt) {
				t.Errorf("%v: leaderships overlapped by %v", m, stepped.Sub(ledAt))
			}
			if !errors.Is(context.Cause(lctx), gate.ErrLockLost) {
				t.Errorf("%v: cause %v; want ErrLockLost", m, context.Cause(lctx))
			}
		})
	}
}
