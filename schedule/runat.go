package schedule

// Running one instant on demand (RunAt) and waiting for a run's end
// (WaitRun), for tests of a service's schedules: through the ledger, the
// schedule's lock, the fences and the policies the scheduler itself uses.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/store"
)

// Bounds of how often RunAt and WaitRun read the ledger (or try the
// schedule's lock) while they wait: the first look again after
// waitFirst, doubling up to waitMax.
const (
	waitFirst = 5 * time.Millisecond
	waitMax   = 200 * time.Millisecond
)

// RunAt runs the schedule name's instant now, as the scheduler would have
// run it at that instant, and returns its run as the ledger records it: a
// test runs "the 09:00 job" without waiting for 09:00. instant must be an
// instant of the stored spec in its time zone (Run.Instant is it, in UTC);
// the job is the one Register gave this Scheduler for name.
//
// The run takes the production path: holding the schedule's lock, RunAt
// records instant in pgclaim_schedule_runs as a pending run of kind
// "scheduled", claims it (a fresh fence), calls the job with the Run it
// would get at that instant, and records the outcome with the fence. A
// failed attempt is retried by the schedule's RetryPolicy, after its
// back-off, until the run succeeds or fails: RunAt returns once the run
// has ended (give a test's definition a short Backoff). Between attempts
// the lock is free, so a scheduler running meanwhile (Run, in this or
// another instance) may run the next attempt; RunAt then waits for it.
// Hooks and the logger hear of every attempt, as for any run. Jitter does
// not delay the run; a run of an instant more than the definition's
// LateAfter in the past is recorded late, as a catch-up run would be. A
// future instant, once run, is left alone by the scheduler when it comes
// due (it is in the ledger), and the instants before it are recorded as
// usual.
//
// The error is nil when the run succeeded. Otherwise, with the record as
// it stands:
//
//   - an instant already in the ledger (whatever its kind or state): an
//     error wrapping ErrRecorded, and nothing runs — calling RunAt twice for
//     one instant, or from two instances at once, runs the job once (use
//     WaitRun to wait for a run in progress); so does an instant at or
//     before the newest one Prune deleted (with a zero RunRecord), whose
//     record may have been pruned;
//   - the run failed (after its attempts) or was skipped (a scheduler's
//     overlap policy replaced it): an error with its reason;
//   - the schedule is paused, or is paused between attempts: an error
//     wrapping ErrPaused (a run waiting for its retry then runs at Resume);
//   - ctx ends: context.Cause(ctx); an attempt running then is cancelled
//     and handed back as a retry, as at a scheduler's shutdown.
//
// An instant that is not one of the spec's returns an error wrapping
// ErrInvalid that names "instant" and the spec's instants just before and
// after it. Unknown name: ErrNotFound; a name stored but not registered
// with this Scheduler: ErrInvalid.
//
// RunAt is meant for tests (in production, Trigger asks for a run now):
// while it runs an attempt it holds the schedule's lock, as a runner does,
// so instants coming due meanwhile are recorded once it has finished, by
// the overlap and catch-up policies.
func (s *Scheduler) RunAt(ctx context.Context, name string, instant time.Time) (RunRecord, error) {
	var none RunRecord
	if name == "" {
		return none, invalid("name", "must not be empty")
	}
	if instant.IsZero() {
		return none, invalid("instant", "must not be zero")
	}
	st, err := loadSchedule(ctx, s.q, name)
	if err != nil {
		return none, err
	}
	s.mu.Lock()
	e := s.entries[name]
	s.mu.Unlock()
	if e == nil {
		return none, invalid("name", fmt.Sprintf("%q is stored but not registered with this Scheduler: RunAt runs the job Register gives it", name))
	}
	if err := isInstant(st, instant); err != nil {
		return none, err
	}
	instant = instant.UTC()
	if r, err := s.readRun(ctx, s.q, name, instant); err != nil || r != nil {
		return r.record(), s.recordedErr(name, instant, r, err)
	}
	if !instant.After(st.prunedUntil) {
		// Its record may have been pruned: running it could run it twice.
		return none, fmt.Errorf("%w: %q %s is at or before the newest instant Prune deleted (%s): it may have run, and RunAt runs nothing",
			ErrRecorded, name, instant.Format(time.RFC3339), st.prunedUntil.Format(time.RFC3339))
	}
	if st.paused {
		return none, pausedErr(name, st)
	}
	l := s.newLocker()
	defer l.close()
	recorded := false
	var r *ledgerRun // as last read
	for wait := waitFirst; ; wait = min(2*wait, waitMax) {
		if r == nil || r.open.ready {
			// Nothing recorded yet, or its next attempt can start: take
			// the lock, then record it or start the attempt and see it
			// end.
			h, err := l.acquire(ctx, name, st.def.Lease)
			if err != nil {
				return r.record(), err
			}
			if h != nil {
				r, err = s.runHeld(ctx, h, e, instant, &recorded)
			} else {
				r, err = s.readRun(ctx, s.q, name, instant) // another runner holds it
			}
			if err != nil {
				return r.record(), err
			}
		} else if r, err = s.readRun(ctx, s.q, name, instant); err != nil {
			return r.record(), err
		}
		if r != nil {
			if !recorded {
				return r.record(), s.recordedErr(name, instant, r, nil)
			}
			if r.finished() {
				return r.record(), r.outcome(name)
			}
			if r.paused && r.open.ready {
				return r.record(), pausedErr(name, r.pause)
			}
		}
		if err := sleep(ctx, min(wait, r.untilReady())); err != nil {
			return r.record(), err
		}
	}
}

