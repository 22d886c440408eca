package schedule

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/store"
)

// A runner whose lock was taken over can no longer record instants or
// start attempts: with leases the guarded statements check the lease's
// fence; with session locks they run on the lock's session, which is gone.
func TestStaleRunnerRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	a := newInstance(t, db, "a", Config{LeaseLocks: true}, nil)
	b := newInstance(t, db, "b", Config{LeaseLocks: true}, nil)
	if err := a.s.Register(ctx, Definition{Name: "x", Spec: "0 0 1 1 *", Version: 1}, nop); err != nil {
		t.Fatal(err)
	}
	a.s.stalled.Store(true) // a stops renewing
	ha, err := a.s.locks.acquire(ctx, "x", time.Second)
	if err != nil || ha == nil {
		t.Fatalf("a: %v %v", ha, err)
	}
	defer ha.release()
	if hb, err := b.s.locks.acquire(ctx, "x", time.Second); err != nil || hb != nil {
		t.Fatalf("b took a live lease: %v %v", hb, err)
	}
	time.Sleep(1100 * time.Millisecond)
	hb, err := b.s.locks.acquire(ctx, "x", 10*time.Second)
	if err != nil || hb == nil {
		t.Fatalf("b after expiry: %v %v", hb, err)
	}
	defer hb.release()
	record := func(h held, at time.Time) int64 {
		var n int64
		err := h.do(ctx, func(ctx context.Context, q *store.Queries, g guard) error {
			rows, err := q.RecordInstants(ctx, store.RecordInstantsParams{Schedules: []string{"x"}, Kind: kindScheduled,
				Instants: []pgtype.Timestamptz{ts(at)}, States: []string{statePending}, Missed: []bool{false}, Reasons: []string{""},
				LockNames: []string{g.name}, LockFences: []int64{g.fence}})
			n = int64(len(rows))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if n := record(ha, at); n != 0 {
		t.Fatalf("the stale lease holder recorded %d instants", n)
	}
	if n := record(hb, at); n != 1 {
		t.Fatalf("the lease holder recorded %d instants, want 1", n)
	}
	st, _ := loadSchedule(ctx, a.s.q, "x")
	o := openRun{instant: at, kind: kindScheduled, state: statePending}
	if r, err := a.s.claim(ctx, ha, &entry{name: "x"}, st, o); err != nil || r != nil {
		t.Fatalf("the stale holder claimed: %v %v", r, err)
	}
	if r, err := b.s.claim(ctx, hb, &entry{name: "x"}, st, o); err != nil || r == nil {
		t.Fatalf("the holder could not claim: %v %v", r, err)
	}

	// Session locks: once the session is gone, do refuses with ErrLost.
	c := newInstance(t, db, "c", Config{}, nil)
	hc, err := c.s.locks.acquire(ctx, "x", time.Second)
	if err != nil || hc == nil {
		t.Fatalf("c: %v %v", hc, err)
	}
	defer hc.release()
	class, key := LockKey("x")
	if _, err := pgprobe.TerminateHolder(ctx, db.Pool, pgprobe.Pair(class, key)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hc.lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the lost session was not seen")
	}
	if err := hc.do(ctx, func(context.Context, *store.Queries, guard) error { return nil }); !errors.Is(err, ErrLost) {
		t.Fatalf("do after the session ended: %v", err)
	}
}
