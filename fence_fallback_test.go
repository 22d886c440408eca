package pgclaim_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// appGrants are enough privileges for an application role on a database
// whose only tables are pgclaim's and the test's.
var appGrants = []string{
	"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ROLE",
	"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO ROLE",
}

const pushesSchema = `
CREATE TABLE pushes (id bigint PRIMARY KEY, status text NOT NULL, claimed_at timestamptz,
                     claimed_by text, fence bigint);
INSERT INTO pushes (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 3) g`

var pushesTable = claim.Table{Name: "pushes", Key: "id", State: "status", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence"}

// TestFenceWithoutWAL: on a server that refuses the WAL control functions
// to everyone but superusers (emulated by revoking them from PUBLIC, in this
// database only), an application role claims rows, runs a gate.Once and a
// schedule's run once pgclaim.Migrate has run. Every token granted is above
// every token granted before the functions were revoked. When they are
// granted again, the next Migrate goes back to the timeline fence, and
// tokens keep increasing.
func TestFenceWithoutWAL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, pushesSchema); err != nil {
		t.Fatal(err)
	}
	var before int64
	if err := db.Pool.QueryRow(ctx, "SELECT pgclaim_fence()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, roletest.RevokeWAL); err != nil {
		t.Fatal(err)
	}
	app := roletest.New(t, db, appGrants...)
	// The application's start-up: Migrate as its role, which owns nothing
	// and creates nothing, switches the fence.
	if err := pgclaim.Migrate(ctx, app.Pool); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, db.Pool, pgclaim.FenceSequence, 1)
	last := before
	checkToken := func(what string, tok int64) {
		t.Helper()
		if tok <= last {
			t.Errorf("%s: token %d, not above the last one %d", what, tok, last)
		}
		last = tok
	}

	// A claim.
	c, err := claim.New[int64](app.Pool, pushesTable, claim.Config{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := c.Claim(ctx, 1); err != nil {
		t.Errorf("claim as an application role without WAL functions: %v", err)
	} else {
		checkToken("claim", cl.Fence)
	}

	// A gate.Once.
	g, err := gate.New(app.Pool, gate.Config{Holder: "app", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var onceFence int64
	if err := g.Once(ctx, "job", time.Now().Truncate(time.Second), func(_ context.Context, r gate.Run) error {
		onceFence = r.Fence
		return nil
	}); err != nil {
		t.Errorf("gate.Once as an application role without WAL functions: %v", err)
	} else {
		checkToken("gate.Once", onceFence)
	}

	// A schedule's run.
	runSchedule(ctx, t, app.Pool, checkToken)

	// The functions granted again: back to the timeline fence.
	if _, err := db.Pool.Exec(ctx, roletest.GrantWAL); err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, db.Pool, pgclaim.FenceTimeline, 1)
	cl, err := c.Claim(ctx, 2)
	if err != nil {
		t.Fatalf("claim with the timeline fence again: %v", err)
	}
	checkToken("claim after the functions are granted again", cl.Fence)
}

// runSchedule registers a schedule as the pool's role, triggers it and
// runs a scheduler until the triggered run has run.
func runSchedule(ctx context.Context, t *testing.T, pool *pgxpool.Pool, checkToken func(string, int64)) {
	t.Helper()
	s, err := schedule.New(pool, schedule.Config{Holder: "app", Logger: slog.New(slog.DiscardHandler), PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan int64, 1)
	def := schedule.Definition{Name: "nightly", Spec: "0 3 * * *", TimeZone: "UTC", Version: 1}
	if err := s.Register(ctx, def, func(_ context.Context, r schedule.Run) error {
		select {
		case ran <- r.Fence:
		default:
		}
		return nil
	}); err != nil {
		t.Fatalf("schedule.Register: %v", err)
	}
	if _, _, err := s.Trigger(ctx, "nightly"); err != nil {
		t.Fatalf("schedule.Trigger: %v", err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	select {
	case f := <-ran:
		checkToken("schedule run", f)
	case err := <-done:
		t.Fatalf("Scheduler.Run returned before the triggered run ran: %v", err)
	case <-time.After(15 * time.Second):
		t.Error("the triggered run did not run within 15 s")
	}
}

// checkMode fails t unless pgclaim_fence_mode records fence with base.
func checkMode(ctx context.Context, t *testing.T, pool *pgxpool.Pool, fence string, base int64) {
	t.Helper()
	var f, reason string
	var b int64
	if err := pool.QueryRow(ctx, "SELECT fence, base, reason FROM pgclaim_fence_mode").Scan(&f, &b, &reason); err != nil {
		t.Fatal(err)
	}
	if f != fence || b != base {
		t.Fatalf("fence in force %s (base %d, %s), want %s (base %d)", f, b, reason, fence, base)
	}
}

// TestFenceChosenAtMigration: migrated where the WAL functions are refused
// from the start, pgclaim_fence() grants 2^48 + a sequence value, inlined
// into the statement like the timeline fence; it switches under
// pgclaim's migration lock; and a switch back is refused while the
// server's timeline is below the base in use.
func TestFenceChosenAtMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabaseFrom(t, empty)
	if _, err := db.Pool.Exec(ctx, roletest.RevokeWAL); err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, db.Pool, pgclaim.FenceSequence, 1)
	var tok int64
	if err := db.Pool.QueryRow(ctx, "SELECT pgclaim_fence()").Scan(&tok); err != nil || tok <= 1<<48 || tok > 1<<48+100 {
		t.Fatalf("first sequence-fence token %d (%v), want just above 2^48", tok, err)
	}
	checkInlined(ctx, t, db.Pool)
	// The switch waits for pgclaim's migration lock.
	for _, f := range []string{"00010_pgclaim_fence_fallback.sql", "00011_pgclaim_fence_qualified.sql"} {
		b, err := os.ReadFile("sql/migrations/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("pg_advisory_xact_lock(%d)", pgclaim.MigrationLockID); !strings.Contains(string(b), want) {
			t.Errorf("%s does not take %s", f, want)
		}
	}
	// A base above the server's timeline (tokens of a server on a later
	// timeline) stays: the timeline fence would grant smaller tokens.
	if _, err := db.Pool.Exec(ctx, "UPDATE pgclaim_fence_mode SET base = 7"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, roletest.GrantWAL); err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, db.Pool, pgclaim.FenceSequence, 7)
}
