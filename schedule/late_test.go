package schedule

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// flags reads the late and overdue flags of a run.
func flags(t *testing.T, db *pgtest.Database, name string, at time.Time) (late, overdue bool) {
	t.Helper()
	if err := db.Pool.QueryRow(context.Background(), `SELECT late, overdue FROM pgclaim_schedule_runs WHERE schedule = $1 AND instant = $2`,
		name, at).Scan(&late, &overdue); err != nil {
		t.Fatal(err)
	}
	return late, overdue
}

// A run whose first attempt starts more than LateAfter after its instant
// is late (EventLate, a warning, the row's late flag); one started in time
// is not. An attempt running past ExpectedDuration is overdue, reported
// once per attempt and recorded on the row; a quick one is not.
func TestLateAndOverdue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	logs := &syncBuffer{}
	cfg := Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	in := newInstance(t, db, "a", cfg, ev)
	var slow atomic.Bool
	job := func(ctx context.Context, r Run) error {
		if r.Schedule != "slow" {
			return nil
		}
		if !slow.Load() {
			return nil
		}
		time.Sleep(700 * time.Millisecond) // past ExpectedDuration
		if r.Attempt == 1 {
			return errors.New("too slow")
		}
		return nil
	}
	late := Definition{Name: "late", Spec: "0 0 1 1 *", Version: 1, LateAfter: time.Second}
	slowDef := Definition{Name: "slow", Spec: "0 0 1 1 *", Version: 1, ExpectedDuration: 300 * time.Millisecond,
		Retry: RetryPolicy{MaxAttempts: 2, Backoff: 100 * time.Millisecond}}
	for _, d := range []Definition{late, slowDef} {
		if err := in.s.Register(ctx, d, job); err != nil {
			t.Fatal(err)
		}
	}
	in.start(t)
	// A trigger sent before the scheduler listens is found by its poll, a
	// poll interval (1 s) later: "on time" would then be late.
	waitFor(t, 10*time.Second, "the scheduler to listen", func() bool { sub := in.s.sub.Load(); return sub != nil && sub.Listening() })
	succeeded := func(name string, at time.Time) func() bool {
		return func() bool {
			for _, r := range runsOf(t, db.Pool, name) {
				if r.Instant.Equal(at) && r.State == stateSucceeded {
					return true
				}
			}
			return false
		}
	}

	// On time: triggered and started at once.
	onTime, _, err := in.s.Trigger(ctx, late.Name)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the on-time run", succeeded(late.Name, onTime))
	// Late: triggered while paused, started at resume 1.5 s later.
	if err := in.s.Pause(ctx, late.Name, "test", "t"); err != nil {
		t.Fatal(err)
	}
	lateAt, _, err := in.s.Trigger(ctx, late.Name)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := in.s.Resume(ctx, late.Name); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the late run", succeeded(late.Name, lateAt))
	if l, o := flags(t, db, late.Name, onTime); l || o {
		t.Errorf("on-time run: late %v overdue %v", l, o)
	}
	if l, _ := flags(t, db, late.Name, lateAt); !l {
		t.Error("the run started 1.5 s after its instant is not marked late")
	}
	lates := ev.of(EventLate)
	if len(lates) != 1 || !lates[0].Instant.Equal(lateAt) || lates[0].Duration < 1500*time.Millisecond || lates[0].Attempt != 1 {
		t.Errorf("late events %+v, want one for %v, at least 1.5 s late", lates, lateAt)
	}

	// Quick: not overdue.
	quick, _, err := in.s.Trigger(ctx, slowDef.Name)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the quick run", succeeded(slowDef.Name, quick))
	// Slow: both attempts overdue, each reported once.
	slow.Store(true)
	slowAt, _, err := in.s.Trigger(ctx, slowDef.Name)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the slow run", succeeded(slowDef.Name, slowAt))
	if _, o := flags(t, db, slowDef.Name, quick); o {
		t.Error("the quick run is marked overdue")
	}
	if _, o := flags(t, db, slowDef.Name, slowAt); !o {
		t.Error("the slow run is not marked overdue")
	}
	var overdue []int
	for _, e := range ev.of(EventOverdue) {
		if !e.Instant.Equal(slowAt) || e.Duration != slowDef.ExpectedDuration {
			t.Errorf("overdue event %+v", e)
		}
		overdue = append(overdue, e.Attempt)
	}
	if len(overdue) != 2 || overdue[0] != 1 || overdue[1] != 2 {
		t.Errorf("overdue events for attempts %v, want [1 2]", overdue)
	}
	// Status counts them.
	for _, c := range []struct {
		name          string
		late, overdue int
	}{{late.Name, 1, 0}, {slowDef.Name, 0, 1}} {
		st, err := in.s.Status(ctx, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Late != c.late || st.Overdue != c.overdue {
			t.Errorf("Status(%s): late %d overdue %d, want %d and %d", c.name, st.Late, st.Overdue, c.late, c.overdue)
		}
	}
	out := logs.String()
	for _, want := range []string{"level=WARN msg=\"schedule: late\"", "level=WARN msg=\"schedule: overdue\""} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in the log:\n%s", want, out)
		}
	}
}
