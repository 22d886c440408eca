package gate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

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

	winner, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer winner.Release()
	class, key := gate.AdvisoryKey(job)
	if _, err := winner.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", class, key); err != nil {
		t.Fatal(err)
	}
	defer winner.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	tx, err := winner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO pgclaim_ticks (job, fire_at, holder, fence) VALUES ($1, $2, 'winner', pgclaim_fence())", job, at); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		committed <- tx.Commit(ctx)
	}()

	err = g.Once(ctx, job, at, func(context.Context, gate.Run) error {
		t.Error("the loser ran the tick")
		return nil
	})
	if cerr := <-committed; cerr != nil {
		t.Fatal(cerr)
	}
	var held *gate.HeldError
	if errors.As(err, &held) || !errors.Is(err, gate.ErrSkipped) {
		t.Fatalf("Once: %v; want a skip of a tick claimed already, not a held one (the tick is run by its winner)", err)
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
