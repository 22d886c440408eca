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

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestConnectionBudget runs several instances, each with a pool of a few
// connections, over many schedules all due at the same instants, against a
// database whose connection limit is exactly their stated budget
// (instances × (MaxConns + DedicatedSessions)): the backends on it never exceed
// the budget, and every instant due while they ran succeeded exactly once.
// Each instance also runs two claim workers on its pool, woken by the
// table's trigger: they listen on the scheduler's listening session, and
// every row inserted meanwhile is worked once.
func TestConnectionBudget(t *testing.T) {
	const instances, schedules, maxConns = 4, 25, 3
	budget := instances * (maxConns + DedicatedSessions)
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	ctx := context.Background()
	admin, err := db.Server.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db.Pool.Reset() // its idle connections would count against the limit
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q CONNECTION LIMIT %d`, db.Name, budget)); err != nil {
		t.Fatal(err)
	}

	// Client backends only: an autovacuum worker on the database shows in
	// pg_stat_activity too, and is the server's, not an instance's.
	var most atomic.Int64
	var others atomic.Value // the other backends seen on the database
	others.Store("")
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		for sampleCtx.Err() == nil {
			var n int64
			var other string
			if err := admin.QueryRow(sampleCtx, `SELECT count(*) FILTER (WHERE backend_type = 'client backend'),
				coalesce(string_agg(DISTINCT backend_type, ', ') FILTER (WHERE backend_type <> 'client backend'), '')
				FROM pg_stat_activity WHERE datname = $1`, db.Name).Scan(&n, &other); err == nil {
				if n > most.Load() {
					most.Store(n)
				}
				if other != "" {
					others.Store(other)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	var ins []*instance
	var workers []*claim.Worker[int64]
	for i := range instances {
		pool, err := pgxpool.New(ctx, fmt.Sprintf("%s%spool_max_conns=%d", db.URL, sep, maxConns))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := New(pool, Config{Holder: fmt.Sprintf("i%d", i), Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		for j := range schedules {
			// Catch-up all and buffer all: an instant whose runner came
			// late on a loaded machine, or whose previous run had not
			// ended by then, still runs; lateness is the benchmark's to
			// measure. (CI, starved: the run of an instant still running
			// 2 s later, and the next skipped by the default overlap
			// policy, as designed.)
			def := Definition{Name: fmt.Sprintf("herd-%02d", j), Spec: "*/2 * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: time.Minute, Overlap: OverlapBufferAll}
			if err := s.Register(ctx, def, func(ctx context.Context, r Run) error {
				_, err := pool.Exec(ctx, `INSERT INTO effects (schedule, instant, attempt, fence, holder) VALUES ($1, $2, $3, $4, $5)`,
					r.Schedule, r.Instant, r.Attempt, r.Fence, r.Holder)
				time.Sleep(50 * time.Millisecond)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		ins = append(ins, &instance{s: s, pool: pool})
		for range 2 {
			workers = append(workers, budgetWorker(t, pool))
		}
	}
	from := dbNow(t, admin).Add(2 * time.Second).Truncate(2 * time.Second)
	for _, in := range ins {
		in.start(t)
	}
	wctx, stopWorkers := context.WithCancel(ctx)
	var working sync.WaitGroup
	for _, w := range workers {
		working.Add(1)
		go func() { defer working.Done(); _, _ = w.Run(wctx) }()
	}
	for i := range 40 {
		time.Sleep(200 * time.Millisecond)
		if _, err := ins[i%instances].pool.Exec(ctx, `INSERT INTO budget_rows (id, state) VALUES ($1, 'PAUSED')`, i); err != nil { // through an instance's pool: within the budget
			t.Logf("insert: %v", err)
		}
	}
	to := dbNow(t, admin).Add(-2 * time.Second).Truncate(2 * time.Second)
	// Let the instants due by then finish, then stop.
	time.Sleep(2 * time.Second)
	for _, in := range ins {
		in.stop()
	}
	stopWorkers()
	working.Wait()
	stopSampling()
	sampling.Wait()
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q CONNECTION LIMIT -1`, db.Name)); err != nil {
		t.Fatal(err)
	}

	t.Logf("%d instances × %d schedules, pools of %d: at most %d client backends (budget %d); other backends seen: %q", instances, schedules, maxConns, most.Load(), budget, others.Load())
	if most.Load() > int64(budget) {
		t.Errorf("%d client backends on the database, over the budget of %d", most.Load(), budget)
	}
	var due, succeeded, effects, doubled int
	if err := db.Pool.QueryRow(ctx, `
		WITH due AS (
			SELECT s.name, i AS instant FROM pgclaim_schedules s,
				generate_series($1::timestamptz, $2::timestamptz, interval '2 seconds') i
			WHERE s.name LIKE 'herd-%')
		SELECT count(*),
			count(*) FILTER (WHERE r.state = 'succeeded'),
			coalesce(sum((SELECT count(*) FROM effects e WHERE e.schedule = due.name AND e.instant = due.instant)), 0),
			count(*) FILTER (WHERE (SELECT count(*) FROM effects e WHERE e.schedule = due.name AND e.instant = due.instant) > 1)
		FROM due LEFT JOIN pgclaim_schedule_runs r ON r.schedule = due.name AND r.instant = due.instant`,
		from, to).Scan(&due, &succeeded, &effects, &doubled); err != nil {
		t.Fatal(err)
	}
	t.Logf("instants due from %s to %s: %d, succeeded %d, effects %d", from.Format(time.TimeOnly), to.Format(time.TimeOnly), due, succeeded, effects)
	if rows, err := db.Pool.Query(ctx, `SELECT coalesce(r.state, 'none') || coalesce(' (' || min(r.reason) || ')', ''), count(*), max(r.started_at - r.instant)::text FROM pgclaim_schedules s
		CROSS JOIN generate_series($1::timestamptz, $2::timestamptz, interval '2 seconds') i
		LEFT JOIN pgclaim_schedule_runs r ON r.schedule = s.name AND r.instant = i GROUP BY r.state`, from, to); err == nil {
		for rows.Next() {
			var st string
			var n int
			var lag *string
			_ = rows.Scan(&st, &n, &lag)
			t.Logf("state %s: %d (max start lag %s)", st, n, deref(lag))
		}
		rows.Close()
	}
	if due == 0 || succeeded != due || effects != due || doubled != 0 {
		t.Errorf("%d instants due, %d succeeded, %d effects, %d instants with more than one effect; want every one succeeded once", due, succeeded, effects, doubled)
	}
	var rows, done, worked, twice int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE r.state = 'DONE'),
		(SELECT count(DISTINCT id) FROM budget_worked), (SELECT count(*) - count(DISTINCT id) FROM budget_worked)
		FROM budget_rows r`).Scan(&rows, &done, &worked, &twice); err != nil {
		t.Fatal(err)
	}
	t.Logf("claim workers: %d rows inserted, %d done, %d worked, %d worked twice", rows, done, worked, twice)
	if rows == 0 || done != rows || worked != rows || twice != 0 {
		t.Errorf("%d rows, %d done, %d worked, %d worked twice; want every row worked once", rows, done, worked, twice)
	}
}

// budgetWorker creates the claim workers' table (once) with the trigger
// attached, and returns a worker on pool that records each row it works.
func budgetWorker(t *testing.T, pool *pgxpool.Pool) *claim.Worker[int64] {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS budget_rows (id bigint PRIMARY KEY, state text NOT NULL,
		claimed_at timestamptz, claimed_by text, fence bigint);
		CREATE TABLE IF NOT EXISTS budget_worked (id bigint NOT NULL);
		SELECT pgclaim_notify_on('budget_rows'::regclass, 'state', 'PAUSED')`); err != nil {
		t.Fatal(err)
	}
	c, err := claim.New[int64](pool, claim.Table{Name: "budget_rows", Key: "id", State: "state", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence"},
		claim.Config{From: "PAUSED", To: "PROCESSING", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, SkipVerify: true,
		Work: func(ctx context.Context, tx pgx.Tx, cl claim.Claim[int64]) error {
			_, err := tx.Exec(ctx, `INSERT INTO budget_worked VALUES ($1)`, cl.Key)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestMaxConcurrent: an instance never runs more than Config.MaxConcurrent
// jobs at once; the schedules it leaves are run by an instance with room,
// and every due instant succeeds once.
func TestMaxConcurrent(t *testing.T) {
	t.Parallel()
	const limit, schedules = 2, 6
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	ctx := context.Background()
	var mu sync.Mutex
	running, most := map[string]int{}, map[string]int{}
	var ins []*instance
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{MaxConcurrent: limit}, nil)
		job := effect(in.pool)
		for j := range schedules {
			if err := in.s.Register(ctx, Definition{Name: fmt.Sprintf("mc-%d", j), Spec: "*/3 * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: time.Minute}, func(ctx context.Context, r Run) error {
				mu.Lock()
				running[r.Holder]++
				most[r.Holder] = max(most[r.Holder], running[r.Holder])
				mu.Unlock()
				defer func() { mu.Lock(); running[r.Holder]--; mu.Unlock() }()
				time.Sleep(300 * time.Millisecond)
				return job(ctx, r)
			}); err != nil {
				t.Fatal(err)
			}
		}
		ins = append(ins, in)
	}
	from := dbNow(t, db.Pool).Add(3 * time.Second).Truncate(3 * time.Second)
	for _, in := range ins {
		in.start(t)
	}
	time.Sleep(8 * time.Second)
	to := dbNow(t, db.Pool).Add(-3 * time.Second).Truncate(3 * time.Second)
	time.Sleep(3 * time.Second)
	for _, in := range ins {
		in.stop()
	}
	mu.Lock()
	t.Logf("most jobs at once: %v (limit %d)", most, limit)
	for h, n := range most {
		if n > limit {
			t.Errorf("instance %s ran %d jobs at once, over Config.MaxConcurrent %d", h, n, limit)
		}
	}
	mu.Unlock()
	var due, succeeded, effects int
	if err := db.Pool.QueryRow(ctx, `
		WITH due AS (SELECT s.name, i AS instant FROM pgclaim_schedules s,
			generate_series($1::timestamptz, $2::timestamptz, interval '3 seconds') i)
		SELECT count(*), count(*) FILTER (WHERE r.state = 'succeeded'),
			coalesce(sum((SELECT count(*) FROM effects e WHERE e.schedule = due.name AND e.instant = due.instant)), 0)
		FROM due LEFT JOIN pgclaim_schedule_runs r ON r.schedule = due.name AND r.instant = due.instant`,
		from, to).Scan(&due, &succeeded, &effects); err != nil {
		t.Fatal(err)
	}
	if due == 0 || succeeded != due || effects != due {
		t.Errorf("%d instants due, %d succeeded, %d effects; want each succeeded once", due, succeeded, effects)
	}
}
