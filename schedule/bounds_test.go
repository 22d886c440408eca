package schedule

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// A backfill's Max is bounded: above the limit it is refused (naming the
// field and the way out) unless AboveLimit says so explicitly.
func TestBackfillMaxBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "a", Config{}, nil)
	def := Definition{Name: "hourly", Spec: "0 * * * *", Version: 1, CatchUp: CatchUpNone}
	if err := in.s.Register(ctx, def, func(context.Context, Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, db.Pool).Truncate(time.Hour)
	opts := BackfillOptions{From: now.Add(-5 * time.Hour), To: now.Add(-time.Hour), Max: 10_001, DryRun: true}
	_, err := in.s.Backfill(ctx, def.Name, opts)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "BackfillOptions.Max") || !strings.Contains(err.Error(), "AboveLimit") {
		t.Fatalf("Backfill with Max 10001: %v, want ErrInvalid naming BackfillOptions.Max and AboveLimit", err)
	}
	opts.AboveLimit = true
	if _, err := in.s.Backfill(ctx, def.Name, opts); err != nil {
		t.Fatalf("Backfill with Max 10001 and AboveLimit: %v", err)
	}
}

// A recorded backfill can be cancelled: its pending runs are recorded
// skipped with who cancelled it, a later backfill leaves them alone, and
// other runs are untouched.
func TestCancelBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "a", Config{}, nil) // not started: nothing runs
	def := Definition{Name: "hourly", Spec: "0 * * * *", Version: 1, CatchUp: CatchUpNone}
	if err := in.s.Register(ctx, def, func(context.Context, Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, db.Pool).Truncate(time.Hour)
	res, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: now.Add(-10 * time.Hour), To: now.Add(-time.Hour), Max: 100})
	if err != nil || len(res.Instants) != 9 {
		t.Fatalf("Backfill: %+v, %v", res, err)
	}
	c, err := in.s.CancelBackfill(ctx, def.Name, "ops (ticket 7)")
	if err != nil {
		t.Fatal(err)
	}
	if c.Cancelled != 9 || !c.First.Equal(res.Instants[0]) || !c.Last.Equal(res.Instants[8]) {
		t.Fatalf("CancelBackfill: %+v, want 9 from %v to %v", c, res.Instants[0], res.Instants[8])
	}
	for _, r := range runsOf(t, db.Pool, def.Name) {
		if r.State != stateSkipped || r.Reason == nil || *r.Reason != "backfill cancelled by ops (ticket 7)" {
			t.Errorf("run %v: %s %v, want skipped, cancelled by ops", r.Instant, r.State, r.Reason)
		}
	}
	again, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: now.Add(-10 * time.Hour), To: now.Add(-time.Hour), Max: 100, DryRun: true})
	if err != nil || len(again.Instants) != 0 || again.Present != 9 {
		t.Fatalf("Backfill after the cancel: %+v, %v; want the 9 present", again, err)
	}
	if c, err := in.s.CancelBackfill(ctx, def.Name, ""); err != nil || c.Cancelled != 0 {
		t.Fatalf("CancelBackfill again: %+v, %v", c, err)
	}
	if _, err := in.s.CancelBackfill(ctx, "nope", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("CancelBackfill of an unknown schedule: %v, want ErrNotFound", err)
	}
}
