package gate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// A Gate deletes finished ticks older than Config.Retention in batches,
// never a running one; CatchUp refuses a window as long as the retention,
// and bad settings are refused naming the field.
func TestRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	g := newGate(t, db.Pool, "r", gate.Config{Retention: 2 * time.Hour})
	at := dbNow(t, db.Pool).Truncate(time.Second)
	for i := range 5 {
		if err := g.Once(ctx, "job", at.Add(-time.Duration(i)*time.Second), func(context.Context, gate.Run) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// Four of them ran three hours ago; one of those is still marked running.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_ticks SET fire_at = fire_at - interval '3 hours', started_at = started_at - interval '3 hours' WHERE fire_at < $1`, at); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_ticks SET outcome = 'running', finished_at = NULL WHERE fire_at = (SELECT min(fire_at) FROM pgclaim_ticks)`); err != nil {
		t.Fatal(err)
	}
	n, err := g.RetainNow(ctx, 2)
	if err != nil || n != 3 {
		t.Fatalf("retention deleted %d (%v); want the 3 finished ticks older than 2 h", n, err)
	}
	var left, running int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE outcome = 'running') FROM pgclaim_ticks`).Scan(&left, &running); err != nil || left != 2 || running != 1 {
		t.Fatalf("%d ticks left, %d running (%v); want the recent one and the running one", left, running, err)
	}

	err = g.CatchUp(ctx, "job", every(time.Hour), 3*time.Hour, func(context.Context, gate.Run) error { return nil })
	if !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "Config.Retention") {
		t.Errorf("CatchUp with a window beyond the retention: %v", err)
	}
	for _, r := range []time.Duration{-time.Second, 30 * time.Minute} {
		if _, err := gate.New(db.Pool, gate.Config{Retention: r}); !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "Config.Retention") {
			t.Errorf("Config.Retention %s: %v", r, err)
		}
	}
	keep := newGate(t, db.Pool, "k", gate.Config{Retention: gate.KeepTicks})
	if n, err := keep.RetainNow(ctx, 2); err != nil || n != 0 {
		t.Errorf("KeepTicks deleted %d (%v)", n, err)
	}
}
