package schedule

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// herdJob counts the calls of every (schedule, instant) and, per holder,
// the instants each started.
type herdJob struct {
	mu    sync.Mutex
	calls map[string]int // "name instant"
	by    map[string][]Run
	hold  time.Duration
}

func newHerdJob(hold time.Duration) *herdJob {
	return &herdJob{calls: map[string]int{}, by: map[string][]Run{}, hold: hold}
}

func (j *herdJob) job(ctx context.Context, r Run) error {
	j.mu.Lock()
	j.calls[fmt.Sprint(r.Schedule, " ", r.Instant.UTC().Format(time.RFC3339))]++
	j.by[r.Holder] = append(j.by[r.Holder], r)
	j.mu.Unlock()
	select {
	case <-time.After(j.hold):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (j *herdJob) count(name string, at time.Time) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.calls[fmt.Sprint(name, " ", at.UTC().Format(time.RFC3339))]
}

// startHerd registers n schedules (every 2 s) on two instances, each with
// room for half of them, and waits until each has run once: every runner
// has then read its schedule.
func startHerd(t *testing.T, db *pgtest.Database, n int, j *herdJob) []string {
	t.Helper()
	ctx := context.Background()
	names := make([]string, n)
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{Logger: discard, MaxConcurrent: n / 2}, nil)
		for i := range names {
			names[i] = fmt.Sprintf("herd-%03d", i)
			if err := in.s.Register(ctx, Definition{Name: names[i], Spec: "*/2 * * * * *", Version: 1}, j.job); err != nil {
				t.Fatal(err)
			}
		}
		in.start(t)
	}
	waitFor(t, 20*time.Second, "every schedule run once", func() bool {
		var done int
		if err := db.Pool.QueryRow(ctx, `SELECT count(DISTINCT schedule) FROM pgclaim_schedule_runs WHERE state = 'succeeded'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done == n
	})
	return names
}

// TestHerdPausedAmongDue: one of 200 schedules due at one instant is
// paused after the runners last read it, and no notification says so (as
// when it is lost): the other 199 run once each, and the paused one does
// not start.
func TestHerdPausedAmongDue(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	j := newHerdJob(50 * time.Millisecond)
	names := startHerd(t, db, 200, j)
	paused := names[42]
	// The next even second at least 800 ms away.
	instant := dbNow(t, db.Pool).Add(800 * time.Millisecond).Truncate(2 * time.Second).Add(2 * time.Second)
	time.Sleep(time.Until(instant.Add(-300 * time.Millisecond)))
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET paused = true, paused_at = now() WHERE name = $1`, paused); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(instant.Add(1500 * time.Millisecond)))
	for _, name := range names {
		want := 1
		if name == paused {
			want = 0
		}
		if n := j.count(name, instant); n != want {
			t.Errorf("%s at %s ran %d times; want %d", name, instant.Format(time.TimeOnly), n, want)
		}
	}
	for _, r := range runsOf(t, db.Pool, paused) {
		if r.Instant.Equal(instant) {
			t.Errorf("the paused schedule's instant %s was recorded %s", instant.Format(time.TimeOnly), r.State)
		}
	}
}

// TestHerdRunnerKilledMidInstant: of 60 schedules due at one instant and
// shared out between two instances, the runs one instance started are
// running when its lock session is terminated: the other instance takes
// each over as attempt 2, and each instant ends succeeded, no run of it
// started twice by the same attempt.
func TestHerdRunnerKilledMidInstant(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	j := newHerdJob(1500 * time.Millisecond)
	names := startHerd(t, db, 60, j)
	instant := dbNow(t, db.Pool).Add(800 * time.Millisecond).Truncate(2 * time.Second).Add(2 * time.Second)
	time.Sleep(time.Until(instant.Add(500 * time.Millisecond)))
	var ofA []string
	j.mu.Lock()
	for _, r := range j.by["a"] {
		if r.Instant.Equal(instant) {
			ofA = append(ofA, r.Schedule)
		}
	}
	j.mu.Unlock()
	if len(ofA) != len(names)/2 {
		t.Fatalf("instance a started %d of the instant's %d runs; want its room, %d", len(ofA), len(names), len(names)/2)
	}
	pid := lockPID(t, db, ofA[0])
	if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	for _, name := range ofA {
		done := waitSucceeded(t, db, name, instant, 20*time.Second)
		if done.Attempt < 2 {
			t.Errorf("%s at %s succeeded at attempt %d; want it taken over (attempt 2)", name, instant.Format(time.TimeOnly), done.Attempt)
		}
	}
	for _, name := range names {
		if n := j.count(name, instant); n < 1 || n > 2 {
			t.Errorf("%s at %s was called %d times; want 1, or 2 when taken over", name, instant.Format(time.TimeOnly), n)
		}
	}
	t.Logf("%d of %d runs of the instant were a's, all taken over", len(ofA), len(names))
}
