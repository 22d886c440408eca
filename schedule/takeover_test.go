package schedule

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// zombieJob's first call blocks, ignoring its context, until release is
// closed, then returns nil: a runner that does not notice it lost its
// run. Every later call succeeds at once. Each call is counted by attempt.
type zombieJob struct {
	first    atomic.Bool
	started  chan Run
	release  chan struct{}
	released sync.Once
	calls    atomic.Int32
}

// free lets the blocked first call return (once; later calls do nothing).
func (z *zombieJob) free() { z.released.Do(func() { close(z.release) }) }

func newZombie() *zombieJob {
	return &zombieJob{started: make(chan Run, 1), release: make(chan struct{})}
}

func (z *zombieJob) job(ctx context.Context, r Run) error {
	z.calls.Add(1)
	if z.first.CompareAndSwap(false, true) {
		z.started <- r
		<-z.release
	}
	return nil
}

// The backend holding a schedule's lock session is terminated mid-run:
// another instance runs the instant as attempt 2 with a higher fence, and
// the first attempt's late completion is refused (ErrLost).
func TestTakeoverAfterSessionEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	z := newZombie()
	def := Definition{Name: "resume", Spec: "*/3 * * * * *", Version: 1}
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{}, ev)
		if err := in.s.Register(ctx, def, z.job); err != nil {
			t.Fatal(err)
		}
		in.start(t)
	}
	var first Run
	select {
	case first = <-z.started:
	case <-time.After(15 * time.Second):
		t.Fatal("no run started")
	}
	class, key := LockKey(def.Name)
	killed := time.Now()
	if n, err := pgprobe.TerminateHolder(ctx, db.Pool, pgprobe.Pair(class, key)); err != nil || n != 1 {
		t.Fatalf("the lock's session: ended %d: %v", n, err)
	}
	done := waitSucceeded(t, db, def.Name, first.Instant, 20*time.Second)
	t.Logf("instant %v completed as attempt %d %s after its runner's session was terminated", first.Instant, done.Attempt, time.Since(killed).Round(time.Millisecond))
	checkTakenOver(t, done, first)
	z.free() // the zombie completes late
	waitRefused(t, ev, first)
	for _, r := range runsOf(t, db.Pool, def.Name) {
		if r.Instant.Equal(first.Instant) && (r.State != stateSucceeded || r.Attempt != 2 || *r.Fence != *done.Fence) {
			t.Fatalf("after the late completion: %+v", r)
		}
	}
	if n := len(ev.of(EventTakenOver)); n != 1 {
		t.Errorf("%d taken-over events, want 1", n)
	}
}

// With leases (no advisory locks), a runner that stalls past its lease
// cannot complete: another instance takes the run over once the lease has
// expired, and the stalled one's completion is refused.
func TestLeaseStalledRunnerCannotComplete(t *testing.T) {
	t.Parallel()
	db, ev, z, def, first, stalled := stallLeaseRunner(t, "*/3 * * * * *")
	stalled.s.stalled.Store(true) // no more renewals, as if the process were stopped
	at := time.Now()
	done := waitSucceeded(t, db, def.Name, first.Instant, 20*time.Second)
	t.Logf("lease %s: taken over and completed %s after the runner stalled", def.Lease, time.Since(at).Round(time.Millisecond))
	checkTakenOver(t, done, first)
	z.free()
	stalled.s.stalled.Store(false)
	waitRefused(t, ev, first)
	for _, r := range runsOf(t, db.Pool, def.Name) {
		if r.Instant.Equal(first.Instant) && (r.State != stateSucceeded || r.Attempt != 2) {
			t.Fatalf("after the late completion: %+v", r)
		}
	}
}

// A run whose holder died on its last attempt is recorded failed, naming
// the holder; it is not run again.
func TestDeadRunWithoutAttemptsFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	z := newZombie()
	def := Definition{Name: "once", Spec: "*/3 * * * * *", Version: 1, Retry: RetryPolicy{MaxAttempts: 1}}
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{}, ev)
		if err := in.s.Register(ctx, def, z.job); err != nil {
			t.Fatal(err)
		}
		in.start(t)
	}
	var first Run
	select {
	case first = <-z.started:
	case <-time.After(15 * time.Second):
		t.Fatal("no run started")
	}
	class, key := LockKey(def.Name)
	if _, err := pgprobe.TerminateHolder(ctx, db.Pool, pgprobe.Pair(class, key)); err != nil {
		t.Fatal(err)
	}
	var failed runRow
	waitFor(t, 20*time.Second, "the dead run recorded failed", func() bool {
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Instant.Equal(first.Instant) && r.State == stateFailed {
				failed = r
				return true
			}
		}
		return false
	})
	if failed.Attempt != 1 || !strings.Contains(deref(failed.Reason), "its holder "+first.Holder+" died") || !strings.Contains(deref(failed.Reason), "no attempts left") {
		t.Fatalf("failed run: attempt %d reason %q", failed.Attempt, deref(failed.Reason))
	}
	z.free()
	waitFor(t, 10*time.Second, "the late completion refused", func() bool {
		for _, e := range ev.of(EventLost) {
			if e.Instant.Equal(first.Instant) && errors.Is(e.Err, ErrLost) && strings.Contains(e.Err.Error(), "changed nothing") {
				return true
			}
		}
		return false
	})
	for _, r := range runsOf(t, db.Pool, def.Name) {
		if r.Instant.Equal(first.Instant) && r.State != stateFailed {
			t.Fatalf("after the late completion: %+v", r)
		}
	}
}