// runHeld does RunAt's work while it holds the schedule's lock h, and
// releases it: it records instant if the ledger lacks it (recorded is set
// when this call did), or starts the run's next attempt if it can start
// (a retry whose time has come, a dead holder's run) and sees it end. It
// returns the run as it stands then; nil when nothing is recorded (an
// error says why: the schedule is paused).
func (s *Scheduler) runHeld(ctx context.Context, h held, e *entry, instant time.Time, recorded *bool) (*ledgerRun, error) {
	released := false
	release := func() {
		if !released {
			released = true
			h.release()
		}
	}
	defer release()
	if err := h.seize(ctx); err != nil {
		return nil, err
	}
	var st *stored
	var r *ledgerRun
	look := func() error {
		return h.do(ctx, func(ctx context.Context, q *store.Queries, _ guard) error {
			var err error
			if st, err = loadSchedule(ctx, q, e.name); err != nil {
				return err
			}
			r, err = s.readRun(ctx, q, e.name, instant)
			return err
		})
	}
	if err := look(); err != nil {
		return nil, err
	}
	if r == nil && !*recorded {
		if st.paused {
			return nil, pausedErr(e.name, st)
		}
		n, _, err := s.write(ctx, h, e.name, []rec{{instant: instant, state: statePending}})
		if err != nil {
			return nil, err
		}
		*recorded = n > 0
		if err := look(); err != nil {
			return nil, err
		}
		switch {
		case r != nil:
		case st.paused:
			return nil, pausedErr(e.name, st) // paused meanwhile: nothing recorded
		case h.cause() != nil:
			return nil, h.cause()
		default:
			return nil, fmt.Errorf("schedule: %q %s: recording the instant changed nothing", e.name, instant.Format(time.RFC3339))
		}
	}
	if r == nil {
		return nil, fmt.Errorf("schedule: %q %s: the run RunAt recorded is no longer in the ledger", e.name, instant.Format(time.RFC3339))
	}
	if !*recorded || r.finished() || st.paused {
		r.paused, r.pause = st.paused, st
		return r, nil
	}
	a, err := s.startNext(ctx, h, e, st, []openRun{r.open})
	if err != nil || a == nil {
		return r, err
	}
	s.await(ctx, h, a)
	release()
	if a.handBack {
		s.handedBack(ctx, e.name)
	}
	if ctx.Err() != nil {
		r, _ = s.readRun(context.WithoutCancel(ctx), s.q, e.name, instant)
		return r, context.Cause(ctx)
	}
	return s.readRun(ctx, s.q, e.name, instant)
}

