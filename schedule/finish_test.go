package schedule

import (
	"context"
	"fmt"
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
