package schedule

// Batched reads (batch.go): the runners that took their schedules' locks
// at one moment read the stored definitions and the open runs of all of
// them in one pair of statements.

import (
	"context"
	"fmt"

	"github.com/pgclaim/pgclaim/store"
)

// readResult is one schedule's state as read, or why it could not be.
type readResult struct {
	st   *stored
	open []openRun
	err  error
}

// readState reads the stored definition and the open runs of name, in one
// batch with the reads of every other runner of this scheduler meanwhile.
func (s *Scheduler) readState(ctx context.Context, name string) (*stored, []openRun, error) {
	r, err := s.reads.do(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return r.st, r.open, r.err
}

// readStates reads the definitions and open runs of names: a name without
// a stored definition gets ErrNotFound, one whose definition does not parse
// here that error.
func (s *Scheduler) readStates(ctx context.Context, names []string) ([]readResult, error) {
	uniq := make([]string, 0, len(names))
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			uniq = append(uniq, n)
		}
	}
	defs, err := s.rc.SchedulesByName(ctx, uniq)
	if err != nil {
		return nil, fmt.Errorf("schedule: read definitions: %w", schemaHint(err))
	}
	rows, err := s.rc.OpenRuns(ctx, store.OpenRunsParams{Schedules: uniq, PendingLimit: pendingRead})
	if err != nil {
		return nil, fmt.Errorf("schedule: read open runs: %w", err)
	}
	byName := make(map[string]readResult, len(uniq))
	for _, d := range defs {
		st, err := storedOf(d)
		byName[d.Name] = readResult{st: st, err: err}
	}
	open := make(map[string][]openRun, len(uniq))
	for _, o := range rows {
		open[o.Schedule] = append(open[o.Schedule], openRun{
			instant: tm(o.Instant), kind: o.Kind, state: o.State, attempt: int(o.Attempt), fence: o.Fence,
			holder: deref(o.Holder), leaseUntil: tm(o.LeaseUntil), nextAt: tm(o.NextAttemptAt), startAfter: tm(o.StartAfter), ready: o.Ready,
		})
	}
	out := make([]readResult, len(names))
	for i, n := range names {
		r, ok := byName[n]
		switch {
		case !ok:
			r.err = fmt.Errorf("%w: %q", ErrNotFound, n)
		case r.err == nil:
			r.open = open[n]
		}
		out[i] = r
	}
	return out, nil
}
