package schedule

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/store"
)

// TestStartStampedWhenClaimed: an attempt's started_at is when its claim
// ran, not when the transaction around it began. Through the pool (lease
// locks) the claim runs in a transaction of its own, whose BEGIN can come
// well before the statement on a loaded machine; the claim reads the pause
// at the statement's time, so a start stamped at BEGIN could read as
// "started while paused" after a resume that committed in between.
func TestStartStampedWhenClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "inst", Config{}, nil)
	def := Definition{Name: "stamped", Spec: "0 0 1 1 *", Version: 1}
	if err := in.s.Register(ctx, def, func(context.Context, Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	instant, _, err := in.s.Trigger(ctx, def.Name) // pending; no scheduler runs it
	if err != nil {
		t.Fatal(err)
	}
	const gap = 300 * time.Millisecond
	err = pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		time.Sleep(gap) // the transaction began; the claim comes later
		var before time.Time
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
			return err
		}
		row, err := store.New(tx).ClaimRun(ctx, store.ClaimRunParams{
			Holder: "inst", LeaseUs: us(time.Minute), Schedule: def.Name, Instant: ts(instant), State: statePending,
		})
		if err != nil {
			return err
		}
		if started := row.StartedAt.Time; started.Before(before) {
			t.Errorf("started_at %s is before the claim ran (%s): stamped %s early", started.Format("15:04:05.000000"),
				before.Format("15:04:05.000000"), before.Sub(started).Round(time.Millisecond))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
