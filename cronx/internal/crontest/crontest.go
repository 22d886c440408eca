package crontest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// RunsTable records one row per run of a job: the tick it ran for and the
// instance that ran it. It has no unique constraint, so a tick run twice
// shows up as two rows.
const RunsTable = `CREATE TABLE runs (tick timestamptz NOT NULL, holder text NOT NULL)`

// RunsPerTick returns who ran each tick, from RunsTable.
func RunsPerTick(t testing.TB, pool *pgxpool.Pool) map[time.Time][]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT tick, holder FROM runs`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[time.Time][]string{}
	for rows.Next() {
		var at time.Time
		var h string
		if err := rows.Scan(&at, &h); err != nil {
			t.Fatal(err)
		}
		out[at.UTC()] = append(out[at.UTC()], h)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Seen records, per instance, the ticks its gate acquired or skipped, and
// the events that should not happen: a skip that is not about the tick
// being taken or locked (a clock outside the tolerance), a run that did not
// succeed, a lost lock.
type Seen struct {
	mu       sync.Mutex
	ticks    map[string]map[time.Time]bool
	bad      []gate.Event
	stopping bool
}

// Stop marks the start of shutdown: from then on, a run cut short by the
// scheduler's shutdown (recorded as abandoned) is expected.
func (s *Seen) Stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
}

// Hooks returns the gate hooks of instance holder.
func (s *Seen) Hooks(holder string) gate.Hooks {
	return gate.HooksFunc(func(_ context.Context, e gate.Event) {
		s.mu.Lock()
		defer s.mu.Unlock()
		abandonedAtStop := s.stopping && e.Kind == gate.EventFinished && e.Outcome == gate.OutcomeAbandoned
		if (e.Kind == gate.EventSkipped && !errors.Is(e.Err, gate.ErrSkipped)) ||
			(e.Kind == gate.EventFinished && e.Outcome != gate.OutcomeSucceeded && !abandonedAtStop) || e.Kind == gate.EventLost {
			s.bad = append(s.bad, e)
		}
		if (e.Kind != gate.EventAcquired && e.Kind != gate.EventSkipped) || e.FireAt.IsZero() {
			return
		}
		if s.ticks == nil {
			s.ticks = map[string]map[time.Time]bool{}
		}
		if s.ticks[holder] == nil {
			s.ticks[holder] = map[time.Time]bool{}
		}
		s.ticks[holder][e.FireAt.UTC()] = true
	})
}

// Unexpected fails t for every event that should not have happened.
func (s *Seen) Unexpected(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.bad {
		t.Errorf("unexpected %s event for %s at %s: outcome %q, error %v", e.Kind, e.Holder, e.FireAt.Format(time.RFC3339Nano), e.Outcome, e.Err)
	}
}

// All returns the ticks every one of holders fired.
func (s *Seen) All(holders ...string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for at := range s.ticks[holders[0]] {
		all := true
		for _, h := range holders[1:] {
			all = all && s.ticks[h][at]
		}
		if all {
			out = append(out, at)
		}
	}
	return out
}

// Daily fires once a day at the time of day of At.
type Daily struct{ At time.Time }

// Next returns the first instant after t.
func (d Daily) Next(t time.Time) time.Time {
	n := d.At.Add(t.Sub(d.At).Truncate(24 * time.Hour))
	for !n.After(t) {
		n = n.Add(24 * time.Hour)
	}
	for n.Add(-24 * time.Hour).After(t) {
		n = n.Add(-24 * time.Hour)
	}
	return n
}

// Fire builds an adapter's job for a Daily schedule on g, with the given
// maximum delay (0: the adapter's default), and returns the function that
// fires it once now.
type Fire func(g *gate.Gate, name string, sched Daily, fn gate.Func, maxDelay time.Duration) (func(context.Context) error, error)

// MaxDelayFollowsSkewTolerance checks that without an explicit maximum
// delay a job may start as late as its gate's skew tolerance allows: a run
// 5 minutes late counts for its instant under a 10-minute tolerance, and is
// refused with errNoInstant under the default minute or an explicit
// maximum delay of a minute.
func MaxDelayFollowsSkewTolerance(t *testing.T, fire Fire, errNoInstant error) {
	pool := pgtest.Pool(t)
	instant := time.Now().Add(-5 * time.Minute).Truncate(time.Second).UTC()
	for _, c := range []struct {
		name      string
		tolerance time.Duration
		maxDelay  time.Duration
		runs      bool
	}{
		{"tolerance 10m", 10 * time.Minute, 0, true},
		{"default tolerance", 0, 0, false},
		{"explicit MaxDelay", 10 * time.Minute, time.Minute, false},
	} {
		g, err := gate.New(pool, gate.Config{SkewTolerance: c.tolerance})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		var ranFor time.Time
		f, err := fire(g, "late-"+strings.ReplaceAll(c.name, " ", "-"), Daily{instant}, func(_ context.Context, run gate.Run) error {
			ranFor = run.FireAt
			return nil
		}, c.maxDelay)
		if err != nil {
			t.Fatal(err)
		}
		err = f(context.Background())
		if c.runs {
			if err != nil || !ranFor.Equal(instant) {
				t.Errorf("%s: got %v, ran for %v; want a run for %v", c.name, err, ranFor, instant)
			}
		} else if !errors.Is(err, errNoInstant) || !ranFor.IsZero() {
			t.Errorf("%s: got %v (ran for %v), want ErrNoInstant", c.name, err, ranFor)
		}
	}
}
