package schedule

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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
	db, in, def := stampedSchedule(t)
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
		rows, err := store.New(tx).ClaimRuns(ctx, store.ClaimRunsParams{
			Holder: "inst", LeaseUs: []int64{us(time.Minute)}, Schedules: []string{def.Name}, Instants: []pgtype.Timestamptz{ts(instant)},
			States: []string{statePending}, Fences: []int64{0}, LockNames: []string{""}, LockFences: []int64{0},
		})
		if err != nil {
			return err
		}
		if len(rows) != 1 {
			return fmt.Errorf("claimed %d runs, want 1", len(rows))
		}
		row := rows[0]
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

// TestRecordStampedWhenItReadThePause: a recorded run's created_at is when
// its statement began, which is when it read the pause state, not when the
// row came out of it. Here the statement waits on a conflicting row
// another transaction holds; a pause commits meanwhile. The statement
// read "not paused" before the pause, so it records, and its rows must not
// read as recorded after the pause took effect.
func TestRecordStampedWhenItReadThePause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, in, def := stampedSchedule(t)
	at := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	i1, i2 := ts(at), ts(at.AddDate(1, 0, 0))
	record := func(q *store.Queries, instants ...pgtype.Timestamptz) error {
		p := store.RecordInstantsParams{Kind: "scheduled", Instants: instants}
		for range instants {
			p.States, p.Missed, p.Reasons = append(p.States, statePending), append(p.Missed, false), append(p.Reasons, "")
			p.Schedules, p.LockNames, p.LockFences = append(p.Schedules, def.Name), append(p.LockNames, ""), append(p.LockFences, 0)
		}
		_, err := q.RecordInstants(ctx, p)
		return err
	}
	blocker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if err := record(store.New(blocker), i1); err != nil { // uncommitted: the next insert of i1 waits
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- record(store.New(db.Pool), i1, i2) }()
	waitFor(t, 10*time.Second, "the record to wait", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%RecordInstants%'`).Scan(&n)
		return n == 1
	})
	if err := in.s.Pause(ctx, def.Name, "test", "test"); err != nil {
		t.Fatal(err)
	}
	var paused time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT now()`).Scan(&paused); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT instant, created_at FROM pgclaim_schedule_runs WHERE schedule = $1 ORDER BY instant`, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var instant, created time.Time
		if err := rows.Scan(&instant, &created); err != nil {
			t.Fatal(err)
		}
		n++
		if !created.Before(paused) {
			t.Errorf("instant %s: created_at %s, after the pause committed (%s), though its statement read the schedule unpaused",
				instant.UTC().Format(time.DateOnly), created.Format("15:04:05.000000"), paused.Format("15:04:05.000000"))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d runs recorded, want 2", n)
	}
}

// stampedSchedule registers a yearly schedule on an instance that is not
// started, so nothing runs what a test records.
func stampedSchedule(t *testing.T) (*pgtest.Database, *instance, Definition) {
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "inst", Config{}, nil)
	def := Definition{Name: "stamped", Spec: "0 0 1 1 *", Version: 1}
	if err := in.s.Register(context.Background(), def, func(context.Context, Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return db, in, def
}
