package schedule

// The common path of an instant: a schedule whose lock this instance has
// just taken, as it was when last read, with one instant due and on time.
// Its lease is seized, the instant recorded and its first attempt started
// in one statement (StartDue) for every runner of the moment, where the
// usual pass reads the state, seizes, records and claims in four. Whatever
// the statement finds changed — a new version, a pause, a run still open,
// an instant recorded meanwhile — it leaves to the usual pass, which reads
// the state and decides by the policies.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgclaim/pgclaim/store"
)

// dueNow returns the one instant of st's schedule due now and still on
// time, when the common path may start it, and the instant before it
// that must be the newest recorded (zero: none may be): not paused, no
// jitter. st may be older than the last run (another instance ran the
// schedule since): the instants since st's last recorded one, but the
// newest, must then have been recorded, which StartDue checks. ok false:
// the usual pass.
func (s *Scheduler) dueNow(st *stored) (at, prev time.Time, ok bool) {
	if st == nil || st.paused || st.def.Jitter > 0 {
		return time.Time{}, time.Time{}, false
	}
	from := st.startsAt
	if st.cursor.After(from) {
		from = st.cursor
	}
	if st.prunedUntil.After(from) {
		from = st.prunedUntil
	}
	now := s.dbNow()
	ins, more := st.spec.between(from, now, dueNowRead)
	if len(ins) == 0 || more || now.Sub(ins[len(ins)-1]) > s.cfg.Grace {
		return time.Time{}, time.Time{}, false
	}
	if len(ins) == 1 {
		return ins[0], st.cursor, true
	}
	return ins[len(ins)-1], ins[len(ins)-2], true
}

// startGather is how long a batch of the common path's starts gathers
// while they come many at a time: the runners of one share-out start
// together, not at once.
const startGather = time.Millisecond

// startExpect bounds how long the starts of one share-out wait for each
// other (batcher.expect), should one of them not come.
const startExpect = 10 * time.Millisecond

// earlyWait is how early a start may come and still wait for its instant
// on the common path.
const earlyWait = 50 * time.Millisecond

// dueNowRead bounds how many instants behind its last read a schedule's
// state may be for the common path (each instance reads only the
// schedules it ran: the others' runs are not in its state).
const dueNowRead = 64

// startDue tries the common path for the schedule of e, whose lock h was
// just taken: it seizes h's lease and, when the newest instant recorded
// is still prev (and st's version and pause hold), records the instant
// at and starts its first attempt. It returns the attempt begun,
// or nil when the usual pass must decide (h's lease is seized either way).
func (s *Scheduler) startDue(ctx context.Context, h held, e *entry, st *stored, at, prev time.Time) (*attemptRun, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	var res startResult
	for try := 0; ; try++ {
		sent := time.Now()
		// Not cut off by ctx once sent, as a claim is not (see claim).
		err := h.do(context.WithoutCancel(ctx), func(ctx context.Context, _ *store.Queries, g guard) error {
			var err error
			res, err = s.starts.do(ctx, startCall{schedule: e.name, instant: at, prev: prev, st: st, grace: s.cfg.Grace, g: g})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("schedule: %q: start %s: %w", e.name, at.Format(time.RFC3339Nano), err)
		}
		if err := h.seized(ctx, res.leaseFence, sent); err != nil {
			return nil, err
		}
		// A wake-up a little ahead of the database's clock (the offset
		// is an estimate) waits for the instant and tries once more,
		// rather than go the usual way for a few milliseconds.
		if res.started || try > 0 || res.early <= 0 || res.early > earlyWait {
			break
		}
		select {
		case <-time.After(res.early + time.Millisecond):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	if !res.started {
		return nil, nil
	}
	st.cursor = at
	a := &attemptRun{
		run:      Run{Schedule: e.name, Instant: at, Kind: kindScheduled, Attempt: res.attempt, Fence: res.fence, Holder: s.holder},
		max:      st.def.Retry.MaxAttempts,
		retry:    st.def.Retry,
		expected: st.def.ExpectedDuration,
		lag:      res.lag,
		done:     make(chan struct{}),
	}
	if res.late {
		a.late = a.lag
	}
	s.begin(ctx, e, a, st.def.Lease)
	return a, nil
}

// startCall is one runner's common path, batched with the others'
// (StartDue): the schedule, its due instant, its state as last read, the
// schedule's lock g (fence 0: a session lock whose lease is to be seized).
type startCall struct {
	schedule string
	instant  time.Time
	prev     time.Time // the newest instant recorded before it (zero: none)
	st       *stored
	grace    time.Duration
	g        guard
}

// startResult is one call's answer: the lease's fence (a session lock's,
// seized), and the attempt started, if one was.
type startResult struct {
	leaseFence int64
	started    bool
	attempt    int
	fence      int64
	late       bool
	lag        time.Duration
	early      time.Duration // how long before the instant the statement came
}

// startMany runs the common path of calls in one statement.
func (s *Scheduler) startMany(ctx context.Context, calls []startCall) ([]startResult, error) {
	p := store.StartDueParams{Holder: s.holder}
	for _, c := range calls {
		p.Schedules = append(p.Schedules, c.schedule)
		p.Instants = append(p.Instants, ts(c.instant))
		p.Versions = append(p.Versions, int32(c.st.def.Version))
		p.Cursors = append(p.Cursors, pgtype.Timestamptz{Time: c.prev, Valid: !c.prev.IsZero()})
		p.LeaseUs = append(p.LeaseUs, us(c.st.def.Lease))
		p.GraceUs = append(p.GraceUs, us(c.grace))
		p.LockNames = append(p.LockNames, c.g.name)
		p.LockFences = append(p.LockFences, c.g.fence)
	}
	rows, err := s.rc.StartDue(ctx, p)
	if err != nil {
		return nil, err
	}
	got := make(map[string]store.StartDueRow, len(rows))
	for _, r := range rows {
		got[r.Schedule] = r
	}
	out := make([]startResult, len(calls))
	for i, c := range calls {
		r, ok := got[c.schedule]
		if !ok {
			continue
		}
		delete(got, c.schedule) // a schedule twice in a batch (never): once
		out[i].leaseFence, out[i].early = r.LeaseFence, dur(r.EarlyUs)
		if r.Started && r.Attempt != nil && r.Fence != nil {
			out[i].started, out[i].attempt, out[i].fence = true, int(*r.Attempt), *r.Fence
			out[i].late = r.Late != nil && *r.Late
			if r.LagUs != nil {
				out[i].lag = dur(*r.LagUs)
			}
		}
	}
	return out, nil
}
