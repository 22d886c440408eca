package schedule

// The runner of one schedule: while this instance holds the schedule's
// lock it records the instants that came due, decides them by the
// schedule's policies, runs one attempt at a time and records its outcome.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// Run states, as stored in pgclaim_schedule_runs.state.
const (
	statePending   = "pending"
	stateRunning   = "running"
	stateRetrying  = "retrying"
	stateSucceeded = "succeeded"
	stateFailed    = "failed"
	stateSkipped   = "skipped"

	kindScheduled = "scheduled"
	kindTriggered = "triggered"
	kindBackfill  = "backfill"
)

// recordChunk is how many instants one statement records.
const recordChunk = 512

// pendingRead is how many of a schedule's oldest pending runs one pass of
// its runner reads (with every running and retrying run, and the oldest
// pending run that can start now, wherever it is): a backlog of thousands
// (a catch-up, a backfill) costs each pass the same as a short one. A
// pending run further back whose jittered start comes before those read
// is started by the poll's kick, a poll interval later at most.
const pendingRead = 32

// maxReason bounds the error text recorded as a run's reason.
const maxReason = 2000

// openRun is an unfinished run as read.
type openRun struct {
	instant    time.Time
	kind       string
	state      string
	attempt    int
	fence      *int64
	holder     string
	leaseUntil time.Time
	nextAt     time.Time
	startAfter time.Time // a pending run's earliest start (jitter); zero: at once
	ready      bool
}

// attemptRun is an attempt running on this instance.
type attemptRun struct {
	run      Run
	max      int
	retry    RetryPolicy
	expected time.Duration // Definition.ExpectedDuration (0: none)
	replaced bool          // recorded skipped by overlap replace; its outcome is not recorded
	late     time.Duration // how late a late first attempt started (0: not late)
	lag      time.Duration // how long after its instant the attempt started (database time)
	cancel   context.CancelCauseFunc
	stopKeep func()
	// overdueAt is when (host clock) to check the attempt against its
	// expected duration; zero: no check left.
	overdueAt time.Time
	done      chan struct{}
	start     time.Time
	err       error
	handBack  bool // finish handed the attempt back at shutdown
}

// attend takes the schedule's lock (unless pre, taken for it already, is
// given) and, holding it, does what is due. It returns when nothing is
// left to do now, with the next wake-up.
func (s *Scheduler) attend(ctx context.Context, e *entry, pre held) result {
	r := result{name: e.name}
	s.mu.Lock()
	st := e.st
	s.mu.Unlock()
	if st == nil {
		sent := time.Now()
		var err error
		if st, err = loadSchedule(ctx, s.q, e.name); err != nil {
			if pre != nil {
				pre.release()
			}
			return s.retryLater(ctx, r, err)
		}
		s.observe(sent, st.dbNow)
		s.setStored(e, st)
	}
	h := pre
	if h == nil {
		var err error
		if h, err = s.locks.acquire(ctx, e.name, st.def.Lease); err != nil {
			return s.retryLater(ctx, r, err)
		}
	}
	if h == nil {
		// Another instance is the schedule's runner now and records what
		// comes due; look again at the next instant.
		if !st.paused {
			r.wake = st.spec.next(s.dbNow())
		}
		return r
	}
	r = func() result {
		defer h.release()
		return s.hold(ctx, e, h)
	}()
	if r.handBack {
		s.handedBack(ctx, e.name)
	}
	return r
}

// handedBack tells the other instances, once the schedule's lock is free,
// that an attempt was handed back, rather than leave it to their poll
// (with Config.LeaseLocks nothing listens: the poll finds it).
func (s *Scheduler) handedBack(ctx context.Context, name string) {
	if s.cfg.LeaseLocks {
		return
	}
	nctx, cancel := lockcore.ReleaseContext(ctx)
	defer cancel()
	if err := s.stmts(nctx, func(q *store.Queries) error { return q.NotifySchedule(nctx, name) }); err != nil {
		s.log.WarnContext(ctx, "schedule: notify the hand-back (the poll will find it)", "schedule", name, "error", err)
	}
}

func (s *Scheduler) setStored(e *entry, st *stored) {
	s.mu.Lock()
	e.st = st
	s.mu.Unlock()
}

