package schedule

// The runner of one schedule: while this instance holds the schedule's
// lock it records the instants that came due, decides them by the
// schedule's policies, runs one attempt at a time and records its outcome.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

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

// attend takes the schedule's lock and, holding it, does what is due. It
// returns when nothing is left to do now, with the next wake-up.
func (s *Scheduler) attend(ctx context.Context, e *entry) result {
	r := result{name: e.name}
	s.mu.Lock()
	st := e.st
	s.mu.Unlock()
	if st == nil {
		sent := time.Now()
		var err error
		if st, err = loadSchedule(ctx, s.q, e.name); err != nil {
			return s.retryLater(ctx, r, err)
		}
		s.observe(sent, st.dbNow)
		s.setStored(e, st)
	}
	h, err := s.locks.acquire(ctx, e.name, st.def.Lease)
	if err != nil {
		return s.retryLater(ctx, r, err)
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
	if r.handBack && !s.cfg.LeaseLocks {
		// The lock is free now: tell the other instances at once rather
		// than leave the attempt to their poll.
		nctx, cancel := lockcore.ReleaseContext(ctx)
		defer cancel()
		if err := s.stmts(nctx, func(q *store.Queries) error { return q.NotifySchedule(nctx, e.name) }); err != nil {
			s.log.WarnContext(ctx, "schedule: notify the hand-back (the poll will find it)", "schedule", e.name, "error", err)
		}
	}
	return r
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
		r.err = fmt.Errorf("schedule: %q: %w", r.name, pgerr.Explain(err))
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

// state reads the stored definition and the open runs of name, holding h.
func (s *Scheduler) state(ctx context.Context, h held, name string) (*stored, []openRun, error) {
	var st *stored
	var open []openRun
	sent := time.Now()
	err := h.do(ctx, func(ctx context.Context, q *store.Queries, _ guard) error {
		var err error
		if st, err = loadSchedule(ctx, q, name); err != nil {
			return err
		}
		rows, err := q.OpenRuns(ctx, store.OpenRunsParams{Schedule: name, PendingLimit: pendingRead})
		if err != nil {
			return fmt.Errorf("schedule: %q: read open runs: %w", name, err)
		}
		open = make([]openRun, 0, len(rows))
		for _, o := range rows {
			open = append(open, openRun{
				instant: tm(o.Instant), kind: o.Kind, state: o.State, attempt: int(o.Attempt), fence: o.Fence,
				holder: deref(o.Holder), leaseUntil: tm(o.LeaseUntil), nextAt: tm(o.NextAttemptAt), startAfter: tm(o.StartAfter), ready: o.Ready,
			})
		}
		return nil
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
	for {
		st, open, err := s.state(ctx, h, e.name)
		if err != nil {
			if cur != nil {
				// Keep the attempt; look again soon.
				st, open = nil, nil
			} else {
				return s.retryLater(ctx, r, err)
			}
		}
		var wake time.Time
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
			s.finish(ctx, h, cur, nil)
			cur = nil
		case <-h.lost():
			run := cur.run
			s.emit(ctx, Event{Kind: EventLost, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, Err: h.cause()})
			cur.cancel(h.cause())
			<-cur.done
			s.finish(ctx, h, cur, h.cause())
			cur = nil
			r.wake = s.dbNow() // look again at once: the next lock holder (perhaps this instance) takes over
			return r
		case <-e.poke:
		case <-timer.C:
		case <-ctx.Done():
			cur.cancel(context.Cause(ctx))
			<-cur.done
			s.finish(ctx, h, cur, nil)
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

// record records the scheduled instants that came due since the last one
// recorded, each decided by the catch-up and overlap policies, moves
// st.cursor past them, and returns the pending runs it wrote. busy names
// the run still in progress ("" if none); pending says a run already
// waits.
func (s *Scheduler) record(ctx context.Context, h held, st *stored, busy string, pending bool) ([]openRun, error) {
	d := st.def
	from := st.startsAt
	if st.cursor.After(from) {
		from = st.cursor
	}
	if st.prunedUntil.After(from) {
		from = st.prunedUntil // pruned instants are never recorded again
	}
	now := st.dbNow
	keep := 1
	if d.CatchUp == CatchUpAll {
		keep = d.CatchUpCap
	}
	paused := func(t time.Time) bool {
		return !st.pausedAt.IsZero() && !t.Before(st.pausedAt) && (st.resumedAt.IsZero() || !t.After(st.resumedAt))
	}
	why := func(t time.Time, what string) string {
		if paused(t) {
			return "paused: " + what
		}
		return "missed: " + what
	}
	var recs []rec
	var added []openRun
	flush := func() error {
		if len(recs) == 0 {
			return nil
		}
		if err := s.write(ctx, h, d.Name, recs); err != nil {
			return err
		}
		for _, r := range recs {
			if r.state == statePending {
				added = append(added, openRun{instant: r.instant, kind: kindScheduled, state: statePending,
					startAfter: r.startAfter, ready: !r.startAfter.After(now)})
			}
		}
		st.cursor = recs[len(recs)-1].instant
		recs = recs[:0]
		return nil
	}
	// Instants overtaken by at least keep later ones never run.
	var ring []time.Time
	for {
		batch, more := st.spec.between(from, now, recordChunk)
		ring = append(ring, batch...)
		if n := len(ring) - keep; n > 0 {
			for _, t := range ring[:n] {
				reason := why(t, "a later instant ran instead (catch-up latest)")
				switch d.CatchUp {
				case CatchUpNone:
					reason = why(t, "catch-up is none")
				case CatchUpAll:
					reason = why(t, fmt.Sprintf("beyond the catch-up cap of %d", d.CatchUpCap))
				}
				recs = append(recs, rec{instant: t, state: stateSkipped, missed: !paused(t), reason: reason})
			}
			ring = append(ring[:0], ring[n:]...)
			if err := flush(); err != nil {
				return added, err
			}
		}
		if !more {
			break
		}
		from = batch[len(batch)-1]
	}
	n := len(ring)
	current := n > 0 && now.Sub(ring[n-1]) <= s.cfg.Grace
	replacing := -1 // with overlap replace: the pending rec the next one replaces
	for i, t := range ring {
		late := !(i == n-1 && current)
		missed := late && !paused(t)
		run, reason := true, ""
		inWindow := d.CatchUpWindow == 0 || now.Sub(t) <= d.CatchUpWindow
		if late {
			switch d.CatchUp {
			case CatchUpNone:
				run, reason = false, why(t, "catch-up is none")
			case CatchUpLatest:
				switch {
				case i < n-1:
					run, reason = false, why(t, "a later instant ran instead (catch-up latest)")
				case !inWindow:
					run, reason = false, why(t, "older than the catch-up window of "+d.CatchUpWindow.String())
				}
			case CatchUpAll:
				if !inWindow {
					run, reason = false, why(t, "older than the catch-up window of "+d.CatchUpWindow.String())
				}
			}
		}
		if run && busy != "" {
			switch {
			case d.Overlap == OverlapSkip:
				run, reason = false, "overlap: "+busy
			case d.Overlap == OverlapBufferAll:
				// kept: runs after the ones before it
			case d.Overlap == OverlapBufferOne && pending:
				run, reason = false, "overlap: "+busy+" and a run is already buffered"
			case d.Overlap == OverlapReplace:
				if replacing >= 0 {
					recs[replacing].state, recs[replacing].reason = stateSkipped, "overlap: replaced by the run of "+t.Format(time.RFC3339Nano)
				}
				replacing = len(recs)
			}
		}
		if run {
			pending = true
			r := rec{instant: t, state: statePending, missed: missed}
			if delay := d.jitterDelay(t); delay > 0 {
				r.startAfter = t.Add(delay)
			}
			recs = append(recs, r)
		} else {
			recs = append(recs, rec{instant: t, state: stateSkipped, missed: missed, reason: reason})
		}
	}
	err := flush()
	return added, err
}

// mergeOpen adds the runs just recorded to open, keeping it oldest first.
func mergeOpen(open, added []openRun) []openRun {
	if len(added) == 0 {
		return open
	}
	out := append(open, added...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].instant.Before(out[j].instant) })
	return out
}

// rec is one instant to record.
type rec struct {
	instant    time.Time
	state      string
	missed     bool
	reason     string
	startAfter time.Time // a pending instant's jittered start; zero: at once
}

// write records recs and reports each.
func (s *Scheduler) write(ctx context.Context, h held, name string, recs []rec) error {
	p := store.RecordInstantsParams{Schedule: name, Kind: kindScheduled}
	for _, r := range recs {
		p.Instants = append(p.Instants, ts(r.instant))
		p.States = append(p.States, r.state)
		p.Missed = append(p.Missed, r.missed)
		p.Reasons = append(p.Reasons, r.reason)
		p.StartAfters = append(p.StartAfters, pgtype.Timestamptz{Time: r.startAfter, Valid: !r.startAfter.IsZero()})
	}
	err := h.do(ctx, func(ctx context.Context, q *store.Queries, g guard) error {
		p.LockName, p.LockFence = g.name, g.fence
		_, err := q.RecordInstants(ctx, p)
		return err
	})
	if err != nil {
		return fmt.Errorf("schedule: %q: record instants: %w", name, err)
	}
	var evs []Event
	for _, r := range recs {
		if r.missed {
			evs = append(evs, Event{Kind: EventMissed, Schedule: name, Instant: r.instant, RunKind: kindScheduled, Holder: s.holder, State: r.state, Reason: r.reason})
		}
		if r.state == stateSkipped {
			evs = append(evs, Event{Kind: EventSkipped, Schedule: name, Instant: r.instant, RunKind: kindScheduled, Holder: s.holder, State: r.state, Reason: r.reason})
		}
	}
	s.emitRecorded(ctx, evs)
	return nil
}

// replace applies overlap replace for the instant by, just recorded: the
// runs of open still running or retrying (before by) are recorded skipped,
// naming by. The attempt cur, when among them, is cancelled (its cause
// wraps ErrLost) and left to end on its own: its completion changes
// nothing, and Run waits for it before returning. It returns the attempt
// still current (nil once cur was replaced) and open without the replaced
// runs. A failure is logged; the new instant then waits its turn.
func (s *Scheduler) replace(ctx context.Context, h held, e *entry, open []openRun, by time.Time, cur *attemptRun) (*attemptRun, []openRun) {
	reason := "overlap: replaced by the run of " + by.Format(time.RFC3339Nano)
	p := store.ReplaceRunsParams{Schedule: e.name, Reason: reason}
	for _, o := range open {
		if (o.state == stateRunning || o.state == stateRetrying) && o.fence != nil && o.instant.Before(by) {
			p.Instants = append(p.Instants, ts(o.instant))
			p.Fences = append(p.Fences, *o.fence)
			p.States = append(p.States, o.state)
		}
	}
	if len(p.Instants) == 0 {
		return cur, open
	}
	var got []pgtype.Timestamptz
	err := h.do(ctx, func(ctx context.Context, q *store.Queries, g guard) error {
		p.LockName, p.LockFence = g.name, g.fence
		var err error
		got, err = q.ReplaceRuns(ctx, p)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "schedule: replace the running run (overlap replace)", "schedule", e.name, "error", err)
		}
		return cur, open
	}
	replaced := make(map[time.Time]bool, len(got))
	for _, t := range got {
		replaced[tm(t)] = true
	}
	kept := make([]openRun, 0, len(open))
	for _, o := range open {
		if !replaced[o.instant] {
			kept = append(kept, o)
			continue
		}
		s.emit(ctx, Event{Kind: EventSkipped, Schedule: e.name, Instant: o.instant, RunKind: o.kind, Attempt: o.attempt, Fence: *o.fence, Holder: s.holder, State: stateSkipped, Reason: reason})
	}
	if cur != nil && replaced[cur.run.Instant] {
		run := cur.run
		cause := fmt.Errorf("%w: %q %s attempt %d (fence %d): %s", ErrLost, run.Schedule, run.Instant.Format(time.RFC3339Nano), run.Attempt, run.Fence, reason)
		cur.replaced = true
		cur.cancel(cause)
		cur.stopKeep()
		s.zombies.Add(1)
		go func(a *attemptRun) {
			defer s.zombies.Done()
			<-a.done
			s.finish(ctx, nil, a, cause)
		}(cur)
		cur = nil
	}
	return cur, kept
}

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
	var row store.ClaimRunRow
	err := h.do(context.WithoutCancel(ctx), func(ctx context.Context, q *store.Queries, g guard) error {
		var err error
		row, err = q.ClaimRun(ctx, store.ClaimRunParams{
			Holder: s.holder, LeaseUs: us(st.def.Lease), Schedule: e.name, Instant: ts(o.instant),
			State: o.state, Fence: o.fence, LeaseMode: s.locks.leases(), LockName: g.name, LockFence: g.fence,
		})
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
func (s *Scheduler) finish(ctx context.Context, h held, a *attemptRun, lost error) {
	a.stopKeep()
	d := time.Since(a.start)
	run := a.run
	ev := Event{Kind: EventFinished, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder, Duration: d, Err: a.err}
	if lost != nil && a.err != nil {
		if a.replaced {
			return // recorded skipped when it was replaced
		}
		s.emit(ctx, Event{Kind: EventLost, Schedule: run.Schedule, Instant: run.Instant, RunKind: run.Kind, Attempt: run.Attempt, Fence: run.Fence, Holder: s.holder,
			Err: fmt.Errorf("%w; the attempt's error (%v) is left for the next holder", lost, a.err)})
		return
	}
	p := store.FinishRunParams{Schedule: run.Schedule, Instant: ts(run.Instant), Fence: run.Fence}
	switch {
	case a.err == nil:
		p.State = stateSucceeded
	case ctx.Err() != nil:
		// Interrupted by this scheduler's shutdown: handed back at once.
		p.State, p.Reason = stateRetrying, fmt.Sprintf("attempt %d interrupted: the scheduler stopped (%v)", run.Attempt, a.err)
	case run.Attempt < a.max:
		p.State, p.Reason, p.RetryUs = stateRetrying, truncate(a.err.Error()), us(a.retry.delay(run.Attempt))
	default:
		p.State, p.Reason = stateFailed, truncate(fmt.Sprintf("attempt %d of %d: %v", run.Attempt, a.max, a.err))
	}
	write := func(ctx context.Context, q *store.Queries) error {
		_, err := q.FinishRun(ctx, p)
		return err
	}
	var err error
	for try := 1; ; try++ {
		// Through the pool, guarded by the fence, never on the lock's own
		// session: a statement there that hits its deadline ends the
		// session, and with it the lock.
		rctx, cancel := lockcore.ReleaseContext(ctx)
		err = s.stmts(rctx, func(q *store.Queries) error { return write(rctx, q) })
		cancel()
		if err == nil || errors.Is(err, pgx.ErrNoRows) || !transient(err) || h == nil || lost != nil || h.cause() != nil {
			break
		}
		// The lock is still held, so no other instance can take the run
		// over: keep trying rather than release the lock while the run is
		// recorded running, which the next holder would run again.
		wait := min(50*time.Millisecond<<min(try, 6), 2*time.Second)
		s.log.WarnContext(ctx, "schedule: record outcome; retrying while the schedule's lock is held", "schedule", run.Schedule, "instant", run.Instant, "fence", run.Fence, "state", p.State, "try", try, "retry_in", wait, "error", err)
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
			ErrLost, run.Schedule, run.Instant.Format(time.RFC3339Nano), run.Attempt, run.Fence, how, p.State)
	case err != nil:
		// Left running: once the lock is released the next holder takes
		// the run over as a dead one, attempt n+1.
		ev.Kind, ev.Err = EventLost, fmt.Errorf("%w: %q %s attempt %d (fence %d): its %s outcome could not be recorded (%w); the run will be taken over as a dead holder's",
			ErrLost, run.Schedule, run.Instant.Format(time.RFC3339Nano), run.Attempt, run.Fence, p.State, err)
	default:
		ev.State, ev.Reason = p.State, p.Reason
		a.handBack = p.State == stateRetrying && ctx.Err() != nil
	}
	s.emit(ctx, ev)
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
