package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/internal/listen"
)

// never is a poll interval no test outlives: a worker polling at it finds
// rows only when it is woken.
const never = time.Hour

// listener opens a connection listening on the jobs table's channel.
func listener(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	ctx := testCtx(t)
	pc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := pc.Hijack()
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	var ch string
	if err := c.QueryRow(ctx, "SELECT 'pgclaim_claim_' || 'jobs'::regclass::oid").Scan(&ch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return c
}

// heard returns the payloads c receives within d.
func heard(t *testing.T, c *pgx.Conn, d time.Duration) []string {
	t.Helper()
	var out []string
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		n, err := c.WaitForNotification(ctx)
		cancel()
		if err != nil {
			return out
		}
		out = append(out, n.Payload)
	}
}

// TestNotifyTrigger: the trigger sends one notification per statement that
// puts rows in the state, whatever the number of rows; none for a statement
// that takes rows out or leaves them, none for a rolled-back one.
func TestNotifyTrigger(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := db.Pool
	createJobs(t, pool, "bigint", 0)
	mustExec(t, pool, `SELECT pgclaim_notify_on('jobs'::regclass, 'state', 'PAUSED')`)
	l := listener(t, pool)
	quiet := 300 * time.Millisecond

	mustExec(t, pool, `INSERT INTO jobs (id, state) SELECT g, 'PAUSED' FROM generate_series(1, 10000) g`)
	if got := heard(t, l, quiet); len(got) != 1 || got[0] != "PAUSED" {
		t.Fatalf("a 10,000-row INSERT: heard %q, want one PAUSED", got)
	}
	mustExec(t, pool, `UPDATE jobs SET state = 'PROCESSING' WHERE id <= 100`)
	mustExec(t, pool, `UPDATE jobs SET attempts = attempts + 1 WHERE state = 'PAUSED'`)
	mustExec(t, pool, `INSERT INTO jobs (id, state) VALUES (20001, 'DONE')`)
	if got := heard(t, l, quiet); len(got) != 0 {
		t.Fatalf("statements that put no row in PAUSED: heard %q", got)
	}
	mustExec(t, pool, `UPDATE jobs SET state = 'PAUSED' WHERE id <= 100`)
	if got := heard(t, l, quiet); len(got) != 1 {
		t.Fatalf("an UPDATE back to PAUSED: heard %q, want one", got)
	}
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jobs (id, state) VALUES (30001, 'PAUSED')`); err != nil {
		t.Fatal(err)
	}
	if err := Notify(ctx, tx, "jobs", "PAUSED"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := heard(t, l, quiet); len(got) != 0 {
		t.Fatalf("a rolled-back INSERT and Notify: heard %q", got)
	}

	// Detached: nothing more.
	var dropped bool
	if err := pool.QueryRow(ctx, `SELECT pgclaim_notify_off('jobs'::regclass, 'state', 'PAUSED')`).Scan(&dropped); err != nil || !dropped {
		t.Fatalf("pgclaim_notify_off: %v, %v", dropped, err)
	}
	mustExec(t, pool, `INSERT INTO jobs (id, state) VALUES (40001, 'PAUSED')`)
	if got := heard(t, l, quiet); len(got) != 0 {
		t.Fatalf("after pgclaim_notify_off: heard %q", got)
	}
	if err := pool.QueryRow(ctx, `SELECT pgclaim_notify_off('jobs'::regclass, 'state', 'PAUSED')`).Scan(&dropped); err != nil || dropped {
		t.Fatalf("pgclaim_notify_off again: %v, %v", dropped, err)
	}
}

// TestNotifyOnRefusesBadInput: a view, a missing column, a value the
// column's type refuses each fail at attach time with an error naming it;
// the table's owner, not a superuser and without CREATE on pgclaim's
// schema, attaches it to an enum column of a table in its own schema, and
// detaches it.
func TestNotifyOnRefusesBadInput(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	owner := roletest.New(t, db, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`, `CREATE SCHEMA app AUTHORIZATION ROLE`,
		`ALTER USER ROLE SET search_path = app, public`)
	ctx := testCtx(t)
	mustExec(t, owner.Pool, `CREATE TYPE job_state AS ENUM ('PAUSED', 'PROCESSING', 'DONE')`)
	mustExec(t, owner.Pool, `CREATE TABLE items (id bigint PRIMARY KEY, status job_state NOT NULL)`)
	mustExec(t, owner.Pool, `CREATE VIEW items_v AS SELECT * FROM items`)
	for _, c := range []struct{ sql, want string }{
		{`SELECT pgclaim_notify_on('items_v'::regclass, 'status', 'PAUSED')`, "is not a table"},
		{`SELECT pgclaim_notify_on('items'::regclass, 'state', 'PAUSED')`, `has no column state`},
		{`SELECT pgclaim_notify_on('items'::regclass, 'status', 'PAUSD')`, `'PAUSD' is not a value of column app.items.status (type app.job_state)`},
		{`SELECT pgclaim_notify_on('items'::regclass, 'status', NULL)`, "must not be null"},
	} {
		_, err := owner.Pool.Exec(ctx, c.sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.sql, err, c.want)
		}
	}
	mustExec(t, owner.Pool, `SELECT pgclaim_notify_on('items'::regclass, 'status', 'PAUSED')`)
	mustExec(t, owner.Pool, `SELECT pgclaim_notify_on('items'::regclass, 'status', 'PAUSED')`) // again: replaces
	if n := count(t, owner.Pool, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass AND NOT tgisinternal`); n != 2 {
		t.Fatalf("%d triggers after attaching twice, want 2", n)
	}
	fns := `SELECT count(*) FROM pg_proc WHERE proname LIKE 'pgclaim\_notify\_%' AND prorettype = 'trigger'::regtype AND proname <> 'pgclaim_notify_claimable'`
	if n := count(t, owner.Pool, fns); n != 1 {
		t.Fatalf("%d trigger functions of pgclaim's after attaching, want 1", n)
	}
	conn, err := owner.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, conn, fmt.Sprintf(`LISTEN "pgclaim_claim_%d"`, count(t, owner.Pool, `SELECT 'items'::regclass::oid::int`)))
	mustExec(t, owner.Pool, `INSERT INTO items VALUES (1, 'PAUSED')`)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := conn.Conn().WaitForNotification(wctx)
	cancel()
	if err != nil || n.Payload != "PAUSED" {
		t.Fatalf("the owner's INSERT: notification %v, %v; want PAUSED", n, err)
	}
	var was bool
	if err := owner.Pool.QueryRow(ctx, `SELECT pgclaim_notify_off('items'::regclass, 'status', 'PAUSED')`).Scan(&was); err != nil || !was {
		t.Fatalf("pgclaim_notify_off: %v, %v; want true", was, err)
	}
	if n := count(t, owner.Pool, fns); n != 0 {
		t.Fatalf("%d trigger functions of pgclaim's after detaching the last trigger, want 0", n)
	}
	if err := Notify(ctx, owner.Pool, "nosuch", "PAUSED"); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("Notify on a missing table: %v", err)
	}
	if err := Notify(ctx, owner.Pool, "items", ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Notify without a state: %v", err)
	}
}

// wakeWorker runs a worker on the jobs table that polls at never, and
// returns the channel each worked row's id is sent on.
func wakeWorker(t *testing.T, pool *pgxpool.Pool, cfg WorkerConfig[int64]) <-chan int64 {
	t.Helper()
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Lease: 10 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	worked := make(chan int64, 1000)
	work := cfg.Work
	cfg.Work = func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
		if work != nil {
			if err := work(ctx, tx, cl); err != nil {
				return err
			}
		}
		worked <- cl.Key
		return nil
	}
	cfg.Done, cfg.Failed, cfg.BatchSize, cfg.PollInterval = "DONE", "FAILED", 10, never
	w, err := NewWorker(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _, _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return worked
}

// expectWorked waits for the ids to be worked, in any order.
func expectWorked(t *testing.T, worked <-chan int64, what string, ids ...int64) {
	t.Helper()
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	timeout := time.After(20 * time.Second)
	for len(want) > 0 {
		select {
		case id := <-worked:
			delete(want, id)
		case <-timeout:
			t.Fatalf("%s: rows %v not worked within 20 s (the worker polls every hour: only a wake-up finds them)", what, want)
		}
	}
}

// TestWorkerWakes: a worker whose poll never comes claims a row the moment
// the trigger announces it, or claim.Notify at its transaction's commit.
func TestWorkerWakes(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := db.Pool
	createJobs(t, pool, "bigint", 0)
	worked := wakeWorker(t, pool, WorkerConfig[int64]{})
	time.Sleep(500 * time.Millisecond) // the worker's first claim has found nothing

	// Without the trigger, an INSERT is not heard; Notify in the
	// writer's transaction is.
	ctx := testCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jobs (id, state) VALUES (1, 'PAUSED')`); err != nil {
		t.Fatal(err)
	}
	if err := Notify(ctx, tx, "jobs", "PAUSED"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expectWorked(t, worked, "claim.Notify", 1)

	mustExec(t, pool, `SELECT pgclaim_notify_on('jobs'::regclass, 'state', 'PAUSED')`)
	for i := int64(2); i <= 6; i++ {
		mustExec(t, pool, `INSERT INTO jobs (id, state) VALUES ($1, 'PAUSED')`, i)
		expectWorked(t, worked, "the trigger", i)
	}
	// A big statement drains in batches: the worker claims again while
	// it finds full batches.
	mustExec(t, pool, `INSERT INTO jobs (id, state) SELECT g, 'PAUSED' FROM generate_series(100, 149) g`)
	var ids []int64
	for i := int64(100); i < 150; i++ {
		ids = append(ids, i)
	}
	expectWorked(t, worked, "50 rows in one statement", ids...)
}

