package schedule

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Prune deletes finished runs older than its argument by database time,
// never an open one; the deleted instants are not recorded again by an
// instance coming back (catch-up) nor listed as missed. An olderThan
// within a stored schedule's catch-up window is refused, naming the field
// and the schedule, and nothing is deleted.
func TestPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	def := Definition{Name: "tick", Spec: "* * * * * *", Version: 1}
	in := newInstance(t, db, "a", Config{}, nil)
	if err := in.s.Register(ctx, def, nop); err != nil {
		t.Fatal(err)
	}
	in.start(t)
	// Three finished runs: the run in flight when the instance stops is
	// handed back open, and an open run is never pruned.
	waitFor(t, 10*time.Second, "three finished runs", func() bool {
		n := 0
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.State == stateSucceeded {
				n++
			}
		}
		return n >= 3
	})
	in.stop()
	open, _, err := in.s.Trigger(ctx, def.Name) // stays pending: nothing runs
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)

	for _, bad := range []time.Duration{0, -time.Second} {
		if _, err := in.s.Prune(ctx, bad); !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: olderThan: ") {
			t.Errorf("Prune(%s): %v, want ErrInvalid naming olderThan", bad, err)
		}
	}
	before := runsOf(t, db.Pool, def.Name)
	pruned := dbNow(t, db.Pool)
	n, err := in.s.Prune(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	after := runsOf(t, db.Pool, def.Name)
	if n < 3 || int(n) != len(before)-len(after) {
		t.Fatalf("pruned %d of %d runs, %d left", n, len(before), len(after))
	}
	var openLeft bool
	for _, r := range after {
		if r.Instant.Equal(open) && r.State == statePending {
			openLeft = true
		}
	}
	if !openLeft {
		t.Fatalf("the open triggered run was pruned: %+v", after)
	}
	var old int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedule_runs WHERE finished_at < $1::timestamptz - interval '1 second'`, pruned).Scan(&old); err != nil || old != 0 {
		t.Fatalf("%d finished runs older than the cut left (%v)", old, err)
	}
	var until time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT pruned_until FROM pgclaim_schedules WHERE name = $1`, def.Name).Scan(&until); err != nil {
		t.Fatal(err)
	}

	// Back again: the pruned instants are neither recorded nor missed.
	again := newInstance(t, db, "b", Config{}, nil)
	if err := again.s.Register(ctx, def, nop); err != nil {
		t.Fatal(err)
	}
	again.start(t)
	waitFor(t, 10*time.Second, "a new run", func() bool {
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Instant.After(pruned) && r.State == stateSucceeded {
				return true
			}
		}
		return false
	})
	var rerecorded int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule = $1 AND kind = 'scheduled' AND instant <= $2`,
		def.Name, until).Scan(&rerecorded); err != nil || rerecorded != 0 {
		t.Fatalf("%d pruned instants recorded again (%v)", rerecorded, err)
	}
	if missed, _, err := again.s.Missed(ctx, def.Name, time.Time{}, 100); err != nil {
		t.Fatal(err)
	} else {
		for _, m := range missed {
			if !m.After(until) {
				t.Errorf("pruned instant %v listed as missed", m)
			}
		}
	}

	// A catch-up window reaching olderThan refuses, deleting nothing.
	wide := Definition{Name: "wide", Spec: "0 0 1 1 *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: time.Hour}
	if err := again.s.Register(ctx, wide, nop); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	left := len(runsOf(t, db.Pool, def.Name))
	_, err = again.s.Prune(ctx, 30*time.Minute)
	if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: olderThan: ") || !strings.Contains(err.Error(), `"wide"`) {
		t.Fatalf("Prune within a catch-up window: %v", err)
	}
	if _, err := again.s.Prune(ctx, time.Second); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Prune(1s) within a 1 h window: %v", err)
	}
	if got := len(runsOf(t, db.Pool, def.Name)); got < left {
		t.Fatalf("a refused prune deleted runs: %d left of %d", got, left)
	}
	if _, err := again.s.Prune(ctx, 2*time.Hour); err != nil {
		t.Fatalf("Prune beyond every window: %v", err)
	}
}
