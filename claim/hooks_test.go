package claim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// recorder collects events.
type recorder struct {
	mu sync.Mutex
	ev []Event
}

func (r *recorder) Observe(_ context.Context, e Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

// take returns the events so far, as "kind state rows [error]" lines in
// order, and forgets them; it fails t for an event without table, holder
// or duration.
func (r *recorder) take(t *testing.T) []string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.ev {
		if e.Table != `"jobs"` || e.Holder != "h" || e.Duration <= 0 {
			t.Errorf("event %+v: want table \"jobs\", holder h and a duration", e)
		}
		s := fmt.Sprintf("%s %s %d", e.Kind, e.State, e.Rows)
		if e.Err != nil {
			s += " " + e.Err.Error()
		}
		out = append(out, s)
	}
	r.ev = nil
	return out
}

// TestHooks: every statement that moves rows or finds claims lost reports
// one event with the rows it moved, from the claimer, its sweeper and its
// worker.
func TestHooks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 6)
	rec := &recorder{}
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h", Lease: time.Minute, Hooks: rec})
	if err != nil {
		t.Fatal(err)
	}
	want := func(step string, lines ...string) {
		t.Helper()
		if got := rec.take(t); strings.Join(got, "; ") != strings.Join(lines, "; ") {
			t.Errorf("%s: events\n  %s\nwant\n  %s", step, strings.Join(got, "; "), strings.Join(lines, "; "))
		}
	}

	c1, err := c.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, 1); !errors.Is(err, ErrNotClaimed) {
		t.Fatal(err)
	}
	want("Claim twice", "claimed PROCESSING 1", "not claimed  1")

	batch, err := c.ClaimBatch(ctx, 2)
	if err != nil || len(batch) != 2 {
		t.Fatalf("ClaimBatch: %v %v", batch, err)
	}
	stale := c1
	stale.Fence = -1
	if _, _, err := c.FinishBatch(ctx, append(batch, stale), "DONE"); err != nil {
		t.Fatal(err)
	}
	want("ClaimBatch, FinishBatch with a stale claim", "claimed PROCESSING 2", "finished DONE 2", "lost  1")

	if _, err := c.Extend(ctx, stale, time.Minute); !errors.Is(err, ErrLost) {
		t.Fatal(err)
	}
	if err := c.Release(ctx, c1); err != nil {
		t.Fatal(err)
	}
	if err := c.Finish(ctx, c1, "DONE"); !errors.Is(err, ErrLost) {
		t.Fatal(err)
	}
	want("Extend lost, Release, Finish lost", "lost  1", "released PAUSED 1", "lost  1")

	c4, err := c.Claim(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1`, c4.Key)
	sw, err := NewSweeper(c, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	want("Sweep", "claimed PROCESSING 1", "swept FAILED 1")

	// The worker: rows 1, 5 and 6 are PAUSED; the work on 5 fails.
	w, err := NewWorker(c, WorkerConfig[int64]{
		Work: func(_ context.Context, _ pgx.Tx, cl Claim[int64]) error {
			if cl.Key == 5 {
				return errors.New("boom")
			}
			return nil
		},
		Done: "DONE", Failed: "FAILED", BatchSize: 10, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	got := rec.take(t)
	sort.Strings(got)
	if s := strings.Join(got, "; "); s != "claimed PROCESSING 3; finished DONE 1; finished DONE 1; finished FAILED 1 boom" {
		t.Errorf("worker: events %s", s)
	}
}

// TestHeartbeatFinishedNotLost: a heartbeat that runs while a claim's work
// is finishing, or just after, must not report the claim lost: no sweeper
// runs, so no claim is ever lost.
func TestHeartbeatFinishedNotLost(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	const rows = 400
	createJobs(t, db.Pool, "bigint", rows)
	var lostEvents, finished atomic.Int64
	hooks := HooksFunc(func(_ context.Context, e Event) {
		switch e.Kind {
		case EventLost:
			lostEvents.Add(int64(e.Rows))
		case EventFinished:
			finished.Add(int64(e.Rows))
		}
	})
	// The lease is long enough never to expire between heartbeats (and
	// for a heartbeat to answer within 3/4 of it under load), and the
	// heartbeat (every lease/3) races the finish of short works.
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h", Lease: 300 * time.Millisecond, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: effectWork("h"), Done: "DONE", Failed: "FAILED",
		BatchSize: 8, Concurrency: 4, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Succeeded != rows || st.Lost != 0 {
		t.Errorf("stats %+v, want %d succeeded, none lost", st, rows)
	}
	if n := lostEvents.Load(); n != 0 {
		t.Errorf("EventLost reported %d claims lost, want 0 (%d finished)", n, finished.Load())
	}
}

// ctxKey keys the value TestHooksContext puts in each call's context.
type ctxKey struct{}

// ctxRecorder collects, per event, its kind and the ctxKey value of the
// context Observe was given.
type ctxRecorder struct {
	mu sync.Mutex
	ev []string
}

func (r *ctxRecorder) Observe(ctx context.Context, e Event) {
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

// TestHooksContext: Observe gets the context of the call that ran the
// statement (for the Worker, one carrying the values of Run's context), so
// a value the caller put there reaches the hooks.
func TestHooksContext(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 6)
	rec := &ctxRecorder{}
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h", Lease: time.Minute, Hooks: rec})
	if err != nil {
		t.Fatal(err)
	}
	call := func(name string) context.Context { return context.WithValue(ctx, ctxKey{}, name) }
	want := func(step, events string) {
		t.Helper()
		if got := rec.take(); got != events {
			t.Errorf("%s: events %q, want %q", step, got, events)
		}
	}

	c1, err := c.Claim(call("Claim"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(call("Claim again"), 1); !errors.Is(err, ErrNotClaimed) {
		t.Fatal(err)
	}
	want("Claim", "claimed @Claim; not claimed @Claim again")
	batch, err := c.ClaimBatch(call("ClaimBatch"), 2)
	if err != nil || len(batch) != 2 {
		t.Fatalf("ClaimBatch: %v %v", batch, err)
	}
	stale := c1
	stale.Fence = -1
	if _, _, err := c.FinishBatch(call("FinishBatch"), append(batch, stale), "DONE"); err != nil {
		t.Fatal(err)
	}
	want("ClaimBatch, FinishBatch", "claimed @ClaimBatch; finished @FinishBatch; lost @FinishBatch")
	if _, err := c.Extend(call("Extend"), stale, time.Minute); !errors.Is(err, ErrLost) {
		t.Fatal(err)
	}
	if err := c.Release(call("Release"), c1); err != nil {
		t.Fatal(err)
	}
	want("Extend, Release", "lost @Extend; released @Release")

	c4, err := c.Claim(call("Claim 4"), 4)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1`, c4.Key)
	sw, err := NewSweeper(c, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Sweep(call("Sweep")); err != nil {
		t.Fatal(err)
	}
	want("Sweep", "claimed @Claim 4; swept @Sweep")

	// The worker: rows 1, 5 and 6 are PAUSED.
	w, err := NewWorker(c, WorkerConfig[int64]{
		Work: func(context.Context, pgx.Tx, Claim[int64]) error { return nil },
		Done: "DONE", Failed: "FAILED", BatchSize: 10, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Drain(call("Drain")); err != nil {
		t.Fatal(err)
	}
	want("Drain", "claimed @Drain; finished @Drain; finished @Drain; finished @Drain")
}
