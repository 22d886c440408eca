package schedule

// Attempts: starting the next run that can start (a compare-and-swap that
// issues a fresh fence), running its job, and recording its outcome.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/store"
)

// startNext claims the oldest run that can start now and starts its
// attempt: a run whose holder died (taken over), a retry whose time has
// come, or a pending run. It returns nil when none can.
func (s *Scheduler) startNext(ctx context.Context, h held, e *entry, st *stored, open []openRun) (*attemptRun, error) {
	lease := st.def.Lease
	for _, o := range open {
		switch {
		case o.state == stateRunning && (o.ready || !s.locks.leases() || (o.fence != nil && *o.fence < h.leaseFence())):
			// Its holder no longer holds the schedule's lock (this
			// instance does): it died, or lost its session or lease.
			// With leases, a run started under an earlier grant of the
			// lock (its fence is older than the lock's) is taken over
			// at once, as with a session lock: its holder counted the
			// lock lost, and cancelled the attempt, before the lock
			// could be granted again; the claim's new fence refuses
			// whatever the old attempt still writes.
			if o.attempt >= st.def.Retry.MaxAttempts {
				reason := fmt.Sprintf("attempt %d of %d: its holder %s died or lost its lock; no attempts left", o.attempt, st.def.Retry.MaxAttempts, o.holder)
				var n int64
				err := h.do(ctx, func(ctx context.Context, q *store.Queries, g guard) error {
					var err error
					n, err = q.FailDeadRun(ctx, store.FailDeadRunParams{Schedule: e.name, Instant: ts(o.instant), Fence: *o.fence, Reason: reason,
						LeaseMode: s.locks.leases(), LockName: g.name, LockFence: g.fence})
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("schedule: %q: record dead run: %w", e.name, err)
				}
				if n > 0 {
					s.emit(ctx, Event{Kind: EventTakenOver, Schedule: e.name, Instant: o.instant, RunKind: o.kind, Attempt: o.attempt, Fence: *o.fence, Holder: s.holder, State: stateFailed, Reason: reason})
				}
				continue
			}
			a, err := s.claim(ctx, h, e, st, o)
			if a != nil {
				s.emit(ctx, Event{Kind: EventTakenOver, Schedule: e.name, Instant: o.instant, RunKind: o.kind, Attempt: a.run.Attempt, Fence: a.run.Fence, Holder: s.holder, State: stateRunning,
					Reason: fmt.Sprintf("attempt %d's holder %s died or lost its lock", o.attempt, o.holder)})
				s.begin(ctx, e, a, lease)
			}
			if a != nil || err != nil {
				return a, err
			}
		case (o.state == stateRetrying || o.state == statePending) && o.ready:
			a, err := s.claim(ctx, h, e, st, o)
			if a != nil {
				s.begin(ctx, e, a, lease)
			}
			if a != nil || err != nil {
				return a, err
			}
		}
	}
	return nil, nil
}

// claim moves o to running as its next attempt (a compare-and-swap on its
// state and fence); nil when it was moved meanwhile.
//
// Once sent, the claim is not cut off by ctx (the scheduler stopping): the
// server may have committed it already, and the run would then be recorded
// running by an instance that never runs it. Its answer is awaited (within
// the lock's validity); a claim that lands after ctx ended is handed back
// by begin and finish, its job never called.
func (s *Scheduler) claim(ctx context.Context, h held, e *entry, st *stored, o openRun) (*attemptRun, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	var row store.ClaimRunsRow
	err := h.do(context.WithoutCancel(ctx), func(ctx context.Context, _ *store.Queries, g guard) error {
		var err error
		var res claimResult
		res, err = s.claims.do(ctx, claimCall{schedule: e.name, o: o, lease: st.def.Lease, g: g})
		if err == nil {
			row, err = res.row, res.err
		}
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: claim %s: %w", e.name, o.instant.Format(time.RFC3339Nano), err)
	}
	a := &attemptRun{
		run:      Run{Schedule: e.name, Instant: o.instant, Kind: row.Kind, Attempt: int(row.Attempt), Fence: *row.Fence, Holder: s.holder},
		max:      st.def.Retry.MaxAttempts,
		retry:    st.def.Retry,
		expected: st.def.ExpectedDuration,
		done:     make(chan struct{}),
	}
	a.lag = dur(row.LagUs)
	if row.Late && row.Attempt == 1 {
		a.late = a.lag
	}
	return a, nil
}

// claimCall is one runner's claim, batched with the others' (ClaimRuns):
// the run o of schedule, its lease, the schedule's lease g.
type claimCall struct {
	schedule string
	o        openRun
	lease    time.Duration
	g        guard
}

// claimMany claims the runs of calls in one statement; a call whose run was
// moved meanwhile (or whose schedule is paused) gets pgx.ErrNoRows.
func (s *Scheduler) claimMany(ctx context.Context, calls []claimCall) ([]claimResult, error) {
	p := store.ClaimRunsParams{Holder: s.holder, LeaseMode: s.locks.leases()}
	for _, c := range calls {
		var fence int64 // 0: never attempted
		if c.o.fence != nil {
			fence = *c.o.fence
		}
		p.Schedules = append(p.Schedules, c.schedule)
		p.Instants = append(p.Instants, ts(c.o.instant))
		p.States = append(p.States, c.o.state)
		p.Fences = append(p.Fences, fence)
		p.LeaseUs = append(p.LeaseUs, us(c.lease))
		p.LockNames = append(p.LockNames, c.g.name)
		p.LockFences = append(p.LockFences, c.g.fence)
	}
	rows, err := s.rc.ClaimRuns(ctx, p)
	if err != nil {
		return nil, err
	}
	got := make(map[runKey]store.ClaimRunsRow, len(rows))
	for _, r := range rows {
		got[keyOf(r.Schedule, tm(r.Instant))] = r
	}
	out := make([]claimResult, len(calls))
	for i, c := range calls {
		k := keyOf(c.schedule, c.o.instant)
		r, ok := got[k]
		if !ok {
			out[i].err = pgx.ErrNoRows
			continue
		}
		delete(got, k) // claimed once
		out[i].row = r
	}
	return out, nil
}

// runKey names a run in a batch's answer: its schedule and its instant in
// Unix microseconds (the database's precision; time.Time keys would also
// compare locations).
type runKey struct {
	schedule string
	instant  int64
}

func keyOf(schedule string, instant time.Time) runKey {
	return runKey{schedule, instant.UnixMicro()}
}

// claimResult is one call's answer: the run as claimed, or pgx.ErrNoRows.
type claimResult struct {
	row store.ClaimRunsRow
	err error
}

// begin starts a's job, and the keeper renewing its run's lease.
func (s *Scheduler) begin(ctx context.Context, e *entry, a *attemptRun, lease time.Duration) {
	jctx, cancel := context.WithCancelCause(ctx)
	a.cancel = cancel
	a.start = time.Now()
	run := a.run
	a.stopKeep = s.keep(ctx, "run's lease", run.Schedule, a.start, lease, func(ctx context.Context) error {
		return s.stmts(ctx, func(q *store.Queries) error {
			_, err := q.RenewRun(ctx, store.RenewRunParams{LeaseUs: us(lease), Schedule: run.Schedule, Instant: ts(run.Instant), Fence: run.Fence})
			return err
		})
	}, func(err error) {
		cancel(err)
		s.emit(ctx, Event{Kind: EventLost, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, Err: err})
	})
	s.emit(ctx, Event{Kind: EventStarted, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, State: stateRunning, Duration: a.lag})
	if a.late > 0 {
		s.emit(ctx, Event{Kind: EventLate, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, State: stateRunning,
			Duration: a.late, Reason: fmt.Sprintf("started %s after its instant", a.late.Round(time.Millisecond))})
	}
	if a.expected > 0 {
		a.overdueAt = a.start.Add(a.expected)
	}
	job := e.job
	go func() {
		defer close(a.done)
		if err := context.Cause(jctx); err != nil {
			a.err = err // claimed as the scheduler stopped: handed back unrun
			return
		}
		a.err = callJob(jctx, job, run)
	}()
}

// checkOverdue marks a's run overdue once it has run for its expected
// duration by database time, and reports it, once; it looks again later
// when the database says it is not yet, and stops looking once the attempt
// is no longer running.
func (s *Scheduler) checkOverdue(ctx context.Context, h held, a *attemptRun) {
	run := a.run
	var row store.MarkOverdueRow
	err := h.do(ctx, func(ctx context.Context, q *store.Queries, _ guard) error {
		var err error
		row, err = q.MarkOverdue(ctx, store.MarkOverdueParams{ExpectedUs: us(a.expected), Schedule: run.Schedule, Instant: ts(run.Instant), Fence: run.Fence})
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		a.overdueAt = time.Time{}
	case err != nil:
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "schedule: record overdue", "schedule", run.Schedule, "instant", run.Instant, "fence", run.Fence, "error", err)
		}
		a.overdueAt = time.Now().Add(max(a.expected/10, time.Second))
	case row.Marked:
		a.overdueAt = time.Time{}
		s.emit(ctx, Event{Kind: EventOverdue, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, State: stateRunning,
			Duration: a.expected, Reason: fmt.Sprintf("running longer than its expected duration of %s", a.expected)})
	default:
		a.overdueAt = time.Now().Add(max(dur(row.RemainingUs), time.Millisecond))
	}
}

// callJob calls job, turning a panic into an error.
func callJob(ctx context.Context, job Job, run Run) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("schedule: job panicked: %v", p)
		}
	}()
	return job(ctx, run)
}

