package gate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// A tick skipped behind a run holding the job's lock returns a *HeldError
// naming that run, and still matches ErrHeld and ErrSkipped.
func TestOnceHeldError(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	slow := newGate(t, db.Pool, "host-a", gate.Config{})
	other := newGate(t, db.NewPool(t), "host-b", gate.Config{})
	noon := dbNow(t, db.Pool).Truncate(time.Minute)
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- slow.Once(context.Background(), "held", noon, func(context.Context, gate.Run) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	before := dbNow(t, db.Pool)
	err := other.Once(context.Background(), "held", noon.Add(time.Minute), func(context.Context, gate.Run) error {
		t.Error("12:01 ran while 12:00 holds the lock")
		return nil
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, gate.ErrHeld) || !errors.Is(err, gate.ErrSkipped) {
		t.Errorf("%v; want ErrHeld and ErrSkipped", err)
	}
	var held *gate.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("%v (%T): errors.As finds no *HeldError", err, err)
	}
	if held.Error() != err.Error() {
		t.Errorf("HeldError text %q, returned %q", held.Error(), err.Error())
	}
	if held.Name != "held" || !held.FireAt.Equal(noon.Add(time.Minute)) || held.Holder != "host-a" ||
		!held.HolderFireAt.Equal(noon) || held.Since.IsZero() || held.Since.After(before) {
		t.Errorf("HeldError %+v; want Name held, FireAt %s, Holder host-a, HolderFireAt %s, Since set, not after %s",
			held, noon.Add(time.Minute), noon, before)
	}
}

// A refused tick returns a *SkewError carrying the instant, the database
// time and the tolerance, and still matches ErrClockSkew, in every mode.
func TestOnceSkewError(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]gate.Config{
		"locked":      {SkewTolerance: 30 * time.Second},
		"lock-wait":   {SkewTolerance: 30 * time.Second, LockWait: time.Second},
		"ledger-only": {SkewTolerance: 30 * time.Second, LedgerOnly: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			g := newGate(t, db.Pool, "skew", cfg)
			before := dbNow(t, db.Pool)
			at := before.Add(time.Hour)
			err := g.Once(context.Background(), "job", at, func(context.Context, gate.Run) error {
				t.Error("job ran an hour ahead")
				return nil
			})
			after := dbNow(t, db.Pool)
			if !errors.Is(err, gate.ErrClockSkew) {
				t.Errorf("%v; want ErrClockSkew", err)
			}
			var skew *gate.SkewError
			if !errors.As(err, &skew) {
				t.Fatalf("%v (%T): errors.As finds no *SkewError", err, err)
			}
			if skew.Error() != err.Error() {
				t.Errorf("SkewError text %q, returned %q", skew.Error(), err.Error())
			}
			if skew.Name != "job" || !skew.FireAt.Equal(at) || skew.Tolerance != 30*time.Second ||
				skew.DBNow.Before(before) || skew.DBNow.After(after) || skew.Skew() != at.Sub(skew.DBNow) {
				t.Errorf("SkewError %+v; want Name job, FireAt %s, Tolerance 30s, DBNow in [%s, %s]", skew, at, before, after)
			}
		})
	}
}