// await waits for a's job to return, holding h, and records its outcome,
// as the runner does: a lost lock cancels the job, as does ctx's end (the
// attempt is then handed back), and an attempt past its expected duration
// is marked overdue.
func (s *Scheduler) await(ctx context.Context, h held, a *attemptRun) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if !a.overdueAt.IsZero() {
			timer.Reset(max(time.Until(a.overdueAt), time.Millisecond))
		}
		select {
		case <-a.done:
			s.finish(ctx, h, a, nil)
			return
		case <-h.lost():
			s.lostLock(ctx, h, a)
			return
		case <-ctx.Done():
			s.stopped(ctx, h, a)
			return
		case <-timer.C:
			s.checkOverdue(ctx, h, a)
		}
	}
}

// WaitRun waits until the run of the schedule name at instant has ended
// (succeeded, failed or skipped) and returns it as the ledger records it:
// a test whose service runs its scheduler waits for "the 09:00 run" (or
// for the run Trigger returned the instant of) rather than sleep. A run
// not recorded yet is waited for: a scheduler records each instant as it
// comes due. The error is nil when the run succeeded; a failed or skipped
// run returns an error with its reason. When ctx ends first, WaitRun
// returns the run as last read (the zero RunRecord if none) and
// context.Cause(ctx).
//
// An instant the ledger lacks that is not an instant of the stored spec
// returns an error wrapping ErrInvalid naming "instant" (nothing would
// ever record it), as does one at or before the start of the definition's
// life or the newest instant Prune deleted. Unknown name: ErrNotFound.
func (s *Scheduler) WaitRun(ctx context.Context, name string, instant time.Time) (RunRecord, error) {
	if name == "" {
		return RunRecord{}, invalid("name", "must not be empty")
	}
	if instant.IsZero() {
		return RunRecord{}, invalid("instant", "must not be zero")
	}
	instant = instant.UTC()
	checked := false
	for wait := waitFirst; ; wait = min(2*wait, waitMax) {
		r, err := s.readRun(ctx, s.q, name, instant)
		switch {
		case err != nil:
			return r.record(), err
		case r != nil && r.finished():
			return r.record(), r.outcome(name)
		case r == nil && !checked:
			st, err := loadSchedule(ctx, s.q, name)
			if err != nil {
				return RunRecord{}, err
			}
			if err := isInstant(st, instant); err != nil {
				return RunRecord{}, err
			}
			if !instant.After(st.startsAt) {
				return RunRecord{}, invalid("instant", fmt.Sprintf("%s is not after the start of the definition's life (%s): it is never due",
					instant.Format(time.RFC3339), st.startsAt.Format(time.RFC3339Nano)))
			}
			if !instant.After(st.prunedUntil) {
				return RunRecord{}, invalid("instant", fmt.Sprintf("%s is at or before the newest instant Prune deleted (%s): it is never recorded again",
					instant.Format(time.RFC3339), st.prunedUntil.Format(time.RFC3339)))
			}
			checked = true
		}
		if err := sleep(ctx, wait); err != nil {
			return r.record(), err
		}
	}
}

// ledgerRun is a run as RunAt and WaitRun read it.
type ledgerRun struct {
	rec   RunRecord
	open  openRun // what the runner reads of it
	dbNow time.Time
	// paused and pause: the schedule was paused when RunAt last looked.
	paused bool
	pause  *stored
}

