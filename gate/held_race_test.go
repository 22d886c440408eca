package gate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// holdWinnerClaim takes the job's lock and inserts its tick at at in a
// transaction left open, as the tick's winner does between taking the
// lock and committing its claim; the claim commits after delay. The
// returned function waits for that commit.
func holdWinnerClaim(t *testing.T, db *pgtest.Database, job string, at time.Time, delay time.Duration) (committed func()) {
	t.Helper()
	ctx := context.Background()
	winner, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(winner.Release)
	class, key := gate.AdvisoryKey(job)
	if _, err := winner.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", class, key); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { winner.Exec(ctx, "SELECT pg_advisory_unlock_all()") })
	tx, err := winner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO pgclaim_ticks (job, fire_at, holder, fence) VALUES ($1, $2, 'winner', pgclaim_fence())", job, at); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		done <- tx.Commit(ctx)
	}()
	return func() {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// A contender that finds the job's lock held while the winner of the same
// tick has taken it but not yet committed its claim (instances firing one
// tick together) skips the tick as claimed: it is not reported held
// ("this tick is not run"), since the winner runs it. The winner's claim
// is held open here by hand, between its lock and its commit.
func TestOnceRacingWinnerNotReportedHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	g := newGate(t, db.Pool, "loser", gate.Config{})
	const job = "race"
	at := dbNow(t, db.Pool).Truncate(time.Second)
	committed := holdWinnerClaim(t, db, job, at, 300*time.Millisecond)

	err := g.Once(ctx, job, at, func(context.Context, gate.Run) error {
		t.Error("the loser ran the tick")
		return nil
	})
	committed()
	var held *gate.HeldError
	if errors.As(err, &held) || !errors.Is(err, gate.ErrSkipped) {
		t.Fatalf("Once: %v; want a skip of a tick claimed already, not a held one (the tick is run by its winner)", err)
	}
}

// namedStatements records the sqlc names ("-- name: X") of the statements
// sent on a pool's connections, one by one or in batches (a batch's BEGIN
// and ROLLBACK are recorded as such).
type namedStatements struct {
	mu    sync.Mutex
	names []string
}

func (n *namedStatements) add(sql string) {
	name, _, _ := strings.Cut(strings.TrimPrefix(sql, "-- name: "), " ")
	n.mu.Lock()
	n.names = append(n.names, name)
	n.mu.Unlock()
}

func (n *namedStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	n.add(d.SQL)
	return ctx
}
func (n *namedStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (n *namedStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (n *namedStatements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	n.add(d.SQL)
}
func (n *namedStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (n *namedStatements) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	names := n.names
	n.names = nil
	return names
}

// A contender that fires a tick while the winner's claim of it is in
// flight learns that it lost in its one claim statement: eight instances
// firing one tick together cost eight claims and a finish, with no second
// look by the losers.
func TestOnceRacingLoserOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	trace := &namedStatements{}
	cfg.ConnConfig.Tracer = trace
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	g := newGate(t, pool, "loser", gate.Config{})
	const job = "race"
	at := dbNow(t, db.Pool).Truncate(time.Second)
	// A run of another job first, so the session the loser claims on is
	// set up already.
	if err := g.Once(ctx, "warm", at, func(context.Context, gate.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	committed := holdWinnerClaim(t, db, job, at, 200*time.Millisecond)
	trace.take()
	err = g.Once(ctx, job, at, func(context.Context, gate.Run) error {
		t.Error("the loser ran the tick")
		return nil
	})
	committed()
	if !errors.Is(err, gate.ErrSkipped) {
		t.Fatalf("Once: %v; want a skip of a tick claimed already", err)
	}
	if got := trace.take(); !slices.Equal(got, []string{"ClaimTick"}) {
		t.Errorf("the loser sent %v; want [ClaimTick] alone", got)
	}
}

// A tick skipped because another run holds the job's lock is reported held,
// and the probe that waited for claims in flight left nothing in the ledger:
// the tick can still be claimed once the lock is free.
func TestOnceHeldLeavesNoTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	holder := newGate(t, db.Pool, "holder", gate.Config{})
	g := newGate(t, db.Pool, "late", gate.Config{})
	const job = "held"
	at := dbNow(t, db.Pool).Truncate(time.Second)
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- holder.Exclusive(ctx, job, func(context.Context, gate.Run) error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	err := g.Once(ctx, job, at, func(context.Context, gate.Run) error {
		t.Error("ran while the lock was held")
		return nil
	})
	var held *gate.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Once: %v; want a *gate.HeldError", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_ticks WHERE job = $1`, job).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d ledger rows for the held tick (%v); want 0", n, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := g.Once(ctx, job, at, func(context.Context, gate.Run) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Once after the lock was freed: %v (ran %v); want the tick run", err, ran)
	}
}