// With leases, a stalled runner's run is taken over once the lock it
// started under has expired, even while the run's own lease (renewed
// apart from the lock's) would still hold: here it is pushed an hour
// ahead. The bound is the lock's lease plus a poll.
func TestLeaseTakeoverAtLockExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, ev, z, def, first, stalled := stallLeaseRunner(t, "*/3 * * * * *")
	t.Cleanup(z.free)             // before the instances stop: a failure must not hang on the zombie
	stalled.s.stalled.Store(true) // no more renewals, as if the process were stopped
	at := time.Now()
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedule_runs SET lease_until = now() + interval '1 hour'
		WHERE schedule = $1 AND instant = $2 AND fence = $3`, def.Name, first.Instant, first.Fence); err != nil {
		t.Fatal(err)
	}
	bound := def.Lease + time.Second + 3*time.Second // the lock's lease, a poll (Config.PollInterval), slack
	done := waitSucceeded(t, db, def.Name, first.Instant, bound)
	t.Logf("lease %s: taken over and completed %s after the runner stalled, its run's lease an hour ahead", def.Lease, time.Since(at).Round(time.Millisecond))
	checkTakenOver(t, done, first)
	z.free()
	stalled.s.stalled.Store(false)
	waitRefused(t, ev, first)
}

// stallLeaseRunner starts two instances with lease locks running a
// zombieJob on spec with a 2 s lease, and returns once the
// first attempt runs, with that attempt and the instance running it.
func stallLeaseRunner(t *testing.T, spec string) (db *pgtest.Database, ev *events, z *zombieJob, def Definition, first Run, runner *instance) {
	ctx := context.Background()
	db = pgtest.NewDatabase(t)
	ev = &events{}
	z = newZombie()
	def = Definition{Name: "resume", Spec: spec, Version: 1, Lease: 2 * time.Second}
	byHolder := map[string]*instance{}
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{LeaseLocks: true}, ev)
		if err := in.s.Register(ctx, def, z.job); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		byHolder[h] = in
	}
	select {
	case first = <-z.started:
	case <-time.After(15 * time.Second):
		t.Fatal("no run started")
	}
	return db, ev, z, def, first, byHolder[first.Holder]
}

// A dead holder's run is taken over even while recording the schedule's
// new instants fails (here every insert is refused; in the field, a
// database too slow to answer within the lock's validity): the pass goes
// on to start the runs it has read instead of giving up until a poll.
func TestTakeoverWhileRecordingFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, z, def, first, stalled := stallLeaseRunner(t, "* * * * * *")
	t.Cleanup(z.free)
	if _, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION refuse_runs() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'new runs refused by the test'; END $$;
		CREATE TRIGGER refuse_runs BEFORE INSERT ON pgclaim_schedule_runs
		FOR EACH ROW EXECUTE FUNCTION refuse_runs()`); err != nil {
		t.Fatal(err)
	}
	stalled.s.stalled.Store(true)
	if done := waitSucceeded(t, db, def.Name, first.Instant, def.Lease+time.Second+3*time.Second); done.Attempt != 2 {
		t.Fatalf("succeeded at attempt %d, want 2", done.Attempt)
	}
}

// waitSucceeded waits until the run of instant has succeeded, and returns
// its row.
func waitSucceeded(t *testing.T, db *pgtest.Database, name string, instant time.Time, within time.Duration) runRow {
	t.Helper()
	var done runRow
	waitFor(t, within, "attempt 2 to succeed", func() bool {
		for _, r := range runsOf(t, db.Pool, name) {
			if r.Instant.Equal(instant) && r.State == stateSucceeded {
				done = r
				return true
			}
		}
		return false
	})
	return done
}

// checkTakenOver fails unless done, the succeeded run, was completed by
// another instance as attempt 2 with a higher fence than first.
func checkTakenOver(t *testing.T, done runRow, first Run) {
	t.Helper()
	if done.Attempt != 2 || *done.Fence <= first.Fence || *done.Holder == first.Holder {
		t.Fatalf("completed by %s as attempt %d fence %d; first attempt %s fence %d", *done.Holder, done.Attempt, *done.Fence, first.Holder, first.Fence)
	}
}

// waitRefused waits until first's late completion is reported lost: the
// run was taken over, and the completion changed nothing.
func waitRefused(t *testing.T, ev *events, first Run) {
	t.Helper()
	waitFor(t, 10*time.Second, "the late completion to be refused", func() bool {
		for _, e := range ev.of(EventLost) {
			if e.Instant.Equal(first.Instant) && e.Fence == first.Fence && errors.Is(e.Err, ErrLost) && strings.Contains(e.Err.Error(), "changed nothing") {
				return true
			}
		}
		return false
	})
}
