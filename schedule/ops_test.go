package schedule

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Pause on one instance stops new runs on all; the instants due while
// paused are recorded, at resume, by the catch-up policy (none: skipped,
// "paused"), and are not reported missed.
func TestPauseStopsAllResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	ev := &events{}
	def := Definition{Name: "tick", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpNone}
	var ins []*instance
	for i := range 3 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{PollInterval: 10 * time.Second}, ev)
		if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		ins = append(ins, in)
	}
	waitFor(t, 10*time.Second, "two runs", func() bool { return len(runsOf(t, db.Pool, def.Name)) >= 2 })
	if err := ins[1].s.Pause(ctx, def.Name, "deploy", "ops"); err != nil {
		t.Fatal(err)
	}
	// committed is after the pause's commit (Pause has returned): no
	// attempt may start after it. (paused_at is the pause's transaction
	// start; a claim that began before the commit may still start.)
	var pausedAt, committed time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT paused_at, clock_timestamp() FROM pgclaim_schedules WHERE name = $1`, def.Name).Scan(&pausedAt, &committed); err != nil {
		t.Fatal(err)
	}
	before := len(runsOf(t, db.Pool, def.Name))
	time.Sleep(3500 * time.Millisecond)
	rows := runsOf(t, db.Pool, def.Name)
	if len(rows) != before {
		t.Fatalf("%d runs recorded while paused (had %d)", len(rows)-before, before)
	}
	var late int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule = $1 AND started_at >= $2`, def.Name, committed).Scan(&late); err != nil || late != 0 {
		t.Fatalf("%d runs started after the pause was committed (%v)", late, err)
	}
	if err := ins[2].s.Resume(ctx, def.Name); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a run after resume", func() bool {
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Instant.After(pausedAt.Add(3*time.Second)) && r.State == stateSucceeded {
				return true
			}
		}
		return false
	})
	var skipped int
	for _, r := range runsOf(t, db.Pool, def.Name) {
		if r.State == stateSkipped {
			if !r.Missed && strings.HasPrefix(deref(r.Reason), "overlap: ") {
				// A run that outlived its second on a loaded machine:
				// the next instant is skipped by the overlap policy, not
				// the pause.
				continue
			}
			skipped++
			if r.Missed || !strings.HasPrefix(deref(r.Reason), "paused: ") {
				t.Errorf("skipped %v: missed %v reason %q", r.Instant, r.Missed, deref(r.Reason))
			}
		}
	}
	if skipped < 2 {
		t.Errorf("%d instants skipped for the pause, want the ~3 due while paused", skipped)
	}
	if n := len(ev.of(EventMissed)); n != 0 {
		t.Errorf("%d missed events for paused instants", n)
	}
}

// Two operators trigger a schedule at once: one run. The trigger reaches
// the instances by notification (the poll is 10 s here); its latency,
// trigger to start, is logged.
func TestConcurrentTriggersRunOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	def := Definition{Name: "manual", Spec: "0 0 1 1 *", Version: 1}
	var ins []*instance
	for i := range 3 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{PollInterval: 10 * time.Second}, nil)
		if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		ins = append(ins, in)
	}
	time.Sleep(300 * time.Millisecond) // the listeners connect
	var lags []time.Duration
	extra := 0 // rounds whose two triggers did not meet, each with two runs
	for round := range 5 {
		var wg sync.WaitGroup
		got := make([]time.Time, 2)
		created := make([]bool, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if got[i], created[i], err = ins[i].s.Trigger(ctx, def.Name); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		var early time.Time // set when this round's triggers did not meet
		if !got[0].Equal(got[1]) && created[0] && created[1] {
			// Allowed only when the two did not meet: the earlier run had
			// finished before the later trigger's insert (on a loaded
			// machine the goroutines may start milliseconds apart), so the
			// later run starts after it, checked below. The later run is
			// this round's: the next round must not find it still open.
			late := got[1]
			early = got[0]
			if late.Before(early) {
				early, late = late, early
			}
			got[0] = late
			extra++
		} else if !got[0].Equal(got[1]) || created[0] == created[1] {
			t.Fatalf("round %d: triggers returned %v (created %v), want one run, created once", round, got, created)
		}
		waitFor(t, 10*time.Second, "the triggered run", func() bool {
			for _, r := range runsOf(t, db.Pool, def.Name) {
				if r.Instant.Equal(got[0]) && r.State == stateSucceeded {
					return true
				}
			}
			return false
		})
		var lag time.Duration
		if err := db.Pool.QueryRow(ctx, `SELECT started_at - instant FROM pgclaim_schedule_runs WHERE schedule = $1 AND instant = $2`, def.Name, got[0]).Scan(&lag); err != nil {
			t.Fatal(err)
		}
		lags = append(lags, lag)
		if !early.IsZero() {
			var finished, started *time.Time
			if err := db.Pool.QueryRow(ctx, `SELECT (SELECT finished_at FROM pgclaim_schedule_runs WHERE schedule = $1 AND instant = $2),
				(SELECT started_at FROM pgclaim_schedule_runs WHERE schedule = $1 AND instant = $3)`, def.Name, early, got[0]).Scan(&finished, &started); err != nil {
				t.Fatal(err)
			}
			if finished == nil || started == nil || finished.After(*started) {
				t.Fatalf("round %d: two runs, at %v (finished %v) and at %v (started %v): they overlapped, want one run, created once", round, early, finished, got[0], started)
			}
		}
	}
	rows := runsOf(t, db.Pool, def.Name)
	if len(rows) != 5+extra {
		t.Fatalf("%d triggered runs, want %d", len(rows), 5+extra)
	}
	var effects int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil || effects != 5+extra {
		t.Fatalf("%d effects (%v), want %d", effects, err, 5+extra)
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	t.Logf("trigger to start, by notification (poll 10 s): min %s, median %s, max %s", lags[0], lags[2], lags[4])
}

// With LeaseLocks nothing listens: a trigger reaches the instances by the
// poll. Its latency, trigger to start, is logged.
func TestTriggerByPollLogged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	def := Definition{Name: "manual", Spec: "0 0 1 1 *", Version: 1}
	var ins []*instance
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{LeaseLocks: true, PollInterval: time.Second}, nil)
		if err := in.s.Register(ctx, def, nop); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		ins = append(ins, in)
	}
	var lags []time.Duration
	for range 3 {
		at, _, err := ins[0].s.Trigger(ctx, def.Name)
		if err != nil {
			t.Fatal(err)
		}
		var lag time.Duration
		waitFor(t, 10*time.Second, "the triggered run", func() bool {
			err := db.Pool.QueryRow(ctx, `SELECT started_at - instant FROM pgclaim_schedule_runs WHERE schedule = $1 AND instant = $2 AND state = 'succeeded'`, def.Name, at).Scan(&lag)
			return err == nil
		})
		lags = append(lags, lag)
	}
	t.Logf("trigger to start by the poll (LeaseLocks, poll 1 s): %v", lags)
}
