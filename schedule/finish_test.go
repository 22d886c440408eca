package schedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestOutcomeRecordedWhileLockHeld: an attempt that succeeded but whose
// outcome could not be recorded in time (the run's row is locked by another
// transaction for longer than the release deadline) keeps the schedule's
// lock and records it once it can. No other instance takes the run over, so
// the job runs once.
func TestOutcomeRecordedWhileLockHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	def := Definition{Name: "slow-finish", Spec: "0 0 1 1 *", Version: 1, Lease: time.Minute}
	var calls atomic.Int32
	started, proceed := make(chan struct{}), make(chan struct{})
	var ins []*instance
	for i := range 2 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{PollInterval: 200 * time.Millisecond}, nil)
		write := effect(in.pool)
		job := func(ctx context.Context, r Run) error {
			if calls.Add(1) == 1 {
				close(started)
				<-proceed
			}
			return write(ctx, r)
		}
		if err := in.s.Register(ctx, def, job); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		ins = append(ins, in)
	}
	instant, _, err := ins[0].s.Trigger(ctx, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgclaim_schedule_runs WHERE schedule = $1 AND instant = $2 FOR UPDATE`, def.Name, instant); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	time.Sleep(lockcore.ReleaseTimeout + time.Second) // the first try to record the outcome times out
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the run to end", func() bool {
		rs := runsOf(t, db.Pool, def.Name)
		return len(rs) == 1 && rs[0].State != stateRunning
	})
	time.Sleep(2 * time.Second) // time for a wrongful takeover (poll every 200 ms)
	rs := runsOf(t, db.Pool, def.Name)
	if len(rs) != 1 || rs[0].State != stateSucceeded || rs[0].Attempt != 1 {
		t.Fatalf("runs = %+v; want one, succeeded at attempt 1", rs)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || calls.Load() != 1 {
		t.Fatalf("job ran %d times, %d effects; want once", calls.Load(), n)
	}
}

// TestOutcomeNotRecordedIsReported: an attempt whose outcome cannot be
// recorded at all (a permanent error: here a trigger refuses the update) is
// not silent: the instance reports EventLost saying the outcome was not
// recorded, and the run, left running, is taken over as attempt 2 once the
// lock is released.
func TestOutcomeNotRecordedIsReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	if _, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION refuse_first_finish() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF OLD.state = 'running' AND NEW.state <> 'running' AND NEW.attempt = 1 THEN
				RAISE EXCEPTION 'refused by the test';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_first_finish BEFORE UPDATE ON pgclaim_schedule_runs
			FOR EACH ROW EXECUTE FUNCTION refuse_first_finish();`); err != nil {
		t.Fatal(err)
	}
	def := Definition{Name: "unrecorded", Spec: "0 0 1 1 *", Version: 1, Lease: 2 * time.Second}
	ev := &events{}
	in := newInstance(t, db, "inst", Config{PollInterval: 200 * time.Millisecond}, ev)
	if err := in.s.Register(ctx, def, func(context.Context, Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	in.start(t)
	instant, _, err := in.s.Trigger(ctx, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "attempt 2 to succeed", func() bool {
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Instant.Equal(instant) && r.State == stateSucceeded {
				return r.Attempt == 2
			}
		}
		return false
	})
	var found bool
	for _, e := range ev.of(EventLost) {
		if e.Attempt == 1 && errors.Is(e.Err, ErrLost) && strings.Contains(e.Err.Error(), "refused by the test") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no EventLost for attempt 1's unrecorded outcome; lost events: %+v", ev.of(EventLost))
	}
}
