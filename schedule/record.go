package schedule

// Recording: the instants that came due, decided by the catch-up and
// overlap policies, written as rows of pgclaim_schedule_runs.

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgclaim/pgclaim/store"
)

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
	// What was recorded is reported once, however many statements it took:
	// one log line for a long downtime's instants (each at debug level).
	var recorded []Event
	defer func() { s.emitRecorded(ctx, recorded) }()
	flush := func() error {
		if len(recs) == 0 {
			return nil
		}
		_, evs, err := s.write(ctx, h, d.Name, recs)
		if err != nil {
			return err
		}
		recorded = append(recorded, evs...)
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

// write records recs and returns how many rows it inserted (an instant
// already in the ledger is left as it is; nothing is recorded while the
// schedule is paused) and the events to report for recs.
func (s *Scheduler) write(ctx context.Context, h held, name string, recs []rec) (int64, []Event, error) {
	var n int64
	err := h.do(ctx, func(ctx context.Context, _ *store.Queries, g guard) error {
		var err error
		n, err = s.records.do(ctx, recordCall{schedule: name, g: g, recs: recs})
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("schedule: %q: record instants: %w", name, err)
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
	return n, evs, nil
}

// recordCall is one runner's instants to record, batched with the others'
// (RecordInstants over many schedules): the schedule, its lease, the rows.
type recordCall struct {
	schedule string
	g        guard
	recs     []rec
}

// recordMany records the instants of calls in one statement and returns
// how many rows each call inserted.
func (s *Scheduler) recordMany(ctx context.Context, calls []recordCall) ([]int64, error) {
	p := store.RecordInstantsParams{Kind: kindScheduled}
	for _, c := range calls {
		for _, r := range c.recs {
			p.Schedules = append(p.Schedules, c.schedule)
			p.Instants = append(p.Instants, ts(r.instant))
			p.States = append(p.States, r.state)
			p.Missed = append(p.Missed, r.missed)
			p.Reasons = append(p.Reasons, r.reason)
			p.StartAfters = append(p.StartAfters, pgtype.Timestamptz{Time: r.startAfter, Valid: !r.startAfter.IsZero()})
			p.LockNames = append(p.LockNames, c.g.name)
			p.LockFences = append(p.LockFences, c.g.fence)
		}
	}
	inserted, err := s.rc.RecordInstants(ctx, p)
	if err != nil {
		return nil, err
	}
	per := make(map[string]int64, len(calls))
	for _, name := range inserted {
		per[name]++
	}
	out := make([]int64, len(calls))
	for i, c := range calls {
		out[i] = per[c.schedule]
		per[c.schedule] = 0 // a schedule twice in a batch: counted once
	}
	return out, nil
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
