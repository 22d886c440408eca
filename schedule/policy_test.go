package schedule

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Every instance was down for about ten instants (the schedules' life
// began 10.5 s ago, nothing recorded since): none, latest and all (cap 5)
// each decide those instants as stated, each skipped one with its reason.
func TestCatchUpAfterDowntime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	ev := &events{}
	defs := []Definition{
		{Name: "none", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpNone},
		{Name: "latest", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpLatest},
		{Name: "all", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpCap: 5},
		{Name: "window", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpCap: 100, CatchUpWindow: 3 * time.Second},
	}
	var ins []*instance
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{Grace: 200 * time.Millisecond}, ev)
		for _, d := range defs {
			if err := in.s.Register(ctx, d, effect(in.pool)); err != nil {
				t.Fatal(err)
			}
		}
		ins = append(ins, in)
	}
	t0 := dbNow(t, db.Pool)
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET starts_at = $1`, t0.Add(-10500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		in.start(t)
	}
	waitFor(t, 15*time.Second, "the instants up to now to be decided", func() bool {
		for _, d := range defs {
			n := 0
			for _, r := range runsOf(t, db.Pool, d.Name) {
				if !r.Instant.After(t0) && (r.State == stateSucceeded || r.State == stateSkipped) {
					n++
				}
			}
			if n < 10 {
				return false
			}
		}
		return true
	})
	for _, in := range ins {
		in.stop()
	}
	old := func(name string) (ran, skipped []runRow) {
		for _, r := range runsOf(t, db.Pool, name) {
			if r.Instant.After(t0) {
				continue
			}
			if r.State == stateSkipped {
				skipped = append(skipped, r)
			} else {
				ran = append(ran, r)
			}
		}
		return ran, skipped
	}
	// none: every late instant skipped (the newest may still have been on time).
	ran, skipped := old("none")
	if len(skipped) < 9 || len(ran) > 1 {
		t.Errorf("none: %d ran, %d skipped; want all but at most the newest skipped", len(ran), len(skipped))
	}
	for _, r := range skipped {
		if !r.Missed || deref(r.Reason) != "missed: catch-up is none" {
			t.Errorf("none: %v missed %v reason %q", r.Instant, r.Missed, deref(r.Reason))
		}
	}
	// latest: one ran, the newest; the others skipped, overtaken.
	ran, skipped = old("latest")
	if len(ran) > 1 || len(skipped) < 9 {
		t.Errorf("latest: %d ran, %d skipped; want at most one run", len(ran), len(skipped))
	}
	for _, r := range skipped {
		if !strings.Contains(deref(r.Reason), "a later instant ran instead") {
			t.Errorf("latest: %v reason %q", r.Instant, deref(r.Reason))
		}
		if len(ran) == 1 && r.Instant.After(ran[0].Instant) {
			t.Errorf("latest: skipped %v is newer than the one run, %v", r.Instant, ran[0].Instant)
		}
	}
	// all, cap 5: the newest five ran, oldest first, each once; the older
	// ones skipped beyond the cap.
	ran, skipped = old("all")
	if len(ran) < 4 || len(ran) > 5 || len(skipped) < 5 {
		t.Errorf("all: %d ran, %d skipped; want 4-5 run (cap 5, the newest may fall after now), the rest skipped", len(ran), len(skipped))
	}
	for _, r := range skipped {
		if !r.Missed || !strings.Contains(deref(r.Reason), "beyond the catch-up cap of 5") {
			t.Errorf("all: %v missed %v reason %q", r.Instant, r.Missed, deref(r.Reason))
		}
		if r.Instant.After(ran[0].Instant) {
			t.Errorf("all: skipped %v is newer than one run (%v)", r.Instant, ran[0].Instant)
		}
	}
	// all inside a 3 s window: the older instants skipped as outside it.
	ran, skipped = old("window")
	if len(ran) < 2 || len(ran) > 4 || len(skipped) < 6 {
		t.Errorf("window: %d ran, %d skipped; want the ~3 inside the window run", len(ran), len(skipped))
	}
	for _, r := range skipped {
		if !strings.Contains(deref(r.Reason), "older than the catch-up window of 3s") || r.Instant.After(ran[0].Instant) {
			t.Errorf("window: %v reason %q", r.Instant, deref(r.Reason))
		}
	}
	var ordered bool
	if err := db.Pool.QueryRow(ctx, `SELECT bool_and(s) FROM (SELECT started_at >= lag(started_at, 1, started_at) OVER (ORDER BY instant) AS s
		FROM pgclaim_schedule_runs WHERE schedule = 'all' AND state = 'succeeded') x`).Scan(&ordered); err != nil || !ordered {
		t.Errorf("all: runs not started oldest first (%v)", err)
	}
	var effects int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT schedule, instant FROM effects GROUP BY 1, 2 HAVING count(*) > 1) x`).Scan(&effects); err != nil || effects != 0 {
		t.Errorf("%d instants took effect more than once (%v)", effects, err)
	}
	if n := len(ev.of(EventMissed)); n < 36 {
		t.Errorf("%d missed events, want one per late instant (~40)", n)
	}
}

