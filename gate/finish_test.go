package gate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// A run whose tick was changed under it (an operator marked it finished
// while it ran) finds nothing to finish: the gate says so in its log, and
// still releases the job's lock, so the next tick runs.
func TestOnceFinishOfChangedTickUnlocks(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	var logs syncBuffer
	g := newGate(t, db.Pool, "a", gate.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	other := newGate(t, db.Pool, "b", gate.Config{})
	ctx := context.Background()
	at := dbNow(t, db.Pool).Truncate(time.Second)

	err := g.Once(ctx, "job", at, func(ctx context.Context, run gate.Run) error {
		_, err := db.Pool.Exec(ctx, `UPDATE pgclaim_ticks SET outcome = 'succeeded', finished_at = now()
			WHERE job = 'job' AND fire_at = $1`, at)
		return err
	})
	if err != nil {
		t.Fatalf("Once: %v", err)
	}
	if !strings.Contains(logs.String(), "tick was not running at finish") {
		t.Errorf("log %q does not report the tick that was not running", logs.String())
	}
	ran := false
	err = other.Once(ctx, "job", at.Add(time.Second), func(context.Context, gate.Run) error { ran = true; return nil })
	var held *gate.HeldError
	if errors.As(err, &held) || err != nil || !ran {
		t.Fatalf("the next tick: %v (ran %v); want it run, the job's lock released", err, ran)
	}
}
