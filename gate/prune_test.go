package gate_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// The 12:00 tick ran and finished; at 12:00:31 Prune(30s) would delete it,
// and an instance firing 40 s late (inside the default one-minute
// SkewTolerance) would claim it again. Prune refuses that age, naming the
// field, and the late fire is skipped.
func TestPruneWithinSkewToleranceRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	first := newGate(t, db.Pool, "on-time", gate.Config{})
	late := newGate(t, db.NewPool(t), "late", gate.Config{})

	noon := dbNow(t, db.Pool).Add(-40 * time.Second).Truncate(time.Second)
	var runs atomic.Int32
	fn := func(context.Context, gate.Run) error { runs.Add(1); return nil }
	if err := first.Once(ctx, "report", noon, fn); err != nil {
		t.Fatalf("first Once: %v", err)
	}
	// The tick ran at 12:00, as its instance fired on time.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_ticks SET started_at = fire_at, finished_at = fire_at WHERE job = 'report'`); err != nil {
		t.Fatal(err)
	}

	n, err := first.Prune(ctx, 30*time.Second)
	if !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "Config.SkewTolerance") {
		t.Errorf("Prune(30s) = %d, %v; want an error wrapping ErrInvalid naming Config.SkewTolerance", n, err)
	}
	if err := late.Once(ctx, "report", noon, fn); !errors.Is(err, gate.ErrSkipped) {
		t.Errorf("late Once: %v; want ErrSkipped", err)
	}
	if got := runs.Load(); got != 1 {
		t.Fatalf("the 12:00 tick ran %d times; want 1", got)
	}

	// An age past the tolerance is accepted (and keeps the 40 s old tick).
	if n, err := first.Prune(ctx, gate.DefaultSkewTolerance+time.Second); err != nil || n != 0 {
		t.Errorf("Prune(61s) = %d, %v; want 0, nil", n, err)
	}
	if _, err := first.Prune(ctx, gate.DefaultSkewTolerance); !errors.Is(err, gate.ErrInvalid) {
		t.Errorf("Prune(SkewTolerance) = %v; want ErrInvalid (the age must exceed it)", err)
	}
}

// An age within a catch-up window this gate was asked to use is refused:
// CatchUp would take the pruned tick for a missed one and run it again.
func TestPruneWithinCatchUpWindowRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	g := newGate(t, db.Pool, "h", gate.Config{})
	sched := cron.Every(time.Hour)
	_ = g.CatchUp(ctx, "hourly", sched, 2*time.Hour, func(context.Context, gate.Run) error { return nil })
	_, err := g.Prune(ctx, 90*time.Minute)
	if !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "CatchUp window") {
		t.Errorf("Prune(90m) after CatchUp(window 2h) = %v; want ErrInvalid naming the CatchUp window", err)
	}
	if _, err := g.Prune(ctx, 2*time.Hour+time.Second); err != nil {
		t.Errorf("Prune(2h1s): %v", err)
	}
}