// retryLater logs err and asks for another look after a poll interval; a
// missing privilege, which no retry cures, ends Run with it instead.
func (s *Scheduler) retryLater(ctx context.Context, r result, err error) result {
	if pgerr.Permanent(err) {
		r.err = fmt.Errorf("schedule: %q: %w", r.name, s.explain(ctx, err))
		return r
	}
	if s.reader(ctx, r.name, err) {
		r.readOnly = true
		r.wake = s.dbNow().Add(s.cfg.PollInterval)
		return r
	}
	if pgerr.Refused(err) {
		r.refused = true
		r.wake = s.dbNow().Add(s.refusals.backoff(ctx, s, r.name, err))
		return r
	}
	if ctx.Err() == nil {
		s.log.WarnContext(ctx, "schedule: attend", "schedule", r.name, "error", err)
	}
	r.wake = s.dbNow().Add(s.cfg.PollInterval)
	return r
}

// state reads the stored definition and the open runs of name, holding h
// (in one batch with the reads of this scheduler's other runners).
func (s *Scheduler) state(ctx context.Context, h held, name string) (*stored, []openRun, error) {
	var st *stored
	var open []openRun
	sent := time.Now()
	err := h.do(ctx, func(ctx context.Context, _ *store.Queries, _ guard) error {
		var err error
		st, open, err = s.readState(ctx, name)
		return err
	})
	if err == nil {
		s.observe(sent, st.dbNow)
	}
	return st, open, err
}

