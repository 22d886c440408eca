package schedule

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Four instances run three one-second schedules for about ten seconds:
// every instant due in that time has a row, each succeeded at its first
// attempt, and its job took effect exactly once.
func TestEveryInstantOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	ev := &events{}
	names := []string{"a", "b", "c"}
	var ins []*instance
	for i := range 4 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, ev)
		for _, n := range names {
			def := Definition{Name: n, Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: time.Minute, CatchUpCap: 100, Overlap: OverlapBufferOne}
			if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
				t.Fatal(err)
			}
		}
		in.start(t)
		ins = append(ins, in)
	}
	time.Sleep(10 * time.Second)
	for _, in := range ins {
		in.stop()
	}
	holders := map[string]int{}
	for _, n := range names {
		st, err := loadSchedule(ctx, ins[0].s.q, n)
		if err != nil {
			t.Fatal(err)
		}
		rows := runsOf(t, db.Pool, n)
		if len(rows) < 7 {
			t.Fatalf("%s: %d runs in ~10 s, want about 10", n, len(rows))
		}
		due, _ := st.spec.between(st.startsAt, rows[len(rows)-1].Instant, 1000)
		if len(due) != len(rows) {
			t.Errorf("%s: %d instants due up to the last recorded, %d rows", n, len(due), len(rows))
		}
		for i, r := range rows {
			if i < len(due) && !r.Instant.Equal(due[i]) {
				t.Errorf("%s: row %d at %v, want %v", n, i, r.Instant, due[i])
			}
			if i >= len(rows)-2 && (r.State == statePending && r.Attempt == 0 ||
				r.State == stateRetrying && r.Reason != nil && strings.Contains(*r.Reason, "the scheduler stopped")) {
				// Recorded, or started, just as every instance stopped:
				// it waits for the next instance to run it, which is not
				// lost.
				t.Logf("%s %v: %s at the stop (%s)", n, r.Instant, r.State, deref(r.Reason))
				continue
			}
			if r.State != stateSucceeded || r.Attempt != 1 || r.Kind != kindScheduled {
				t.Errorf("%s %v: state %s attempt %d kind %s reason %v", n, r.Instant, r.State, r.Attempt, r.Kind, deref(r.Reason))
			}
			var count int
			var fence int64
			if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(fence), 0) FROM effects WHERE schedule = $1 AND instant = $2`, n, r.Instant).Scan(&count, &fence); err != nil {
				t.Fatal(err)
			}
			if count != 1 || r.Fence == nil || fence != *r.Fence {
				t.Errorf("%s %v: %d effects (fence %d, row's %v), want exactly one with the row's fence", n, r.Instant, count, fence, r.Fence)
			}
			if r.Holder != nil {
				holders[*r.Holder]++
			}
		}
	}
	t.Logf("runs per instance: %v", holders)
	var p50, p99, worst float64
	if err := db.Pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l), percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
		FROM (SELECT extract(epoch FROM started_at - instant) * 1000 AS l FROM pgclaim_schedule_runs) x`).Scan(&p50, &p99, &worst); err != nil {
		t.Fatal(err)
	}
	t.Logf("wake-up lag, instant to start (database time): p50 %.1f ms, p99 %.1f ms, max %.1f ms", p50, p99, worst)
	if n := len(ev.of(EventLost)); n != 0 {
		t.Errorf("%d lost events", n)
	}
}
