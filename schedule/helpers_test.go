package schedule

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// tlog writes log records to the test's log.
type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// events collects the events of one or more schedulers.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) Observe(_ context.Context, ev Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

func (e *events) of(kind EventKind) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	for _, ev := range e.all {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// instance is a scheduler with its own pool, standing for a service
// instance.
type instance struct {
	s      *Scheduler
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan error
}

func newInstance(t testing.TB, db *pgtest.Database, holder string, cfg Config, ev *events) *instance {
	t.Helper()
	pool := db.NewPool(t)
	cfg.Holder = holder
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if ev != nil {
		cfg.Hooks = ev
	}
	s, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &instance{s: s, pool: pool}
}

// start runs the scheduler until stop (or the test's end).
func (in *instance) start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	in.done = make(chan error, 1)
	go func() { in.done <- in.s.Run(ctx) }()
	t.Cleanup(in.stop)
}

func (in *instance) stop() {
	if in.cancel == nil {
		return
	}
	in.cancel()
	<-in.done
	in.cancel = nil
}

// runRow is a row of pgclaim_schedule_runs.
type runRow struct {
	Instant time.Time
	Kind    string
	State   string
	Attempt int
	Fence   *int64
	Holder  *string
	Missed  bool
	Reason  *string
}

func runsOf(t testing.TB, pool *pgxpool.Pool, name string) []runRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT instant, kind, state, attempt, fence, holder, missed, reason
		FROM pgclaim_schedule_runs WHERE schedule = $1 ORDER BY instant`, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []runRow
	for rows.Next() {
		var r runRow
		if err := rows.Scan(&r.Instant, &r.Kind, &r.State, &r.Attempt, &r.Fence, &r.Holder, &r.Missed, &r.Reason); err != nil {
			t.Fatal(err)
		}
		r.Instant = r.Instant.UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// effectsTable creates the table jobs write their effects to.
func effectsTable(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		schedule text NOT NULL, instant timestamptz NOT NULL, attempt int NOT NULL, fence bigint NOT NULL, holder text NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
}

// effect is a job that records its run in effects through pool.
func effect(pool *pgxpool.Pool) Job {
	return func(ctx context.Context, r Run) error {
		_, err := pool.Exec(ctx, `INSERT INTO effects (schedule, instant, attempt, fence, holder) VALUES ($1, $2, $3, $4, $5)`,
			r.Schedule, r.Instant, r.Attempt, r.Fence, r.Holder)
		return err
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dbNow(t testing.TB, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now.UTC()
}

var discard = slog.New(slog.DiscardHandler)

// lockPID returns the backend pid holding the advisory lock of schedule
// name.
func lockPID(t testing.TB, db *pgtest.Database, name string) int {
	t.Helper()
	pid, err := pgprobe.AdvisoryHolder(context.Background(), db.Pool, pgprobe.Pair(LockKey(name)))
	if err != nil {
		t.Fatalf("the lock's session: %v", err)
	}
	return int(pid)
}
