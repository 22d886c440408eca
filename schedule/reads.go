package schedule

// Batched reads: when many schedules come due at one instant, the runners
// that took their locks together read their state (the stored definition
// and the open runs) in one pair of statements for all of them, instead of
// a pair each queued for the pool. A read waits only for the pair in
// flight, if any, and then goes with every read that came meanwhile.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/store"
)

// readBatchWait bounds a batch's statements when no caller has a deadline.
const readBatchWait = 30 * time.Second

// reads holds the state reads waiting for the next batch.
type reads struct {
	mu      sync.Mutex
	calls   []*readCall
	reading bool // a goroutine is sending batches
}

type readCall struct {
	ctx  context.Context
	name string
	res  chan readResult
}

type readResult struct {
	st   *stored
	open []openRun
	err  error
}

// readState reads the stored definition and the open runs of name, in one
// batch with the reads of every other runner of this scheduler meanwhile.
// It returns when the batch answered or ctx ended.
func (s *Scheduler) readState(ctx context.Context, name string) (*stored, []openRun, error) {
	c := &readCall{ctx: ctx, name: name, res: make(chan readResult, 1)}
	r := &s.reads
	r.mu.Lock()
	r.calls = append(r.calls, c)
	if !r.reading {
		r.reading = true
		go s.readBatches()
	}
	r.mu.Unlock()
	select {
	case res := <-c.res:
		return res.st, res.open, res.err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// readBatches sends batches until no read is waiting.
func (s *Scheduler) readBatches() {
	r := &s.reads
	for {
		r.mu.Lock()
		calls := r.calls
		r.calls = nil
		if len(calls) == 0 {
			r.reading = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		s.readBatch(calls)
	}
}

// readBatch answers calls with one read of their schedules' definitions and
// one of their open runs. Calls whose context has ended are left out; the
// statements are bounded by the latest deadline among the others.
func (s *Scheduler) readBatch(calls []*readCall) {
	live := calls[:0]
	var names []string
	seen := map[string]bool{}
	deadline := time.Now().Add(readBatchWait)
	latest := time.Time{}
	for _, c := range calls {
		if c.ctx.Err() != nil {
			continue
		}
		live = append(live, c)
		if !seen[c.name] {
			seen[c.name] = true
			names = append(names, c.name)
		}
		if d, ok := c.ctx.Deadline(); ok && d.After(latest) {
			latest = d
		}
	}
	if len(live) == 0 {
		return
	}
	if !latest.IsZero() && latest.Before(deadline) {
		deadline = latest
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	states, open, err := s.readStates(ctx, names)
	for _, c := range live {
		switch st := states[c.name]; {
		case err != nil:
			c.res <- readResult{err: err}
		case st.err != nil:
			c.res <- readResult{err: st.err}
		default:
			c.res <- readResult{st: st.st, open: open[c.name]}
		}
	}
}

type storedOrErr struct {
	st  *stored
	err error
}

// readStates reads the definitions and open runs of names: a name without
// a stored definition maps to ErrNotFound, one whose definition does not
// parse here to that error.
func (s *Scheduler) readStates(ctx context.Context, names []string) (map[string]storedOrErr, map[string][]openRun, error) {
	defs, err := s.rc.SchedulesByName(ctx, names)
	if err != nil {
		return nil, nil, fmt.Errorf("schedule: read definitions: %w", schemaHint(err))
	}
	states := make(map[string]storedOrErr, len(names))
	for _, n := range names {
		states[n] = storedOrErr{err: fmt.Errorf("%w: %q", ErrNotFound, n)}
	}
	for _, d := range defs {
		st, err := storedOf(d)
		states[d.Name] = storedOrErr{st: st, err: err}
	}
	rows, err := s.rc.OpenRuns(ctx, store.OpenRunsParams{Schedules: names, PendingLimit: pendingRead})
	if err != nil {
		return nil, nil, fmt.Errorf("schedule: read open runs: %w", err)
	}
	open := make(map[string][]openRun, len(names))
	for _, o := range rows {
		open[o.Schedule] = append(open[o.Schedule], openRun{
			instant: tm(o.Instant), kind: o.Kind, state: o.State, attempt: int(o.Attempt), fence: o.Fence,
			holder: deref(o.Holder), leaseUntil: tm(o.LeaseUntil), nextAt: tm(o.NextAttemptAt), startAfter: tm(o.StartAfter), ready: o.Ready,
		})
	}
	return states, open, nil
}