// readRun reads the run of name at instant; nil when the ledger lacks it.
func (s *Scheduler) readRun(ctx context.Context, q *store.Queries, name string, instant time.Time) (*ledgerRun, error) {
	row, err := q.RunByInstant(ctx, store.RunByInstantParams{Schedule: name, Instant: ts(instant)})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: read the run of %s: %w", name, instant.Format(time.RFC3339), schemaHint(err))
	}
	return &ledgerRun{
		rec: runRecord(store.RecentRunsRow{
			Instant: row.Instant, Kind: row.Kind, State: row.State, Attempt: row.Attempt, Fence: row.Fence, Holder: row.Holder,
			Reason: row.Reason, Missed: row.Missed, Late: row.Late, Overdue: row.Overdue, StartedAt: row.StartedAt, FinishedAt: row.FinishedAt,
		}),
		open: openRun{
			instant: tm(row.Instant), kind: row.Kind, state: row.State, attempt: int(row.Attempt), fence: row.Fence,
			holder: deref(row.Holder), leaseUntil: tm(row.LeaseUntil), nextAt: tm(row.NextAttemptAt), startAfter: tm(row.StartAfter), ready: row.Ready,
		},
		dbNow: tm(row.DbNow),
	}, nil
}

// record is the run's record; the zero RunRecord for nil.
func (r *ledgerRun) record() RunRecord {
	if r == nil {
		return RunRecord{}
	}
	return r.rec
}

func (r *ledgerRun) finished() bool {
	switch r.rec.State {
	case stateSucceeded, stateFailed, stateSkipped:
		return true
	}
	return false
}

// outcome is nil for a succeeded run, and otherwise an error saying how
// the run ended.
func (r *ledgerRun) outcome(name string) error {
	if r.rec.State == stateSucceeded {
		return nil
	}
	return fmt.Errorf("schedule: %q %s: the %s run %s after %d attempt(s): %s",
		name, r.rec.Instant.Format(time.RFC3339), r.rec.Kind, r.rec.State, r.rec.Attempt, r.rec.Reason)
}

// untilReady is how long until a run waiting for its retry (or its
// delayed start) can start, by database time; waitMax for any other (or
// nil).
func (r *ledgerRun) untilReady() time.Duration {
	if r == nil {
		return waitMax
	}
	var at time.Time
	switch r.open.state {
	case stateRetrying:
		at = r.open.nextAt
	case statePending:
		at = r.open.startAfter
	}
	if at.IsZero() {
		return waitMax
	}
	return max(at.Sub(r.dbNow), 0)
}

// recordedErr is RunAt's error for an instant the ledger has already (or
// err, when reading it failed).
func (s *Scheduler) recordedErr(name string, instant time.Time, r *ledgerRun, err error) error {
	if err != nil || r == nil {
		return err
	}
	return fmt.Errorf("%w: %q %s is a %s run, %s (attempt %d): RunAt ran nothing",
		ErrRecorded, name, instant.Format(time.RFC3339), r.rec.Kind, r.rec.State, r.rec.Attempt)
}

func pausedErr(name string, st *stored) error {
	return fmt.Errorf("%w: %q was paused at %s by %q (%q): no attempt starts until Resume",
		ErrPaused, name, st.pausedAt.Format(time.RFC3339), st.pausedBy, st.pausedNote)
}

// isInstant returns nil when instant is an instant of st's spec, and
// otherwise an error naming "instant", with the spec's instants just
// before and after it.
func isInstant(st *stored, instant time.Time) error {
	next := st.spec.next(instant.Add(-time.Nanosecond))
	if next.Equal(instant) {
		return nil
	}
	show := func(t time.Time) string {
		if t.IsZero() {
			return "none within 5 years"
		}
		return t.In(st.spec.loc).Format(time.RFC3339) + " (" + t.UTC().Format(time.RFC3339) + ")"
	}
	return invalid("instant", fmt.Sprintf("%s is not an instant of %s: the nearest are %s before and %s after",
		instant.In(st.spec.loc).Format(time.RFC3339Nano), st.spec, show(st.spec.prev(instant)), show(next)))
}

// sleep waits d, or until ctx ends (then its cause).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
