package gate_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// ctxRecorder collects, per event, its kind and the ctxKey value of the
// context Observe was given, as "kind @value".
type ctxRecorder struct {
	mu sync.Mutex
	ev []string
}

func (r *ctxRecorder) Observe(ctx context.Context, e gate.Event) {
	v, _ := ctx.Value(ctxKey{}).(string)
	r.mu.Lock()
	r.ev = append(r.ev, e.Kind.String()+" @"+v)
	r.mu.Unlock()
}

func (r *ctxRecorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := strings.Join(r.ev, "; ")
	r.ev = nil
	return s
}

// waitFor polls r until it has recorded n events, at most 10s.
func (r *ctxRecorder) waitFor(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		got := len(r.ev)
		r.mu.Unlock()
		if got >= n {
			return
		}
	}
	t.Fatalf("fewer than %d events after 10s: %s", n, r.take())
}

// obsCall returns a context carrying name under ctxKey.
func obsCall(name string) context.Context {
	return context.WithValue(context.Background(), ctxKey{}, name)
}

// TestHooksContext: Observe gets the context of the call an event belongs
// to, so a value the caller put there reaches the hooks; an event found by
// a watcher (a lease or leadership lost) gets the acquiring call's values.
func TestHooksContext(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	want := func(t *testing.T, r *ctxRecorder, step, events string) {
		t.Helper()
		if got := r.take(); got != events {
			t.Errorf("%s: events %q, want %q", step, got, events)
		}
	}

	t.Run("Gate", func(t *testing.T) {
		t.Parallel()
		rec := &ctxRecorder{}
		g := newGate(t, db.Pool, "observed", gate.Config{Hooks: rec})
		at := dbNow(t, db.Pool).Truncate(time.Second)
		if err := g.Once(obsCall("Once"), "ctx-job", at, noop); err != nil {
			t.Fatal(err)
		}
		_ = g.Once(obsCall("Once again"), "ctx-job", at, noop)
		want(t, rec, "Once", "acquired @Once; finished @Once; skipped @Once again")
		if err := g.Exclusive(obsCall("Exclusive"), "ctx-exclusive", noop); err != nil {
			t.Fatal(err)
		}
		want(t, rec, "Exclusive", "acquired @Exclusive; finished @Exclusive")
	})

	t.Run("Lease", func(t *testing.T) {
		t.Parallel()
		rec := &ctxRecorder{}
		l := newLease(t, db.Pool, "ctx-lease", "observed", gate.LeaseConfig{AtMost: 10 * time.Second, KeepAlive: 50 * time.Millisecond, Hooks: rec})
		h, err := l.TryAcquire(obsCall("TryAcquire"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = l.TryAcquire(obsCall("TryAcquire again"))
		if err := h.Release(obsCall("Release")); err != nil {
			t.Fatal(err)
		}
		want(t, rec, "TryAcquire, Release", "acquired @TryAcquire; skipped @TryAcquire again; released @Release")
		if err := l.Do(obsCall("Do"), noop); err != nil {
			t.Fatal(err)
		}
		want(t, rec, "Do", "acquired @Do; released @Do; finished @Do")

		// Lost, as the keep-alive finds it.
		if _, err = l.TryAcquire(obsCall("TryAcquire to lose")); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(context.Background(), `UPDATE pgclaim_locks SET lock_until = now() - interval '1 second' WHERE name = 'ctx-lease'`); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, 2)
		want(t, rec, "lost by keep-alive", "acquired @TryAcquire to lose; lost @TryAcquire to lose")
	})

	electorVariants(t, func(t *testing.T, lease bool) {
		rec := &ctxRecorder{}
		name := "ctx-election-advisory"
		if lease {
			name = "ctx-election-lease"
		}
		e := newElector(t, db.Pool, name, "observed", gate.ElectorConfig{Mechanism: mechanism(lease), TTL: time.Second, Hooks: rec})
		if _, err := e.Campaign(obsCall("Campaign")); err != nil {
			t.Fatal(err)
		}
		if err := e.Resign(obsCall("Resign")); err != nil {
			t.Fatal(err)
		}
		want(t, rec, "Campaign, Resign", "acquired @Campaign; released @Resign")

		// Lost, as the watcher finds it.
		lctx, err := e.Campaign(obsCall("Campaign to lose"))
		if err != nil {
			t.Fatal(err)
		}
		if lease {
			_, err = db.Pool.Exec(context.Background(), `UPDATE pgclaim_terms SET ended_at = now(), end_reason = 'superseded' WHERE election = $1 AND ended_at IS NULL`, name)
		} else {
			class, key := gate.ElectionKey(name)
			_, err = db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks
				WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2 AND granted`, class, key)
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-lctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("leadership not lost after 10s")
		}
		rec.waitFor(t, 2)
		want(t, rec, "lost by the watcher", "acquired @Campaign to lose; lost @Campaign to lose")
	})
}
