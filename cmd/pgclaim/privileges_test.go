package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/internal/grants"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status"
)

var quiet = slog.New(slog.DiscardHandler)

const appTable = `
CREATE TABLE pushes (id bigint PRIMARY KEY, status text NOT NULL, claimed_at timestamptz,
                     claimed_by text, fence bigint, lease_until timestamptz);
INSERT INTO pushes (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 20) g`

var appPushes = claim.Table{Name: "pushes", Key: "id", State: "status", ClaimedAt: "claimed_at",
	ClaimedBy: "claimed_by", Fence: "fence", LeaseUntil: "lease_until"}

// twoRoles sets up a database as the documentation says: a migration role
// that owns pgclaim's objects (it may create in the schema), and an
// application role with only what 'pgclaim grants' prints (and SELECT,
// UPDATE on the application's claimed table). The WAL control functions
// are refused, as on Aurora.
func twoRoles(t *testing.T) (db *pgtest.Database, owner, app *roletest.Role) {
	t.Helper()
	ctx := context.Background()
	db = unmigrated(t)
	exec1(t, db, roletest.RevokeWAL)
	// PostgreSQL 13 and 14 let every role create in schema public.
	exec1(t, db, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	exec1(t, db, appTable)
	owner = roletest.New(t, db, "GRANT CREATE ON SCHEMA public TO ROLE")
	if err := pgclaim.Migrate(ctx, owner.Pool); err != nil {
		t.Fatalf("migrate as the owner: %v", err)
	}
	app = roletest.New(t, db, "GRANT SELECT, UPDATE ON pushes TO ROLE")
	if err := app.Grant(ctx, grants.Statements(app.Name, "public")...); err != nil {
		t.Fatal(err)
	}
	var create bool
	if err := app.Pool.QueryRow(ctx, "SELECT has_schema_privilege('public', 'CREATE') OR has_database_privilege(current_database(), 'CREATE')").Scan(&create); err != nil || create {
		t.Fatalf("the application role may create: %v, %v", create, err)
	}
	return db, owner, app
}

// TestGrantsMatchCatalog: the grants list names every table, sequence and
// function pgclaim's migrations create, and nothing else.
func TestGrantsMatchCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	rows, err := db.Pool.Query(ctx, `
SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.relname::text
FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'S', 'p', 'v')
  AND c.relname LIKE 'pgclaim%' AND c.relname <> 'pgclaim_schema_version_id_seq'
UNION ALL
SELECT 'FUNCTION', p.oid::regprocedure::text
FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'pgclaim%'`)
	if err != nil {
		t.Fatal(err)
	}
	var inCatalog []string
	for rows.Next() {
		var kind, name string
		if err := rows.Scan(&kind, &name); err != nil {
			t.Fatal(err)
		}
		inCatalog = append(inCatalog, kind+" "+strings.ReplaceAll(name, ",", ", "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, o := range grants.Objects {
		listed = append(listed, string(o.Kind)+" "+o.Name)
	}
	slices.Sort(inCatalog)
	slices.Sort(listed)
	if !slices.Equal(inCatalog, listed) {
		t.Errorf("internal/grants lists\n  %s\nthe catalog has\n  %s", strings.Join(listed, "\n  "), strings.Join(inCatalog, "\n  "))
	}
}

// TestLeastPrivilege: every package and the CLI's status commands work as
// an application role with only the documented grants, where the WAL
// control functions are refused.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, _, app := twoRoles(t)
	pool := app.Pool

	// Start-up.
	if err := pgclaim.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate as the application role: %v", err)
	}

	// claim: a claim and its finish, a worker draining a batch, a sweep.
	c, err := claim.New[int64](pool, appPushes, claim.Config{From: "PAUSED", To: "PROCESSING", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, 1)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if err := c.Finish(ctx, cl, "DONE"); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 5,
		Work: func(context.Context, pgx.Tx, claim.Claim[int64]) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := w.Drain(ctx); err != nil || st.Succeeded != 19 {
		t.Fatalf("Worker.Drain: %+v, %v", st, err)
	}
	sw, err := claim.NewSweeper(c, claim.SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Sweep(ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}

	// gate: Once, Exclusive, a lease, an election.
	g, err := gate.New(pool, gate.Config{Holder: "app", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	nop := func(context.Context, gate.Run) error { return nil }
	if err := g.Once(ctx, "job", time.Now().Truncate(time.Second), nop); err != nil {
		t.Fatalf("Gate.Once: %v", err)
	}
	if err := g.Exclusive(ctx, "job", nop); err != nil {
		t.Fatalf("Gate.Exclusive: %v", err)
	}
	l, err := gate.NewLease(pool, "report", gate.LeaseConfig{Holder: "app", AtMost: time.Minute, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Do(ctx, nop); err != nil {
		t.Fatalf("Lease.Do: %v", err)
	}
	for _, m := range []gate.Mechanism{gate.Advisory, gate.LeaseRow} {
		e, err := gate.NewElector(pool, "leader-"+strings.ToLower(m.String()), gate.ElectorConfig{Holder: "app", TTL: 2 * time.Second, Mechanism: m, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Campaign(ctx); err != nil {
			t.Fatalf("Elector(%v).Campaign: %v", m, err)
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatalf("Elector(%v).Resign: %v", m, err)
		}
	}

	// schedule: register, trigger, run, operate, list.
	for _, lease := range []bool{false, true} {
		s := runOneSchedule(ctx, t, pool, lease)
		if err := s.Pause(ctx, "nightly", "maintenance", "test"); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := s.Resume(ctx, "nightly"); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		if _, err := s.List(ctx); err != nil {
			t.Fatalf("List: %v", err)
		}
		if _, err := s.Runs(ctx, "nightly", 10); err != nil {
			t.Fatalf("Runs: %v", err)
		}
	}

	// The status page: every view (its actions call the schedule package,
	// above, and ReleaseLease, granted with pgclaim_locks).
	page, err := status.New(status.Config{Pool: pool, Tables: []status.Table{{Table: appPushes}}, Actions: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(page)
	defer srv.Close()
	for _, view := range []string{"schedules.json", "locks.json", "leaders.json", "claims.json", ""} {
		resp, err := srv.Client().Get(srv.URL + "/" + view)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), `"error"`) || strings.Contains(string(body), "SQLSTATE") {
			t.Errorf("status page /%s as the application role: %d\n%s", view, resp.StatusCode, body)
		}
	}

	// The CLI's status commands.
	for _, args := range [][]string{
		{"migrate", "status"},
		{"ticks"},
		{"locks"},
		{"claims", "--table", "pushes"},
		{"schedules", "list"},
		{"schedules", "missed", "nightly"},
		{"grants", "--role", app.Name},
	} {
		r := cli(t, "", append(args, "--database-url", app.URL)...)
		if r.code != exitOK {
			t.Errorf("pgclaim %s as the application role: %s", strings.Join(args, " "), r)
		}
	}
	_ = db
}

// runOneSchedule registers a schedule, triggers it and runs a scheduler
// (with lease locks or not) until the run has run; it returns the
// scheduler, stopped.
func runOneSchedule(ctx context.Context, t *testing.T, pool *pgxpool.Pool, lease bool) *schedule.Scheduler {
	t.Helper()
	s, err := schedule.New(pool, schedule.Config{Holder: "app", Logger: quiet, PollInterval: 100 * time.Millisecond, LeaseLocks: lease})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}, 1)
	def := schedule.Definition{Name: "nightly", Spec: "0 3 * * *", TimeZone: "UTC", Version: 1}
	if err := s.Register(ctx, def, func(context.Context, schedule.Run) error {
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if _, _, err := s.Trigger(ctx, "nightly"); err != nil {
		t.Fatalf("Trigger: %v", err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	select {
	case <-ran:
	case err := <-done:
		t.Fatalf("Scheduler.Run (lease locks %v) returned before the triggered run ran: %v", lease, err)
	case <-time.After(15 * time.Second):
		t.Fatalf("the triggered run (lease locks %v) did not run within 15 s", lease)
	}
	return s
}

// TestMissingPrivilege: a privilege the application role lacks ends the
// call with an error naming the privilege and the statement that grants
// it; Scheduler.Run, an election and a Worker return it rather than retry
// forever.
func TestMissingPrivilege(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, _, app := twoRoles(t)
	pool := app.Pool
	revoke := func(table string) {
		t.Helper()
		exec1(t, db, "REVOKE ALL ON "+table+" FROM "+app.Ident())
	}
	want := func(what string, err error, subs ...string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		wantContains(t, what, err.Error(), subs...)
	}

	// A schedule: Run returns, within a few polls.
	s, err := schedule.New(pool, schedule.Config{Holder: "app", Logger: quiet, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, schedule.Definition{Name: "nightly", Spec: "* * * * *", TimeZone: "UTC", Version: 1}, func(context.Context, schedule.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	revoke("pgclaim_schedules")
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	err = s.Run(rctx)
	rcancel()
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Scheduler.Run retried a missing privilege for 20 s: %v", err)
	}
	want("Scheduler.Run", err, "permission denied for table pgclaim_schedules",
		"the role "+app.Name+" lacks SELECT, INSERT, UPDATE, DELETE on table public.pgclaim_schedules",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE public.pgclaim_schedules TO "+app.Name)

	// gate.Once.
	revoke("pgclaim_ticks")
	g, err := gate.New(pool, gate.Config{Holder: "app", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	err = g.Once(ctx, "job", time.Now().Truncate(time.Second), func(context.Context, gate.Run) error { return nil })
	want("Gate.Once", err, "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE public.pgclaim_ticks TO "+app.Name)

	// An election returns rather than campaign forever.
	revoke("pgclaim_terms")
	e, err := gate.NewElector(pool, "leader", gate.ElectorConfig{Holder: "app", TTL: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = e.Campaign(cctx)
	ccancel()
	want("Elector.Campaign", err, "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE public.pgclaim_terms TO "+app.Name)

	// The fencing-token sequence, through a claim; and the Worker.
	exec1(t, db, "REVOKE ALL ON SEQUENCE pgclaim_fence_seq FROM "+app.Ident())
	c, err := claim.New[int64](pool, appPushes, claim.Config{From: "PAUSED", To: "PROCESSING", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Claim(ctx, 1)
	want("Claim", err, "USAGE, SELECT on sequence public.pgclaim_fence_seq", "GRANT USAGE, SELECT ON SEQUENCE public.pgclaim_fence_seq TO "+app.Name)
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", SkipVerify: true, BatchSize: 5,
		Work: func(context.Context, pgx.Tx, claim.Claim[int64]) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = w.Run(wctx)
	wcancel()
	want("Worker.Run", err, "GRANT USAGE, SELECT ON SEQUENCE public.pgclaim_fence_seq TO "+app.Name)
	if err != nil && strings.Contains(err.Error(), "the table refuses") {
		t.Errorf("Worker.Run blames the table: %v", err)
	}
}
