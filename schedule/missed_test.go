package schedule

import (
	"context"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Every instance was down past the grace: Missed lists the instants due
// meanwhile from the database alone; an instance that comes back reports
// each (EventMissed), records it by its catch-up policy, and the list
// empties.
func TestMissedInstants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	in := newInstance(t, db, "a", Config{Grace: time.Second}, ev)
	def := Definition{Name: "nightly", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpNone}
	if err := in.s.Register(ctx, def, nop); err != nil {
		t.Fatal(err)
	}
	t0 := dbNow(t, db.Pool)
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET starts_at = $1`, t0.Add(-8500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	missed, more, err := in.s.Missed(ctx, def.Name, time.Time{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	// Due in (t0-8.5s, t0-1s]: seven or eight instants.
	if len(missed) < 7 || len(missed) > 8 || more {
		t.Fatalf("missed %v (more %v), want the 7-8 instants older than the grace", missed, more)
	}
	if m, more, _ := in.s.Missed(ctx, def.Name, time.Time{}, 3); len(m) != 3 || !more || !m[0].Equal(missed[0]) {
		t.Fatalf("capped at 3: %v more %v", m, more)
	}
	in.start(t)
	waitFor(t, 10*time.Second, "the missed instants recorded", func() bool {
		m, _, err := in.s.Missed(ctx, def.Name, time.Time{}, 100)
		return err == nil && len(m) == 0
	})
	reported := map[time.Time]bool{}
	for _, e := range ev.of(EventMissed) {
		reported[e.Instant] = true
	}
	for _, m := range missed {
		if !reported[m] {
			t.Errorf("missed instant %v not reported", m)
		}
	}
	if _, _, err := in.s.Missed(ctx, "nope", time.Time{}, 1); err == nil {
		t.Error("unknown schedule: no error")
	}
}
