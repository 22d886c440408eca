package schedule

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// An instance stopped mid-run (a deploy) hands its attempt back: the
// other instance runs the instant as attempt 2 at once. A schedule
// registered while Run runs is picked up.
func TestShutdownHandsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	started := make(chan Run, 1)
	job := func(ctx context.Context, r Run) error {
		if r.Attempt == 1 {
			started <- r
			<-ctx.Done() // until its instance stops
			return ctx.Err()
		}
		return nil
	}
	def := Definition{Name: "deploy", Spec: "*/2 * * * * *", Version: 1}
	byHolder := map[string]*instance{}
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{}, nil)
		if err := in.s.Register(ctx, def, job); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		byHolder[h] = in
	}
	var first Run
	select {
	case first = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no run started")
	}
	stopped := time.Now()
	byHolder[first.Holder].stop()
	waitFor(t, 10*time.Second, "attempt 2 on the other instance", func() bool {
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Instant.Equal(first.Instant) && r.State == stateSucceeded {
				if r.Attempt != 2 || *r.Holder == first.Holder {
					t.Fatalf("completed as attempt %d by %s", r.Attempt, *r.Holder)
				}
				return true
			}
		}
		return false
	})
	t.Logf("handed back and completed %s after its instance stopped", time.Since(stopped).Round(time.Millisecond))

	other := byHolder["a"]
	if first.Holder == "a" {
		other = byHolder["b"]
	}
	late := Definition{Name: "late", Spec: "* * * * * *", Version: 1}
	if err := other.s.Register(ctx, late, nop); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the schedule registered while running to run", func() bool {
		for _, r := range runsOf(t, db.Pool, late.Name) {
			if r.State == stateSucceeded {
				return true
			}
		}
		return false
	})
}

// A shutdown that comes while the claim of an attempt is on the wire does
// not cut the claim off: the server may have committed it already, and the
// run would then be recorded running, by an instance that never runs it, and
// the next holder would take over a dead attempt. The claim's answer is
// awaited, the job is not called on a stopped scheduler, and the attempt is
// handed back.
func TestShutdownDuringClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	pcfg, stall := pgprobe.StallConfig(t, db.Pool, "ClaimRun")
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var calls atomic.Int32
	job := func(ctx context.Context, r Run) error { calls.Add(1); return nil }
	def := Definition{Name: "cut", Spec: "0 0 0 1 1 *", Version: 1}
	s, err := New(pool, Config{Holder: "a", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{s: s, pool: pool}
	if err := in.s.Register(ctx, def, job); err != nil {
		t.Fatal(err)
	}
	in.start(t)
	instant, _, err := in.s.Trigger(ctx, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-stall.Stalled():
	case <-time.After(10 * time.Second):
		t.Fatal("no claim sent")
	}
	waitFor(t, 5*time.Second, "the claim committed on the server", func() bool {
		rows := runsOf(t, db.Pool, def.Name)
		return len(rows) == 1 && rows[0].State == stateRunning
	})
	in.cancel() // the scheduler stops while the claim's answer is on its way
	time.Sleep(200 * time.Millisecond)
	stall.Release()
	select {
	case <-in.done:
		in.cancel = nil
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	rows := runsOf(t, db.Pool, def.Name)
	if len(rows) != 1 || !rows[0].Instant.Equal(instant.UTC()) {
		t.Fatalf("runs %+v", rows)
	}
	r := rows[0]
	if r.State != stateRetrying || r.Attempt != 1 || r.Reason == nil || !strings.Contains(*r.Reason, "interrupted") {
		t.Fatalf("after the shutdown: state %s attempt %d holder %v reason %q; want attempt 1 handed back (retrying, interrupted)", r.State, r.Attempt, deref(r.Holder), deref(r.Reason))
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the job was called %d times on a stopped scheduler", n)
	}
}