// hold is the runner's loop while this instance holds the lock h.
func (s *Scheduler) hold(ctx context.Context, e *entry, h held) result {
	r := result{name: e.name}
	var cur *attemptRun
	defer func() {
		if cur != nil {
			cur.cancel(context.Cause(ctx))
			<-cur.done
			s.finish(ctx, h, cur, h.cause())
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// The common path: the schedule as last read, its one due instant on
	// time, started in one statement with the other runners' (startdue.go).
	var st *stored
	var open []openRun
	fast := false
	s.mu.Lock()
	cached := e.st
	s.mu.Unlock()
	if at, prev, ok := s.dueNow(cached); ok {
		c := *cached
		a, err := s.startDue(ctx, h, e, &c, at, prev)
		if err != nil {
			return s.retryLater(ctx, r, err)
		}
		if a != nil {
			cur, st, fast = a, &c, true
			fence := a.run.Fence
			open = []openRun{{instant: at, kind: kindScheduled, state: stateRunning, attempt: a.run.Attempt, fence: &fence, holder: s.holder}}
			s.setStored(e, st)
		}
	}
	for {
		var wake time.Time
		clean := false // this pass read and recorded without error
		if fast {
			// Started by the common path: recorded and claimed cleanly.
			fast, clean = false, true
			wake = s.nextWake(st, open, true)
		} else {
			var err error
			st, open, err = s.state(ctx, h, e.name)
			if err != nil {
				if cur != nil {
					// Keep the attempt; look again soon.
					st, open = nil, nil
				} else {
					return s.retryLater(ctx, r, err)
				}
			}
			if st != nil && cur == nil && (st.paused || (len(open) == 0 && !due(st))) {
				// Nothing to write: another instance ran what was due (or the
				// schedule is paused). The lock goes back without its lease
				// having been seized.
				r.wake = s.nextWake(st, open, false)
				s.setStored(e, st)
				return r
			}
			if st != nil {
				if err := h.seize(ctx); err != nil {
					return s.retryLater(ctx, r, err)
				}
			}
			if st != nil {
				// What this pass writes is added to st and open as it is
				// written, so the pass reads the database once.
				s.setStored(e, st)
				busy, pending := "", false
				for _, o := range open {
					switch o.state {
					case stateRunning, stateRetrying:
						if busy == "" {
							busy = fmt.Sprintf("the run of %s is still %s", o.instant.Format(time.RFC3339Nano), o.state)
						}
					case statePending:
						pending = true
					}
				}
				var recErr error
				if !st.paused {
					added, err := s.record(ctx, h, st, busy, pending)
					recErr = err
					open = mergeOpen(open, added)
					if st.def.Overlap == OverlapReplace && busy != "" && len(added) > 0 {
						cur, open = s.replace(ctx, h, e, open, added[len(added)-1].instant, cur)
					}
				}
				if cur == nil && !st.paused {
					// Even when recording failed (a slow database): a dead
					// holder's run, a retry or a pending run already read
					// starts now rather than a poll later.
					started, err := s.startNext(ctx, h, e, st, open)
					if err != nil {
						return s.retryLater(ctx, r, errors.Join(recErr, err))
					}
					cur = started
				}
				wake = s.nextWake(st, open, cur != nil)
				clean = recErr == nil
				if recErr != nil {
					if cur == nil {
						return s.retryLater(ctx, r, recErr)
					}
					// The attempt runs; the instants are recorded on the next
					// pass, a poll from now at the latest.
					s.log.WarnContext(ctx, "schedule: attend", "schedule", e.name, "error", recErr)
					wake = minTime(wake, s.dbNow().Add(s.cfg.PollInterval))
				}
			} else {
				wake = s.dbNow().Add(s.cfg.PollInterval)
			}
		}
		if cur == nil {
			r.wake = wake
			return r
		}
		d := time.Hour
		if !wake.IsZero() {
			d = max(wake.Sub(s.dbNow()), time.Millisecond)
		}
		if !cur.overdueAt.IsZero() {
			d = min(d, max(time.Until(cur.overdueAt), time.Millisecond))
		}
		timer.Reset(d)
		select {
		case <-cur.done:
			run := cur.run
			recorded := s.finish(ctx, h, cur, nil)
			cur = nil
			if w, ok := s.settled(st, open, clean, run, recorded); ok {
				// Nothing else was open and nothing has come due since:
				// no need to read the schedule again before letting go.
				r.wake = w
				return r
			}
		case <-h.lost():
			s.lostLock(ctx, h, cur)
			cur = nil
			r.wake = s.dbNow() // look again at once: the next lock holder (perhaps this instance) takes over
			return r
		case <-e.poke:
		case <-timer.C:
		case <-ctx.Done():
			s.stopped(ctx, h, cur)
			r.handBack = cur.handBack
			cur = nil
			return r
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if cur != nil && !cur.overdueAt.IsZero() && !time.Now().Before(cur.overdueAt) {
			s.checkOverdue(ctx, h, cur)
		}
	}
}

// settled reports whether, after the attempt of run ended recorded as
// recorded, the schedule needs no further look now, and its next wake-up:
// the pass that started the attempt read and recorded cleanly, the run
// ended (succeeded or failed, not to be retried), no other run of the
// schedule was open, and its next instant is still to come. A trigger,
// backfill, pause or new version meanwhile reaches the runner by
// notification or poll, which attends the schedule again.
func (s *Scheduler) settled(st *stored, open []openRun, clean bool, run Run, recorded string) (time.Time, bool) {
	if st == nil || !clean || (recorded != stateSucceeded && recorded != stateFailed) {
		return time.Time{}, false
	}
	for _, o := range open {
		if !o.instant.Equal(run.Instant) {
			return time.Time{}, false
		}
	}
	w := s.nextWake(st, nil, false)
	if w.IsZero() || !w.After(s.dbNow()) {
		return time.Time{}, false
	}
	return w, true
}

// due reports whether an instant of st's schedule has come due that its
// ledger may lack: one after the last recorded (and after the start and
// what retention deleted), up to the database time st was read at.
func due(st *stored) bool {
	from := st.startsAt
	if st.cursor.After(from) {
		from = st.cursor
	}
	if st.prunedUntil.After(from) {
		from = st.prunedUntil
	}
	ins, _ := st.spec.between(from, st.dbNow, 1)
	return len(ins) > 0
}

// lostLock ends the attempt a once the lock h it runs under is lost: it
// reports the loss, cancels the job, waits for it and records what may be
// recorded (see finish).
func (s *Scheduler) lostLock(ctx context.Context, h held, a *attemptRun) {
	run := a.run
	s.emit(ctx, Event{Kind: EventLost, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, Err: h.cause()})
	a.cancel(h.cause())
	<-a.done
	s.finish(ctx, h, a, h.cause())
}

// stopped ends the attempt a when ctx has ended: it cancels the job,
// waits for it and hands the attempt back (see finish).
func (s *Scheduler) stopped(ctx context.Context, h held, a *attemptRun) {
	a.cancel(context.Cause(ctx))
	<-a.done
	s.finish(ctx, h, a, nil)
}

// nextWake is when the runner should look at the schedule again: its next
// instant, the next retry, or (with leases) a dead holder's lease expiry.
func (s *Scheduler) nextWake(st *stored, open []openRun, running bool) time.Time {
	var w time.Time
	at := func(t time.Time) {
		if !t.IsZero() && (w.IsZero() || t.Before(w)) {
			w = t
		}
	}
	if st.paused {
		return w
	}
	from := st.dbNow
	if st.cursor.After(from) {
		from = st.cursor
	}
	at(st.spec.next(from))
	for _, o := range open {
		switch {
		case o.state == stateRetrying:
			at(o.nextAt)
		case o.state == stateRunning && !running:
			at(o.leaseUntil)
		case o.state == statePending && !o.ready:
			at(o.startAfter)
		}
	}
	return w
}
