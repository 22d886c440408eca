package schedule

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/internal/grants"
	"github.com/pgclaim/pgclaim/pgtest"
)

// lockCounter counts the statements of a pool's connections that take or
// release advisory locks, and that read schedules' open runs.
type lockCounter struct{ takes, releases, reads atomic.Int64 }

func (c *lockCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch {
	case strings.Contains(d.SQL, "pg_try_advisory_lock"):
		c.takes.Add(1)
	case strings.Contains(d.SQL, "pg_advisory_unlock"):
		c.releases.Add(1)
	case strings.Contains(d.SQL, "-- name: OpenRuns"):
		c.reads.Add(1)
	}
	return ctx
}

func (c *lockCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestLocksOfOneInstantBatched: the locks of many schedules due at the same
// instant on one instance are taken in a few statements on its lock
// session, and released in a few, rather than one round trip each while
// the others wait for the session; and the runners that took them read
// their schedules' state in a few statements, not one each through the pool.
func TestLocksOfOneInstantBatched(t *testing.T) {
	const schedules = 100
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var count lockCounter
	cfg.ConnConfig.Tracer = &count
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, Config{Holder: "one", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ran := map[time.Time]int{}
	for i := range schedules {
		def := Definition{Name: fmt.Sprintf("batch-%03d", i), Spec: "*/2 * * * * *", Version: 1}
		if err := s.Register(ctx, def, func(_ context.Context, r Run) error {
			mu.Lock()
			ran[r.Instant]++
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() { cancel(); <-done }()

	// The first instant whose runs all ran, counted from a quiet moment
	// after it: the lock statements of that instant and no other.
	var takes, releases, reads int64
	deadline := time.Now().Add(time.Minute)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no instant had all %d schedules run within a minute: %v", schedules, ran)
		}
		// Between instants (the odd second after an even one), everything
		// of the last instant has ended: counted from there to the middle
		// of the next odd second.
		now := time.Now()
		instant := now.Add(time.Second).Truncate(2 * time.Second).Add(2 * time.Second)
		time.Sleep(instant.Add(-time.Second).Sub(now))
		t0, r0, d0 := count.takes.Load(), count.releases.Load(), count.reads.Load()
		time.Sleep(1500 * time.Millisecond)
		instant = instant.UTC()
		mu.Lock()
		n := ran[instant]
		mu.Unlock()
		if n == schedules {
			takes, releases, reads = count.takes.Load()-t0, count.releases.Load()-r0, count.reads.Load()-d0
			break
		}
	}
	t.Logf("one instant of %d schedules: %d statements took their locks, %d released them, %d read open runs", schedules, takes, releases, reads)
	// Runs end at different moments, so releases batch less than takes;
	// one statement per lock (before batching) is schedules of each.
	if takes > schedules/5 || releases > schedules/2 {
		t.Errorf("%d schedules due at one instant: %d statements took their locks (want at most %d) and %d released them (want at most %d)",
			schedules, takes, schedules/5, releases, schedules/2)
	}
	// Each runner reads its schedule's state at least once (before
	// batching: once or twice each).
	if reads > schedules/5 {
		t.Errorf("%d schedules due at one instant: %d statements read their open runs (want at most %d)", schedules, reads, schedules/5)
	}
}

// TestLooksGoToUntakenRuns: with more schedules due at one instant than the
// instances have room for, instances that free a slot go on to the
// schedules nobody has started, until every one has run: each schedule's
// run of the instant is taken by one instance, runs once and is recorded
// succeeded at its first attempt. The instances connect as a role with only
// the privileges `pgclaim grants` gives: the question of which schedules
// are taken needs no more than the poll. How many locks the instances try
// grows with the machine's load: the herd bench measures the statements of
// an instant, this test what they achieve.
func TestLooksGoToUntakenRuns(t *testing.T) {
	const instances, schedules, room = 4, 60, 5
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	app := roletest.New(t, db)
	if err := app.Grant(ctx, grants.Statements(app.Name, "public")...); err != nil {
		t.Fatal(err)
	}
	type key struct {
		name    string
		instant time.Time
	}
	var mu sync.Mutex
	ran := map[key]int{}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range instances {
		cfg, err := pgxpool.ParseConfig(app.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := New(pool, Config{Holder: fmt.Sprintf("untaken-%d", i), Logger: testLogger(t), MaxConcurrent: room})
		if err != nil {
			t.Fatal(err)
		}
		for j := range schedules {
			def := Definition{Name: fmt.Sprintf("untaken-%03d", j), Spec: "*/4 * * * * *", Version: 1}
			if err := s.Register(ctx, def, func(ctx context.Context, r Run) error {
				mu.Lock()
				ran[key{r.Schedule, r.Instant.UTC()}]++
				mu.Unlock()
				select {
				case <-time.After(200 * time.Millisecond):
				case <-ctx.Done():
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Run(rctx) }()
	}
	// An instant after every instance has started.
	instant := time.Now().Add(time.Second).Truncate(4 * time.Second).Add(4 * time.Second)
	ranAll := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for j := range schedules {
			if ran[key{fmt.Sprintf("untaken-%03d", j), instant.UTC()}] == 0 {
				return false
			}
		}
		return true
	}
	waitFor(t, 25*time.Second, fmt.Sprintf("every one of %d schedules to run for %s", schedules, instant.Format(time.TimeOnly)), ranAll)
	took := time.Since(instant)
	waitFor(t, 10*time.Second, "every run of the instant to be recorded succeeded", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedule_runs WHERE instant = $1 AND state = 'succeeded'`, instant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == schedules
	})
	cancel()
	wg.Wait()
	t.Logf("%d instances with room for %d each, %d schedules due at one instant: all ran %s after it",
		instances, room, schedules, took.Round(time.Millisecond))
	for j := range schedules {
		name := fmt.Sprintf("untaken-%03d", j)
		for _, r := range runsOf(t, db.Pool, name) {
			if r.Instant.Equal(instant.UTC()) && (r.State != stateSucceeded || r.Attempt != 1) {
				t.Errorf("%s at %s: %s at attempt %d; want succeeded at attempt 1", name, instant.Format(time.TimeOnly), r.State, r.Attempt)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, n := range ran {
		if n > 1 {
			t.Errorf("%s at %s ran %d times; want once", k.name, k.instant.Format(time.TimeOnly), n)
		}
	}
}

// TestBatcherExpect: calls announced with expect go in one batch, however
// far apart they come, rather than the first alone and the others after
// it; a batch that waits for a call that never comes is sent once the
// wait is over.
func TestBatcherExpect(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	b := &batcher[int, int]{send: func(_ context.Context, ins []int) ([]int, error) {
		mu.Lock()
		sizes = append(sizes, len(ins))
		mu.Unlock()
		return ins, nil
	}}
	b.expect(3, time.Minute)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := b.do(context.Background(), i); err != nil || out != i {
				t.Errorf("call %d: %d, %v", i, out, err)
			}
		}()
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	mu.Lock()
	if fmt.Sprint(sizes) != "[3]" {
		t.Errorf("batches %v, want one of 3", sizes)
	}
	sizes = nil
	mu.Unlock()

	b.expect(2, 50*time.Millisecond) // the second call never comes
	if _, err := b.do(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(sizes) != "[1]" {
		t.Errorf("batches %v, want one of 1", sizes)
	}
}
