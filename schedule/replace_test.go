package schedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Overlap replace on a 1 s schedule whose first run lasts: the next
// instant replaces it — the first is recorded skipped naming its
// replacement, its attempt's context is cancelled with a cause wrapping
// ErrLost, and the new instant runs with a higher fence. A zombie that
// ignores the cancellation and completes later changes nothing (EventLost).
func TestOverlapReplace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	var mu sync.Mutex
	first := map[string]Run{}
	causes := map[string]error{}
	cancelled := map[string]time.Time{}
	job := func(ctx context.Context, r Run) error {
		mu.Lock()
		_, seen := first[r.Schedule]
		if !seen {
			first[r.Schedule] = r
		}
		mu.Unlock()
		if seen {
			return nil
		}
		if r.Schedule == "zombie" {
			time.Sleep(2500 * time.Millisecond) // ignores its context
			return nil
		}
		<-ctx.Done()
		mu.Lock()
		causes[r.Schedule], cancelled[r.Schedule] = context.Cause(ctx), time.Now()
		mu.Unlock()
		return ctx.Err()
	}
	defs := []Definition{
		{Name: "cancel", Spec: "* * * * * *", Version: 1, Overlap: OverlapReplace},
		{Name: "zombie", Spec: "* * * * * *", Version: 1, Overlap: OverlapReplace},
	}
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, ev)
		for _, d := range defs {
			if err := in.s.Register(ctx, d, job); err != nil {
				t.Fatal(err)
			}
		}
		in.start(t)
	}
	waitFor(t, 20*time.Second, "the zombie's late completion refused", func() bool {
		for _, e := range ev.of(EventLost) {
			if e.Schedule == "zombie" && errors.Is(e.Err, ErrLost) && strings.Contains(e.Err.Error(), "was replaced; its succeeded completion changed nothing") {
				return true
			}
		}
		return false
	})
	waitFor(t, 10*time.Second, "three runs of each after the first", func() bool {
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
	mu.Lock()
	defer mu.Unlock()
	for _, d := range defs {
		f := first[d.Name]
		rows := runsOf(t, db.Pool, d.Name)
		var replaced, next *runRow
		for i := range rows {
			if rows[i].Instant.Equal(f.Instant) {
				replaced = &rows[i]
				if i+1 < len(rows) {
					next = &rows[i+1]
				}
			}
		}
		if replaced == nil || next == nil {
			t.Fatalf("%s: no row for the first run %v or its successor: %+v", d.Name, f.Instant, rows)
		}
		want := "overlap: replaced by the run of " + next.Instant.Format(time.RFC3339Nano)
		if replaced.State != stateSkipped || deref(replaced.Reason) != want || replaced.Attempt != 1 || *replaced.Fence != f.Fence {
			t.Errorf("%s: replaced run %+v reason %q, want skipped at attempt 1, fence %d, reason %q", d.Name, *replaced, deref(replaced.Reason), f.Fence, want)
		}
		if next.State != stateSucceeded || *next.Fence <= f.Fence {
			t.Errorf("%s: the replacing run %+v", d.Name, *next)
		}
		var skippedEvent bool
		for _, e := range ev.of(EventSkipped) {
			if e.Schedule == d.Name && e.Instant.Equal(f.Instant) && e.Reason == want && e.Fence == f.Fence {
				skippedEvent = true
			}
		}
		if !skippedEvent {
			t.Errorf("%s: no EventSkipped for the replaced run", d.Name)
		}
	}
	if c := causes["cancel"]; !errors.Is(c, ErrLost) || !strings.Contains(c.Error(), "replaced by the run of") {
		t.Errorf("the replaced attempt's context cause: %v", c)
	}
	if at := cancelled["cancel"]; at.IsZero() {
		t.Error("the replaced attempt's context was not cancelled")
	} else {
		t.Logf("replaced attempt cancelled %s after its instant", at.Sub(first["cancel"].Instant).Round(time.Millisecond))
	}
}

// Jitter delays each instant's start by its own amount up to Jitter; the
// instant stays the scheduled one, nothing is late, and every instant runs
// once.
func TestJitter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	def := Definition{Name: "jittered", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll, Jitter: 600 * time.Millisecond}
	d, _, err := def.normalize()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	d2, _, _ := def.normalize()
	if d.jitterDelay(at) != d2.jitterDelay(at) || (Definition{Name: "x"}).jitterDelay(at) != 0 {
		t.Fatal("jitterDelay is not fixed per instant, or not 0 without jitter")
	}
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, nil)
		if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
			t.Fatal(err)
		}
		in.start(t)
	}
	time.Sleep(6 * time.Second)
	rows, err := db.Pool.Query(ctx, `SELECT instant, state, started_at - instant, late, start_after - instant
		FROM pgclaim_schedule_runs WHERE schedule = $1 AND state = 'succeeded' ORDER BY instant`, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	delays := map[time.Duration]bool{}
	var lags []time.Duration
	n := 0
	for rows.Next() {
		var inst time.Time
		var state string
		var lag time.Duration
		var late bool
		var after *time.Duration
		if err := rows.Scan(&inst, &state, &lag, &late, &after); err != nil {
			t.Fatal(err)
		}
		n++
		want := d.jitterDelay(inst)
		if want > d.Jitter || inst.Nanosecond() != 0 {
			t.Errorf("%v: delay %s beyond the jitter, or not a scheduled instant", inst, want)
		}
		if want > 0 && (after == nil || *after != want) {
			t.Errorf("%v: start_after %v after the instant, want %s", inst, after, want)
		}
		if lag < want {
			t.Errorf("%v: started %s after its instant, before its delay %s", inst, lag, want)
		}
		if late {
			t.Errorf("%v: marked late (started %s after, delay %s)", inst, lag, want)
		}
		delays[want] = true
		lags = append(lags, lag-want)
	}
	if n < 3 || len(delays) < 2 {
		t.Fatalf("%d runs with %d distinct delays; want several of each", n, len(delays))
	}
	var dup int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT instant FROM effects GROUP BY instant HAVING count(*) > 1) d`).Scan(&dup); err != nil || dup != 0 {
		t.Fatalf("%d instants with more than one effect (%v)", dup, err)
	}
	t.Logf("%d jittered runs; start after the delayed start: %v", n, lags)
}