// TestWorkerWakesForRetry: a row sent back with a backoff is claimed again
// when its backoff ends, not at the next poll.
func TestWorkerWakesForRetry(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := db.Pool
	createJobs(t, pool, "bigint", 0)
	mustExec(t, pool, `ALTER TABLE jobs ADD COLUMN retry_at timestamptz`)
	var failed atomic.Int32
	tbl := jobsTable
	tbl.RetryAt = "retry_at"
	c, err := New[int64](pool, tbl, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	worked := make(chan int64, 10)
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, PollInterval: never,
		Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3, Backoff: 300 * time.Millisecond},
		Work: func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
			if cl.Attempts == 1 {
				failed.Add(1)
				return errors.New("first attempt fails")
			}
			worked <- cl.Key
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `INSERT INTO jobs (id, state) VALUES (1, 'PAUSED')`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _, _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	expectWorked(t, worked, "a retry after its backoff", 1)
	if failed.Load() != 1 {
		t.Fatalf("%d failed attempts, want 1", failed.Load())
	}
}

// TestWorkerListenerTerminated: the listening session's backend is
// terminated while rows arrive; the worker's process reconnects and claims
// at once, so every row is worked without a poll.
func TestWorkerListenerTerminated(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := db.Pool
	createJobs(t, pool, "bigint", 0)
	mustExec(t, pool, `SELECT pgclaim_notify_on('jobs'::regclass, 'state', 'PAUSED')`)
	worked := wakeWorker(t, pool, WorkerConfig[int64]{})
	ctx := testCtx(t)
	listenerPid := func() int {
		var pid int
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1 || ' %'`, listen.ApplicationName).Scan(&pid)
			if err == nil {
				return pid
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("no listening session")
		return 0
	}
	var ids []int64
	for round := int64(0); round < 3; round++ {
		pid := listenerPid()
		mustExec(t, pool, `SELECT pg_terminate_backend($1)`, pid)
		// Rows written while the listener is down: nobody hears them.
		for i := round*10 + 1; i <= round*10+5; i++ {
			mustExec(t, pool, `INSERT INTO jobs (id, state) VALUES ($1, 'PAUSED')`, i)
			ids = append(ids, i)
		}
		expectWorked(t, worked, fmt.Sprintf("round %d, after the listener's backend was terminated", round), ids[len(ids)-5:]...)
	}
	// Worked, then committed: each row done once its transaction ends.
	deadline := time.Now().Add(10 * time.Second)
	for n := count(t, pool, `SELECT count(*) FROM jobs WHERE state <> 'DONE'`); n != 0; n = count(t, pool, `SELECT count(*) FROM jobs WHERE state <> 'DONE'`) {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows not done", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestListenerShared: every worker of a pool shares one listening session,
// whatever the number of workers and tables.
func TestListenerShared(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	pool := db.Pool
	createJobs(t, pool, "bigint", 0)
	mustExec(t, pool, `CREATE TABLE other (LIKE jobs INCLUDING ALL)`)
	for i := 0; i < 3; i++ {
		_ = wakeWorker(t, pool, WorkerConfig[int64]{})
	}
	other := jobsTable
	other.Name = "other"
	c, err := New[int64](pool, other, Config{From: "PAUSED", To: "PROCESSING", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, PollInterval: never,
		Work: func(context.Context, pgx.Tx, Claim[int64]) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _, _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// The fourth worker's table is heard: the one session listens on both.
	mustExec(t, pool, `SELECT pgclaim_notify_on('other'::regclass, 'state', 'PAUSED')`)
	time.Sleep(300 * time.Millisecond)
	mustExec(t, pool, `INSERT INTO other (id, state) VALUES (1, 'PAUSED')`)
	deadline := time.Now().Add(20 * time.Second)
	for count(t, pool, `SELECT count(*) FROM other WHERE state = 'DONE'`) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the row of the second table was not worked within 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sessions := `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1 || ' %'`
	if n := count(t, pool, sessions, listen.ApplicationName); n != 1 {
		t.Fatalf("%d listening sessions for four workers on two tables, want 1", n)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestWorkerBehindPgBouncer: behind PgBouncer in transaction mode, where
// LISTEN cannot work, the worker polls, says so once, and works every row.
func TestWorkerBehindPgBouncer(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0)
	mustExec(t, db.Pool, `SELECT pgclaim_notify_on('jobs'::regclass, 'state', 'PAUSED')`)
	ctx := testCtx(t)
	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	bnc, err := bouncer.Start(bctx, db.Server.URL(), db.Name)
	bcancel()
	switch {
	case errors.Is(err, bouncer.ErrNotFound) && os.Getenv("CI") != "true":
		t.Skipf("PgBouncer not found: %v", err)
	case err != nil:
		t.Fatalf("PgBouncer: %v", err)
	}
	defer bnc.Stop()
	pc, err := pgxpool.ParseConfig(bnc.URL(db.Name, "claim-test"))
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	logs := &messages{}
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, PollInterval: 100 * time.Millisecond,
		Work: func(context.Context, pgx.Tx, Claim[int64]) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _, _ = w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	for i := int64(1); i <= 20; i++ {
		mustExec(t, db.Pool, `INSERT INTO jobs (id, state) VALUES ($1, 'PAUSED')`, i)
	}
	deadline := time.Now().Add(30 * time.Second)
	for count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`) != 20 {
		if time.Now().After(deadline) {
			t.Fatal("rows not worked within 30 s behind PgBouncer")
		}
		time.Sleep(50 * time.Millisecond)
	}
	const polls = "claim: worker: polls only: notifications cannot reach this process (a connection pooler in transaction mode)"
	for !logs.has(polls) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not say it polls only; it logged %q", logs.got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// claimCounter counts the batch claim statements sent on a pool.
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "WITH pgclaim_c AS (") && strings.Contains(d.SQL, "SKIP LOCKED") {
		c.n.Add(1)
	}
	return ctx
}
func (*claimCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestNotifyNoStampede: eight processes (each a pool of its own, as each
// process has) with two workers each, the trigger attached, rows inserted
// one at a time: each row is worked once, and costs at most four claim
// statements, not one per process. The workers never poll: a row nobody
// was told of would never be worked.
func TestNotifyNoStampede(t *testing.T) {
	t.Parallel()
	const processes, perProcess, rows = 8, 2, 30
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0)
	mustExec(t, db.Pool, `SELECT pgclaim_notify_on('jobs'::regclass, 'state', 'PAUSED')`)
	ctx := testCtx(t)
	var counters []*claimCounter
	worked := make(chan int64, rows*2)
	for range processes {
		pool, cc := countedPool(t, ctx, db.URL)
		counters = append(counters, cc)
		c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		for range perProcess {
			runReporting(t, c, never, worked)
		}
	}
	claims := func() (n int64) {
		for _, c := range counters {
			n += c.n.Load()
		}
		return n
	}
	// The processes' sessions have heard of one another, and each
	// worker has made its first claim.
	deadline := time.Now().Add(20 * time.Second)
	for count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1 || ' %'`, listen.ApplicationName) < processes {
		if time.Now().After(deadline) {
			t.Fatal("the processes' listening sessions did not all start within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	before := claims()
	for i := int64(1); i <= rows; i++ {
		mustExec(t, db.Pool, `INSERT INTO jobs (id, state) VALUES ($1, 'PAUSED')`, i)
		expectWorked(t, worked, fmt.Sprintf("row %d", i), i)
		time.Sleep(20 * time.Millisecond) // the other claims of the row have ended
	}
	spent := claims() - before
	t.Logf("%d rows one at a time, %d processes × %d workers: %d claim statements, %.2f per row", rows, processes, perProcess, spent, float64(spent)/rows)
	// Two per row: the two processes an announcement goes to; a worker
	// whose work ended counts as idle again (2.90 per row when it did not,
	// its process passing announcements on).
	if spent > rows*5/2 {
		t.Errorf("%d claim statements for %d rows: more than 2.5 per row", spent, rows)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`); n != rows {
		t.Errorf("%d of %d rows done", n, rows)
	}
	select {
	case id := <-worked:
		t.Errorf("row %d worked twice", id)
	default:
	}
}