// A 3 s run on a 1 s schedule: with skip the instants due meanwhile are
// recorded skipped, naming the run; with buffer one, one of them waits and
// runs when the current run ends, the others are skipped. Runs of a
// schedule never overlap.
func TestOverlapSkipAndBufferOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	defs := []Definition{
		{Name: "skip", Spec: "* * * * * *", Version: 1, Overlap: OverlapSkip},
		{Name: "buffer", Spec: "* * * * * *", Version: 1, Overlap: OverlapBufferOne},
	}
	slow := func(ctx context.Context, r Run) error {
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
		}
		return nil
	}
	var ins []*instance
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, nil)
		for _, d := range defs {
			if err := in.s.Register(ctx, d, slow); err != nil {
				t.Fatal(err)
			}
		}
		in.start(t)
		ins = append(ins, in)
	}
	waitFor(t, 30*time.Second, "three runs of each", func() bool {
		for _, d := range defs {
			n := 0
			for _, r := range runsOf(t, db.Pool, d.Name) {
				if r.State == stateSucceeded {
					n++
				}
			}
			if n < 3 {
				return false
			}
		}
		return true
	})
	for _, in := range ins {
		in.stop()
	}
	for _, d := range defs {
		var overlaps int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedule_runs a JOIN pgclaim_schedule_runs b
			ON a.schedule = b.schedule AND a.instant < b.instant
			WHERE a.schedule = $1 AND a.state = 'succeeded' AND b.state = 'succeeded' AND b.started_at < a.finished_at`, d.Name).Scan(&overlaps); err != nil {
			t.Fatal(err)
		}
		if overlaps != 0 {
			t.Errorf("%s: %d pairs of runs overlapped", d.Name, overlaps)
		}
	}
	var ran, skipped int
	for _, r := range runsOf(t, db.Pool, "skip") {
		switch r.State {
		case stateSucceeded:
			ran++
		case stateSkipped:
			skipped++
			if !strings.HasPrefix(deref(r.Reason), "overlap: the run of ") || !strings.Contains(deref(r.Reason), "is still running") {
				t.Errorf("skip: %v reason %q", r.Instant, deref(r.Reason))
			}
		}
	}
	if skipped < 2*(ran-1) {
		t.Errorf("skip: %d ran, %d skipped; want about two skipped per run", ran, skipped)
	}
	var buffered, full int
	for _, r := range runsOf(t, db.Pool, "buffer") {
		switch r.State {
		case stateSucceeded:
			var waited time.Duration
			if err := db.Pool.QueryRow(ctx, `SELECT started_at - instant FROM pgclaim_schedule_runs WHERE schedule = 'buffer' AND instant = $1`, r.Instant).Scan(&waited); err != nil {
				t.Fatal(err)
			}
			if waited > 1500*time.Millisecond {
				buffered++
			}
		case stateSkipped:
			full++
			if !strings.Contains(deref(r.Reason), "a run is already buffered") {
				t.Errorf("buffer: %v reason %q", r.Instant, deref(r.Reason))
			}
		}
	}
	if buffered < 1 || full < 1 {
		t.Errorf("buffer: %d runs waited in the buffer, %d skipped as the buffer was full; want both", buffered, full)
	}
}

// TestOverlapBufferAll: a 3 s run on a 1 s schedule with buffer_all skips
// nothing: every instant recorded runs, oldest first, never two at once.
func TestOverlapBufferAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	def := Definition{Name: "all", Spec: "* * * * * *", Version: 1, Overlap: OverlapBufferAll}
	slow := func(ctx context.Context, r Run) error {
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
		}
		return nil
	}
	var ins []*instance
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, nil)
		if err := in.s.Register(ctx, def, slow); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		ins = append(ins, in)
	}
	waitFor(t, 30*time.Second, "three runs", func() bool {
		n := 0
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.State == stateSucceeded {
				n++
			}
		}
		return n >= 3
	})
	for _, in := range ins {
		in.stop()
	}
	var overlaps int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedule_runs a JOIN pgclaim_schedule_runs b
		ON a.schedule = b.schedule AND a.instant < b.instant
		WHERE a.schedule = $1 AND b.started_at < a.finished_at`, def.Name).Scan(&overlaps); err != nil {
		t.Fatal(err)
	}
	if overlaps != 0 {
		t.Errorf("%d pairs of runs overlapped or ran out of order", overlaps)
	}
	rs := runsOf(t, db.Pool, def.Name)
	pending := 0
	for _, r := range rs {
		switch r.State {
		case stateSkipped, stateFailed:
			t.Errorf("%v: %s (%q); want every instant kept", r.Instant, r.State, deref(r.Reason))
		case statePending, stateRetrying, stateRunning:
			pending++
		}
	}
	if pending < 3 {
		t.Errorf("%d runs recorded, %d still waiting; want a backlog of at least 3 (runs take 3 periods)", len(rs), pending)
	}
}
