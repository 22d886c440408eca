package gate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/store"
)

// newLease builds a lease or fails the test.
func newLease(t testing.TB, pool *pgxpool.Pool, name, holder string, o gate.LeaseConfig) *gate.Lease {
	t.Helper()
	o.Holder = holder
	l, err := gate.NewLease(pool, name, o)
	if err != nil {
		t.Fatalf("NewLease(%q): %v", name, err)
	}
	return l
}

// mustAcquire takes l or fails the test.
func mustAcquire(t testing.TB, l *gate.Lease) *gate.LeaseHandle {
	t.Helper()
	h, err := l.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("TryAcquire(%s): %v", l.Name(), err)
	}
	return h
}

// mustBeHeld asserts that l cannot be acquired now.
func mustBeHeld(t testing.TB, l *gate.Lease) {
	t.Helper()
	h, err := l.TryAcquire(context.Background())
	if err == nil {
		h.Release(context.Background())
		t.Fatalf("TryAcquire(%s) succeeded; want it held elsewhere", l.Name())
	}
	if !errors.Is(err, gate.ErrHeld) || !errors.Is(err, gate.ErrSkipped) {
		t.Fatalf("TryAcquire(%s) = %v; want ErrHeld (and ErrSkipped)", l.Name(), err)
	}
}

// lockRow reads the pgclaim_locks row of name.
func lockRow(t testing.TB, pool *pgxpool.Pool, name string) store.LeaseByNameRow {
	t.Helper()
	r, err := store.New(pool).LeaseByName(context.Background(), name)
	if err != nil {
		t.Fatalf("LeaseByName(%q): %v", name, err)
	}
	return r
}

