package scenario

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status"
)

// The schedules the scenario stores.
const (
	// Running has a triggered run whose job blocks until the test ends.
	Running = "nightly-report"
	// Missed is registered by an instance that never runs: its instants
	// (every second) come due and nobody records them.
	Missed = "billing-export"
	// Paused is paused with PausedNote.
	Paused     = "vendor-sync"
	PausedNote = "vendor API down <i>ticket 42</i>"
	// Hostile is a job's name that is markup; its triggered run fails
	// with HostileReason.
	Hostile       = "<script>alert(1)</script>"
	HostileReason = `<img src=x onerror="alert(2)"> upstream 503`
	// Ticking runs every second (a quick job): pausing it stops its runs.
	Ticking = "push-resume"
	// Lease is a lease lock held by the scenario; Election one it leads.
	Lease    = "cleanup-lease"
	Election = "sweeper-leader"
	// Table is the claimed table; one of its PROCESSING rows is stuck.
	Table = "push_requests"
)

// Grace is the grace of the scenario's schedulers: the status page's
// Config.Grace must match it.
const Grace = time.Second

// Scenario is a running scenario.
type Scenario struct {
	Pool *pgxpool.Pool
	// TickingRuns counts the runs of Ticking that started.
	TickingRuns atomic.Int64
	// Operator is a Scheduler that runs nothing, for reading schedules as
	// the CLI does.
	Operator *schedule.Scheduler
	// LeaseHandle is the held Lease.
	LeaseHandle *gate.LeaseHandle
}

// Tables is the status page's Config.Tables for the scenario.
func Tables() []status.Table {
	return []status.Table{{
		Table:      claim.Table{Name: Table, Key: "id", State: "status", ClaimedAt: "claimed_at", Reason: "fail_reason"},
		Processing: "PROCESSING", StaleAfter: time.Hour,
	}}
}

// Start fills db (migrated) through pool and runs the scenario's instance
// until the test ends. It returns once the running run runs, the hostile
// run failed, a missed instant is due and the lease and the leadership are
// held.
func Start(t testing.TB, pool *pgxpool.Pool) *Scenario {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sc := &Scenario{Pool: pool}
	log := slog.New(slog.DiscardHandler)
	must := func(err error) {
		t.Helper()
		if err != nil {
			cancel()
			t.Fatal(err)
		}
	}

	_, err := pool.Exec(ctx, `
CREATE TABLE push_requests (
    id          bigserial PRIMARY KEY,
    status      text NOT NULL,
    claimed_at  timestamptz,
    fail_reason text
);
INSERT INTO push_requests (status) SELECT 'PAUSED' FROM generate_series(1, 5);
INSERT INTO push_requests (status) SELECT 'SENT' FROM generate_series(1, 3);
-- A crashed server left this row PROCESSING two days ago: stuck.
INSERT INTO push_requests (status, claimed_at) VALUES ('PROCESSING', now() - interval '2 days');
INSERT INTO push_requests (status, claimed_at) VALUES ('PROCESSING', now());`)
	must(err)
	_, err = pool.Exec(ctx, `INSERT INTO push_requests (status, fail_reason) VALUES ('FAILED', $1)`, HostileReason)
	must(err)

	svc, err := schedule.New(pool, schedule.Config{Holder: "instance-a", Logger: log, Grace: Grace, PollInterval: 200 * time.Millisecond})
	must(err)
	running := make(chan struct{}, 1)
	daily := func(name string) schedule.Definition {
		return schedule.Definition{Name: name, Spec: "0 0 3 * * *", TimeZone: "UTC", Version: 1, Retry: schedule.RetryPolicy{MaxAttempts: 1}}
	}
	must(svc.Register(ctx, daily(Running), func(ctx context.Context, _ schedule.Run) error {
		select {
		case running <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}))
	must(svc.Register(ctx, daily(Hostile), func(context.Context, schedule.Run) error {
		return errors.New(HostileReason)
	}))
	must(svc.Register(ctx, daily(Paused), func(context.Context, schedule.Run) error { return nil }))
	must(svc.Register(ctx, schedule.Definition{Name: Ticking, Spec: "* * * * * *", TimeZone: "UTC", Version: 1},
		func(context.Context, schedule.Run) error { sc.TickingRuns.Add(1); return nil }))
	// An instance that registered the missed schedule and stopped.
	gone, err := schedule.New(pool, schedule.Config{Holder: "instance-b", Logger: log, Grace: Grace})
	must(err)
	must(gone.Register(ctx, schedule.Definition{Name: Missed, Spec: "* * * * * *", TimeZone: "UTC", Version: 1},
		func(context.Context, schedule.Run) error { return nil }))

	sc.Operator, err = schedule.New(pool, schedule.Config{Holder: "operator", Logger: log, Grace: Grace})
	must(err)
	must(sc.Operator.Pause(ctx, Paused, PausedNote, "ops@example.com"))
	_, _, err = sc.Operator.Trigger(ctx, Running)
	must(err)
	_, _, err = sc.Operator.Trigger(ctx, Hostile)
	must(err)

	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()

	// A lease and a leader.
	lease, err := gate.NewLease(pool, Lease, gate.LeaseConfig{Holder: "instance-a", Logger: log, AtMost: time.Minute})
	must(err)
	lh, err := lease.TryAcquire(ctx)
	must(err)
	sc.LeaseHandle = lh
	el, err := gate.NewElector(pool, Election, gate.ElectorConfig{Holder: "instance-a", Logger: log})
	must(err)
	elected := make(chan struct{})
	elDone := make(chan error, 1)
	go func() {
		elDone <- el.Run(ctx, func(ctx context.Context, _ gate.Run) error {
			close(elected)
			<-ctx.Done()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		<-elDone
	})
	select {
	case <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("the election was not won within 30s")
	}

	select {
	case <-running:
	case err := <-done:
		t.Fatalf("scheduler stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the running run did not start within 30s")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := sc.Operator.Status(ctx, Hostile)
		must(err)
		ms, err := sc.Operator.Status(ctx, Missed)
		must(err)
		if st.Last != nil && st.Last.State == "failed" && ms.MissedUnrecorded > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scenario not ready after 30s: %s last %+v, %s missed %d", Hostile, st.Last, Missed, ms.MissedUnrecorded)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sc
}