// finish records the outcome of a's attempt, which has returned. While the
// schedule's lock is held, a write that fails for a reason that may pass (a
// deadline, a lost connection, a serialization failure) is tried again, so
// the lock is never released on a run still recorded running. lost is
// why the lock was lost meanwhile, if it was: then only a success is
// recorded (a compare-and-swap on the fence, refused if the run was taken
// over), and a failure is left for the next holder to take over. The
// outcome is written through the pool (the fence guards it), not on the
// lock's session, where a statement's deadline would end the lock.
func (s *Scheduler) finish(ctx context.Context, h held, a *attemptRun, lost error) (recorded string) {
	a.stopKeep()
	d := time.Since(a.start)
	run := a.run
	ev := Event{Kind: EventFinished, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, Duration: d, Err: a.err}
	if lost != nil && a.err != nil {
		if a.replaced {
			return "" // recorded skipped when it was replaced
		}
		s.emit(ctx, Event{Kind: EventLost, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder,
			Err: fmt.Errorf("%w; the attempt's error (%v) is left for the next holder", lost, a.err)})
		return ""
	}
	p := finishCall{schedule: run.Schedule, instant: run.Instant, fence: run.Fence}
	switch {
	case a.err == nil:
		p.state = stateSucceeded
	case ctx.Err() != nil:
		// Interrupted by this scheduler's shutdown: handed back at once.
		p.state, p.reason = stateRetrying, fmt.Sprintf("attempt %d interrupted: the scheduler stopped (%v)", run.Attempt, a.err)
	case run.Attempt < a.max:
		p.state, p.reason, p.retry = stateRetrying, truncate(a.err.Error()), a.retry.delay(run.Attempt)
	default:
		p.state, p.reason = stateFailed, truncate(fmt.Sprintf("attempt %d of %d: %v", run.Attempt, a.max, a.err))
	}
	var err error
	for try := 1; ; try++ {
		// Through the pool, guarded by the fence, never on the lock's own
		// session: a statement there that hits its deadline ends the
		// session, and with it the lock.
		rctx, cancel := lockcore.ReleaseContext(ctx)
		var ended bool
		if ended, err = s.finishes.do(rctx, p); err == nil && !ended {
			err = pgx.ErrNoRows
		}
		cancel()
		if err == nil || errors.Is(err, pgx.ErrNoRows) || !transient(err) || h == nil || lost != nil || h.cause() != nil {
			break
		}
		// The lock is still held, so no other instance can take the run
		// over: keep trying rather than release the lock while the run is
		// recorded running, which the next holder would run again.
		wait := min(50*time.Millisecond<<min(try, 6), 2*time.Second)
		s.log.WarnContext(ctx, "schedule: record outcome; retrying while the schedule's lock is held", "schedule", run.Schedule, "instant", run.Instant, "fence", run.Fence, "state", p.state, "try", try, "retry_in", wait, "error", err)
		select {
		case <-h.lost():
		case <-time.After(wait):
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		how := "taken over"
		if a.replaced {
			how = "replaced"
		}
		ev.Kind, ev.Err = EventLost, fmt.Errorf("%w: %q %s attempt %d (fence %d): the run was %s; its %s completion changed nothing",
			ErrLost, run.Schedule, run.Instant.Format(time.RFC3339Nano), run.Attempt, run.Fence, how, p.state)
	case err != nil:
		// Left running: once the lock is released the next holder takes
		// the run over as a dead one, attempt n+1.
		ev.Kind, ev.Err = EventLost, fmt.Errorf("%w: %q %s attempt %d (fence %d): its %s outcome could not be recorded (%w); the run will be taken over as a dead holder's",
			ErrLost, run.Schedule, run.Instant.Format(time.RFC3339Nano), run.Attempt, run.Fence, p.state, err)
	default:
		ev.State, ev.Reason = p.state, p.reason
		a.handBack = p.state == stateRetrying && ctx.Err() != nil
		recorded = p.state
	}
	s.emit(ctx, ev)
	return recorded
}

// finishGather is how long a batch of outcomes gathers: runs that came due
// together end at about the same time, not at once.
const finishGather = 5 * time.Millisecond

// finishCall is one attempt's outcome, batched with the others'
// (FinishRuns): the run, its fence, the state to record.
type finishCall struct {
	schedule string
	instant  time.Time
	fence    int64
	state    string
	reason   string
	retry    time.Duration // retrying: how long until the next attempt
}

// finishMany records the outcomes of calls in one statement; each output
// says whether that run was still running with that fence.
func (s *Scheduler) finishMany(ctx context.Context, calls []finishCall) ([]bool, error) {
	var p store.FinishRunsParams
	for _, c := range calls {
		p.Schedules = append(p.Schedules, c.schedule)
		p.Instants = append(p.Instants, ts(c.instant))
		p.Fences = append(p.Fences, c.fence)
		p.States = append(p.States, c.state)
		p.Reasons = append(p.Reasons, c.reason)
		p.RetryUs = append(p.RetryUs, us(c.retry))
	}
	rows, err := s.rc.FinishRuns(ctx, p)
	if err != nil {
		return nil, err
	}
	ended := make(map[runKey]bool, len(rows))
	for _, r := range rows {
		ended[keyOf(r.Schedule, tm(r.Instant))] = true
	}
	out := make([]bool, len(calls))
	for i, c := range calls {
		out[i] = ended[keyOf(c.schedule, c.instant)]
	}
	return out, nil
}

func truncate(s string) string {
	if len(s) > maxReason {
		return s[:maxReason]
	}
	return s
}

// minTime is the earlier of a and b, a zero time counting as none.
func minTime(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