// waitAcquire retries TryAcquire until it succeeds or limit passes.
func waitAcquire(t testing.TB, l *gate.Lease, limit time.Duration) (*gate.LeaseHandle, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		h, err := l.TryAcquire(context.Background())
		if err == nil {
			return h, time.Since(start)
		}
		if !errors.Is(err, gate.ErrHeld) {
			t.Fatalf("TryAcquire(%s): %v", l.Name(), err)
		}
		if time.Since(start) > limit {
			t.Fatalf("TryAcquire(%s): still held after %v", l.Name(), limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var manualLease = gate.LeaseConfig{AtMost: 10 * time.Second, NoKeepAlive: true}

func TestLeaseLockUnlock(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a := newLease(t, pool, "job", "a", manualLease)
	b := newLease(t, pool, "job", "b", manualLease)

	h := mustAcquire(t, a)
	if h.Fence() <= 0 {
		t.Fatalf("Fence = %d; want a positive fencing token", h.Fence())
	}
	row := lockRow(t, pool, "job")
	if !row.Held || row.Holder != "a" || row.Fence != h.Fence() {
		t.Fatalf("row = %+v; want held by a with fence %d", row, h.Fence())
	}
	if got := row.LockUntil.Time.Sub(row.LockedAt.Time); got != manualLease.AtMost {
		t.Fatalf("lock_until - locked_at = %v; want AtMost %v", got, manualLease.AtMost)
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if row := lockRow(t, pool, "job"); row.Held {
		t.Fatalf("row after release = %+v; want not held", row)
	}
	if h.Context().Err() == nil {
		t.Fatal("handle context not cancelled by Release")
	}
	h2 := mustAcquire(t, b)
	defer h2.Release(context.Background())
	if err := h.Release(context.Background()); !errors.Is(err, gate.ErrReleased) {
		t.Fatalf("second Release = %v; want ErrReleased", err)
	}
	if err := h.Extend(context.Background()); !errors.Is(err, gate.ErrReleased) {
		t.Fatalf("Extend after Release = %v; want ErrReleased", err)
	}
}

func TestLeaseSecondLockRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a := newLease(t, pool, "job", "a", manualLease)
	b := newLease(t, pool, "job", "b", manualLease)
	h := mustAcquire(t, a)
	defer h.Release(context.Background())
	mustBeHeld(t, b)
	mustBeHeld(t, a) // the same holder identity is refused too: no re-entrance
	if row := lockRow(t, pool, "job"); row.Holder != "a" || row.Fence != h.Fence() {
		t.Fatalf("refused attempts changed the row: %+v", row)
	}
}

func TestLeaseIndependentNames(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	h1 := mustAcquire(t, newLease(t, pool, "one", "a", manualLease))
	h2 := mustAcquire(t, newLease(t, pool, "two", "a", manualLease))
	defer h1.Release(context.Background())
	defer h2.Release(context.Background())
	if h1.Fence() == h2.Fence() {
		t.Fatalf("two acquisitions share fence %d", h1.Fence())
	}
	mustBeHeld(t, newLease(t, pool, "one", "b", manualLease))
	mustBeHeld(t, newLease(t, pool, "two", "b", manualLease))
}

func TestLeaseRelockAfterUnlock(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	a := newLease(t, pool, "job", "a", manualLease)
	b := newLease(t, pool, "job", "b", manualLease)
	var last int64
	for i, l := range []*gate.Lease{a, a, b, a} {
		h := mustAcquire(t, l)
		if h.Fence() <= last {
			t.Fatalf("acquisition %d: fence %d not above previous %d", i, h.Fence(), last)
		}
		last = h.Fence()
		if err := h.Release(context.Background()); err != nil {
			t.Fatalf("acquisition %d: Release: %v", i, err)
		}
	}
}

// A holder that crashes (never releases) loses the lease AtMost after it took
// it, by database time; its handle learns of it and cannot touch the next
// holder's lease.
func TestLeaseExpiresAfterAtMost(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	o := gate.LeaseConfig{AtMost: 300 * time.Millisecond, NoKeepAlive: true}
	a := newLease(t, pool, "job", "a", o)
	b := newLease(t, pool, "job", "b", o)

	crashed := mustAcquire(t, a)
	first := lockRow(t, pool, "job")
	mustBeHeld(t, b)
	h, waited := waitAcquire(t, b, 5*time.Second)
	defer h.Release(context.Background())
	second := lockRow(t, pool, "job")
	if second.LockedAt.Time.Before(first.LockUntil.Time) {
		t.Fatalf("taken over at %v, before the lease ran out at %v", second.LockedAt.Time, first.LockUntil.Time)
	}
	if waited < o.AtMost/2 {
		t.Fatalf("taken over after %v; want about AtMost (%v)", waited, o.AtMost)
	}
	select {
	case <-crashed.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("the crashed holder's context was not cancelled after the lease ran out")
	}
	if cause := context.Cause(crashed.Context()); !errors.Is(cause, gate.ErrLockLost) {
		t.Fatalf("cause = %v; want ErrLockLost", cause)
	}
	if err := crashed.Release(context.Background()); !errors.Is(err, gate.ErrLockLost) {
		t.Fatalf("old Release = %v; want ErrLockLost", err)
	}
	if row := lockRow(t, pool, "job"); !row.Held || row.Fence != h.Fence() || row.Holder != "b" {
		t.Fatalf("old holder's release touched the new lease: %+v", row)
	}
}

func TestLeaseAtLeastHoldsAfterUnlock(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	o := gate.LeaseConfig{AtMost: 5 * time.Second, AtLeast: 400 * time.Millisecond, NoKeepAlive: true}
	a := newLease(t, pool, "job", "a", o)
	b := newLease(t, pool, "job", "b", o)
	h := mustAcquire(t, a)
	if err := h.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	row := lockRow(t, pool, "job")
	if got := row.LockUntil.Time.Sub(row.LockedAt.Time); got != o.AtLeast {
		t.Fatalf("after release lock_until - locked_at = %v; want AtLeast %v", got, o.AtLeast)
	}
	mustBeHeld(t, b)
	h2, waited := waitAcquire(t, b, 5*time.Second)
	defer h2.Release(context.Background())
	if waited < o.AtLeast/2 {
		t.Fatalf("reacquired after %v; want about AtLeast (%v)", waited, o.AtLeast)
	}

	// Released after AtLeast has passed: free at once.
	h2.Release(context.Background())
	c := newLease(t, pool, "slow", "a", o)
	h3 := mustAcquire(t, c)
	time.Sleep(o.AtLeast + 50*time.Millisecond)
	if err := h3.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h4 := mustAcquire(t, newLease(t, pool, "slow", "b", o))
	h4.Release(context.Background())
}

func TestLeaseExtend(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	o := gate.LeaseConfig{AtMost: time.Second, NoKeepAlive: true}
	a := newLease(t, pool, "job", "a", o)
	b := newLease(t, pool, "job", "b", o)
	h := mustAcquire(t, a)
	before := lockRow(t, pool, "job")
	time.Sleep(600 * time.Millisecond)
	if err := h.Extend(context.Background()); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	after := lockRow(t, pool, "job")
	if !after.LockUntil.Time.After(before.LockUntil.Time) || after.Fence != before.Fence || !after.LockedAt.Time.Equal(before.LockedAt.Time) {
		t.Fatalf("Extend: row %+v -> %+v; want a later lock_until, same fence and locked_at", before, after)
	}
	time.Sleep(600 * time.Millisecond) // past the original expiry
	mustBeHeld(t, b)
	if h.Context().Err() != nil {
		t.Fatalf("context cancelled although the lease was extended: %v", context.Cause(h.Context()))
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatalf("Release after Extend: %v", err)
	}
	h2 := mustAcquire(t, b)
	h2.Release(context.Background())
}

func TestLeaseExtendExpiredFails(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	o := gate.LeaseConfig{AtMost: 100 * time.Millisecond, NoKeepAlive: true}
	h := mustAcquire(t, newLease(t, pool, "job", "a", o))
	time.Sleep(150 * time.Millisecond)
	err := h.Extend(context.Background())
	if !errors.Is(err, gate.ErrLockLost) {
		t.Fatalf("Extend of an expired lease = %v; want ErrLockLost", err)
	}
	if row := lockRow(t, pool, "job"); row.Held {
		t.Fatalf("a failed Extend revived the lease: %+v", row)
	}
	if h.Context().Err() == nil {
		t.Fatal("context not cancelled after a failed Extend")
	}
}

// An old handle stays dead after the name was acquired again and extended,
// even under the same holder identity: extension and release are fenced by
// the acquisition's token, not by the holder name.
func TestLeaseOldHandleDeadAfterExtend(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	o := gate.LeaseConfig{AtMost: 500 * time.Millisecond, NoKeepAlive: true}
	l := newLease(t, pool, "job", "same-host:1", o)
	old := mustAcquire(t, l)
	time.Sleep(600 * time.Millisecond)
	cur := mustAcquire(t, l)
	if cur.Fence() <= old.Fence() {
		t.Fatalf("new fence %d not above old %d", cur.Fence(), old.Fence())
	}
	if err := cur.Extend(context.Background()); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := old.Extend(context.Background()); !errors.Is(err, gate.ErrLockLost) {
		t.Fatalf("old Extend = %v; want ErrLockLost", err)
	}
	if err := old.Release(context.Background()); !errors.Is(err, gate.ErrLockLost) {
		t.Fatalf("old Release = %v; want ErrLockLost", err)
	}
	row := lockRow(t, pool, "job")
	if !row.Held || row.Fence != cur.Fence() {
		t.Fatalf("old handle touched the current lease: %+v", row)
	}
	if err := cur.Release(context.Background()); err != nil {
		t.Fatalf("current Release: %v", err)
	}
}

// The takeover predicate is scoped by the conflicting row: acquiring one name
// never takes over an expired row of another.
func TestLeaseNeverTakesOverAnotherName(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		INSERT INTO pgclaim_locks (name, holder, locked_at, lock_until, fence) VALUES
		  ('expired-a', 'x', now() - interval '1 hour', now() - interval '59 minutes', 7),
		  ('expired-b', 'y', now() - interval '1 hour', now() - interval '1 second', 8)`); err != nil {
		t.Fatal(err)
	}
	before := map[string]store.LeaseByNameRow{"expired-a": lockRow(t, pool, "expired-a"), "expired-b": lockRow(t, pool, "expired-b")}

	o := gate.LeaseConfig{AtMost: time.Minute, NoKeepAlive: true}
	h := mustAcquire(t, newLease(t, pool, "fresh", "a", o)) // insert path
	mustBeHeld(t, newLease(t, pool, "fresh", "b", o))       // conflict path, not expired
	h.Release(ctx)
	h2 := mustAcquire(t, newLease(t, pool, "fresh", "b", o)) // takeover path
	defer h2.Release(ctx)

	for name, was := range before {
		if now := lockRow(t, pool, name); now != was {
			t.Fatalf("row %q changed by acquiring another name: %+v -> %+v", name, was, now)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_locks`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("rows = %d (%v); want 3", n, err)
	}
	// The expired row of its own name is taken over.
	h3 := mustAcquire(t, newLease(t, pool, "expired-a", "a", o))
	defer h3.Release(ctx)
	if row := lockRow(t, pool, "expired-a"); row.Holder != "a" || row.Fence != h3.Fence() {
		t.Fatalf("expired row not taken over: %+v", row)
	}
}

// 8 goroutines × 2 names each read a counter, wait a little and write it back
// plus one, under the lease: no increment may be lost.
func TestLeaseCounterNoLostUpdate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE counter (name text PRIMARY KEY, n int NOT NULL);
		INSERT INTO counter VALUES ('one', 0), ('two', 0)`); err != nil {
		t.Fatal(err)
	}
	pools := []*pgxpool.Pool{db.Pool, db.NewPool(t)}
	const workers, perName = 8, 15
	var done [2]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*2)
	for w := range workers {
		pool := pools[w%len(pools)]
		for ni, name := range []string{"one", "two"} {
			l := newLease(t, pool, name, fmt.Sprintf("worker-%d", w), gate.LeaseConfig{AtMost: 10 * time.Second})
			wg.Go(func() {
				for i := 0; i < perName; {
					err := l.Do(ctx, func(ctx context.Context, run gate.Run) error {
						var n int
						if err := pool.QueryRow(ctx, `SELECT n FROM counter WHERE name = $1`, name).Scan(&n); err != nil {
							return err
						}
						time.Sleep(time.Millisecond)
						_, err := pool.Exec(ctx, `UPDATE counter SET n = $2 WHERE name = $1`, name, n+1)
						return err
					})
					switch {
					case err == nil:
						done[ni].Add(1)
						i++
					case errors.Is(err, gate.ErrHeld):
						time.Sleep(time.Millisecond)
					default:
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for ni, name := range []string{"one", "two"} {
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT n FROM counter WHERE name = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if want := int64(workers * perName); n != want || done[ni].Load() != want {
			t.Fatalf("counter %q = %d after %d runs; want %d (lost updates)", name, n, done[ni].Load(), want)
		}
	}
}

// A job running longer than AtMost keeps the lease by keep-alive.
func TestLeaseKeepAliveOutlivesAtMost(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	o := gate.LeaseConfig{AtMost: 600 * time.Millisecond}
	a := newLease(t, pool, "job", "a", o)
	b := newLease(t, pool, "job", "b", o)
	var checks int
	err := a.Do(context.Background(), func(ctx context.Context, run gate.Run) error {
		if run.Fence <= 0 || run.Name != "job" || run.Holder != "a" {
			return fmt.Errorf("run = %+v", run)
		}
		deadline := time.Now().Add(3 * o.AtMost)
		for time.Now().Before(deadline) {
			mustBeHeld(t, b)
			checks++
			select {
			case <-ctx.Done():
				return fmt.Errorf("context cancelled while the lease was kept alive: %w", context.Cause(ctx))
			case <-time.After(100 * time.Millisecond):
			}
		}
		if row := lockRow(t, pool, "job"); row.Fence != run.Fence || !row.Held {
			return fmt.Errorf("row %+v not held with fence %d", row, run.Fence)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if checks < 10 {
		t.Fatalf("only %d checks", checks)
	}
	mustAcquire(t, b).Release(context.Background())
}

// A holder whose lease was taken over gets its context cancelled at its next
// extension and cannot release the new holder's lease.
func TestLeaseTakenOverHolderCancelled(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	var events sync.Map
	hooks := gate.HooksFunc(func(_ context.Context, e gate.Event) {
		v, _ := events.LoadOrStore(e.Kind, new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
	})
	oa := gate.LeaseConfig{AtMost: 2 * time.Second, KeepAlive: 50 * time.Millisecond, Hooks: hooks}
	a := newLease(t, pool, "job", "a", oa)
	b := newLease(t, pool, "job", "b", gate.LeaseConfig{AtMost: 10 * time.Second, NoKeepAlive: true})

	started := make(chan int64)
	var newHolder *gate.LeaseHandle
	var cancelledAfter time.Duration
	err := a.Do(ctx, func(ctx context.Context, run gate.Run) error {
		// Expire a's row behind its back, then let b take the name over.
		if _, err := pool.Exec(ctx, `UPDATE pgclaim_locks SET lock_until = now() WHERE name = 'job'`); err != nil {
			return err
		}
		newHolder = mustAcquire(t, b)
		close(started)
		t0 := time.Now()
		select {
		case <-ctx.Done():
			cancelledAfter = time.Since(t0)
			return context.Cause(ctx)
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled")
		}
	})
	<-started
	defer newHolder.Release(ctx)
	if !errors.Is(err, gate.ErrLockLost) {
		t.Fatalf("Do = %v; want ErrLockLost", err)
	}
	if cancelledAfter > time.Second {
		t.Fatalf("cancelled %v after the takeover; want within 1s", cancelledAfter)
	}
	t.Logf("taken-over holder cancelled %v after the takeover (KeepAlive %v)", cancelledAfter, oa.KeepAlive)
	row := lockRow(t, pool, "job")
	if !row.Held || row.Holder != "b" || row.Fence != newHolder.Fence() {
		t.Fatalf("new holder's lease disturbed: %+v", row)
	}
	for _, k := range []gate.EventKind{gate.EventAcquired, gate.EventLost, gate.EventFinished, gate.EventReleased} {
		if v, ok := events.Load(k); !ok || v.(*atomic.Int32).Load() != 1 {
			t.Errorf("event %v not reported exactly once", k)
		}
	}
}

func TestLeaseDoReportsOutcome(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var mu sync.Mutex
	var got []gate.Event
	o := gate.LeaseConfig{AtMost: time.Second, Hooks: gate.HooksFunc(func(_ context.Context, e gate.Event) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	})}
	l := newLease(t, pool, "job", "a", o)
	boom := errors.New("boom")
	if err := l.Do(context.Background(), func(context.Context, gate.Run) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v; want the job's error", err)
	}
	h := mustAcquire(t, newLease(t, pool, "job", "b", o)) // released after the failure
	if err := l.Do(context.Background(), func(context.Context, gate.Run) error { return nil }); !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("Do while held = %v; want ErrHeld", err)
	}
	h.Release(context.Background())
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, e := range got {
		kinds = append(kinds, e.Kind.String()+"/"+string(e.Outcome))
	}
	want := "acquired/ released/ finished/failed acquired/ skipped/ released/"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("events = %q; want %q", strings.Join(kinds, " "), want)
	}
}

func TestLeaseBadInput(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ok := gate.LeaseConfig{AtMost: time.Second}
	for _, c := range []struct {
		name  string
		pool  *pgxpool.Pool
		lease string
		o     gate.LeaseConfig
		field string
	}{
		{"nil pool", nil, "x", ok, "pool"},
		{"empty name", pool, "", ok, "name"},
		{"zero AtMost", pool, "x", gate.LeaseConfig{}, "LeaseConfig.AtMost"},
		{"negative AtMost", pool, "x", gate.LeaseConfig{AtMost: -time.Second}, "LeaseConfig.AtMost"},
		{"tiny AtMost", pool, "x", gate.LeaseConfig{AtMost: time.Microsecond}, "LeaseConfig.AtMost"},
		{"AtLeast > AtMost", pool, "x", gate.LeaseConfig{AtMost: time.Second, AtLeast: 2 * time.Second}, "LeaseConfig.AtLeast"},
		{"negative AtLeast", pool, "x", gate.LeaseConfig{AtMost: time.Second, AtLeast: -1}, "LeaseConfig.AtLeast"},
		{"KeepAlive = AtMost", pool, "x", gate.LeaseConfig{AtMost: time.Second, KeepAlive: time.Second}, "LeaseConfig.KeepAlive"},
		{"negative KeepAlive", pool, "x", gate.LeaseConfig{AtMost: time.Second, KeepAlive: -1}, "LeaseConfig.KeepAlive"},
	} {
		l, err := gate.NewLease(c.pool, c.lease, c.o)
		if l != nil || !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%s: NewLease = %v, %v; want ErrInvalid naming %s", c.name, l, err, c.field)
		}
	}
	// NewLease checks the schema, so the rest needs a real database.
	l, err := gate.NewLease(pgtest.Pool(t), "x", ok)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Do(context.Background(), nil); !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "fn:") {
		t.Errorf("Do(nil) = %v; want ErrInvalid naming fn", err)
	}
}

// Through PgBouncer in transaction pooling mode a pool is configured without
// server-side prepared statements; the lease lock and the lease elector
// need nothing else.
func TestLeaseWithoutPreparedStatements(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		cfg := db.Pool.Config().Copy()
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		ctx := context.Background()
		o := gate.LeaseConfig{AtMost: time.Second, AtLeast: 10 * time.Millisecond, KeepAlive: 20 * time.Millisecond}
		l := newLease(t, pool, "job-"+mode.String(), "a", o)
		err = l.Do(ctx, func(ctx context.Context, run gate.Run) error {
			time.Sleep(60 * time.Millisecond) // a few keep-alive extensions
			return ctx.Err()
		})
		if err != nil {
			t.Fatalf("%v: Do: %v", mode, err)
		}
		e := newElector(t, pool, "e-"+mode.String(), "a", gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: 400 * time.Millisecond})
		lctx, err := e.Campaign(ctx)
		if err != nil {
			t.Fatalf("%v: Campaign: %v", mode, err)
		}
		time.Sleep(250 * time.Millisecond) // renewals
		if lctx.Err() != nil {
			t.Fatalf("%v: leadership lost: %v", mode, context.Cause(lctx))
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatalf("%v: Resign: %v", mode, err)
		}
	}
}