// While notifications reach them, the idle workers of one process that
// claim the same rows poll as one: a claim of any of them is the safety-net
// poll of all. Three idle workers with a 200 ms PollInterval send about one
// claim statement per interval between them, not three; a row written
// without any announcement is still found within about one interval.
func TestIdleWorkersPollAsOne(t *testing.T) {
	t.Parallel()
	const workers, interval = 3, 200 * time.Millisecond
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0) // no trigger: only the polls find rows
	ctx := testCtx(t)
	pool, cc := countedPool(t, ctx, db.URL)
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	worked := make(chan int64, 4)
	for range workers {
		runReporting(t, c, interval, worked)
	}
	deadline := time.Now().Add(20 * time.Second)
	for count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1 || ' %'`, listen.ApplicationName) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the listening session did not start within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	const window = 3 * time.Second
	before := cc.n.Load()
	time.Sleep(window)
	spent := cc.n.Load() - before
	per := float64(spent) / float64(window/interval)
	t.Logf("%d idle workers, PollInterval %s: %d claim statements in %s, %.2f per interval", workers, interval, spent, window, per)
	if per > 1.6 {
		t.Errorf("%d idle workers sent %.2f claim statements per PollInterval; want about one between them", workers, per)
	}
	mustExec(t, db.Pool, `INSERT INTO jobs (id, state) VALUES (1, 'PAUSED')`)
	expectWorked(t, worked, "a row written without announcement", 1)
}

// countedPool opens a pool of 4 on url whose claim statements cc counts,
// its configuration changed further by set.
func countedPool(t *testing.T, ctx context.Context, url string, set ...func(*pgxpool.Config)) (*pgxpool.Pool, *claimCounter) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc := &claimCounter{}
	pc.ConnConfig.Tracer = cc
	pc.MaxConns = 4
	for _, f := range set {
		f(pc)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, cc
}

// runReporting runs a worker on c for the rest of t, polling every poll,
// that sends each key it works to worked.
func runReporting(t *testing.T, c *Claimer[int64], poll time.Duration, worked chan<- int64) {
	t.Helper()
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, PollInterval: poll, SkipVerify: true,
		Work: func(_ context.Context, _ pgx.Tx, cl Claim[int64]) error { worked <- cl.Key; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _, _ = w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// An idle listening worker's polls, a PollInterval of 1 s apart, get the
// last poll's connection back from the pool without the ping pgxpool sends
// first for a connection idle over a second: the poll takes it a moment
// before it is due. Each such ping is one more transaction a second.
func TestIdlePollUnpinged(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0)
	ctx := testCtx(t)
	var pings atomic.Int64
	pool, cc := countedPool(t, ctx, db.URL, func(pc *pgxpool.Config) {
		pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
			if p.IdleDuration > time.Second { // pgxpool's default rule
				pings.Add(1)
				return true
			}
			return false
		}
	})
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runReporting(t, c, time.Second, make(chan int64, 1))
	time.Sleep(1500 * time.Millisecond)
	p0, c0 := pings.Load(), cc.n.Load()
	time.Sleep(5 * time.Second)
	p, n := pings.Load()-p0, cc.n.Load()-c0
	t.Logf("idle worker, PollInterval 1 s: %d polls and %d pool pings in 5 s", n, p)
	if n < 3 || n > 6 {
		t.Errorf("%d polls in 5 s at a PollInterval of 1 s", n)
	}
	if p > 2 { // one per poll before; a late timer on a loaded machine may cost one
		t.Errorf("%d pool pings for %d polls; want none", p, n)
	}
}
