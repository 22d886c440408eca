package schedule

// Retention: a running Scheduler deletes the finished runs of the schedules
// registered with it once they are older than their retention, in small
// batches, each statement bounded in time, so that a schedule due every
// second does not grow its ledger forever.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// DefaultRetention is how long finished runs are kept when neither
// Config.Retention nor Definition.Retention says otherwise: long enough to
// look back over a week of history, short enough that a schedule due every
// second keeps about 600,000 rows.
const DefaultRetention = 7 * 24 * time.Hour

// KeepRuns, as Config.Retention or Definition.Retention, keeps every
// finished run: nothing is deleted but by Prune.
const KeepRuns time.Duration = -1

// retainBatch is the most runs one statement deletes.
const retainBatch = 1000

const (
	// retainStatement bounds each deleting statement.
	retainStatement = 5 * time.Second
	// retainFirst and retainEvery: the first pass a minute after Run
	// starts, then every 10 minutes (each with up to a fifth more of
	// jitter, so instances do not delete in step).
	retainFirst = time.Minute
	retainEvery = 10 * time.Minute
)

// retention returns the retention of the schedule registered as e: its
// definition's, else the scheduler's; negative: keep everything.
func (s *Scheduler) retention(e *entry) time.Duration {
	s.mu.Lock()
	r := e.retention
	s.mu.Unlock()
	if r == 0 {
		r = s.cfg.Retention
	}
	return r
}

// retain runs retention passes until ctx ends.
func (s *Scheduler) retain(ctx context.Context) {
	t := time.NewTimer(jittered(retainFirst))
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		failing = s.retainReport(ctx, s.retainOnce(ctx), failing)
		t.Reset(jittered(retainEvery))
	}
}

// retainReport reports a pass's error once per episode: a warning for the
// first failing pass (a refused connection is reported by the refusals'
// back-off instead), an info line for the first pass that works again. It
// returns whether the episode goes on.
func (s *Scheduler) retainReport(ctx context.Context, err error, failing bool) bool {
	switch {
	case ctx.Err() != nil:
		return failing
	case err == nil:
		if failing {
			s.log.InfoContext(ctx, "schedule: deleting old runs (retention) works again")
		}
		return false
	case pgerr.Refused(err):
		return failing
	case !failing:
		s.log.WarnContext(ctx, "schedule: delete old runs (retention); trying again at each pass, reported once until one works", "error", err)
	}
	return true
}

func jittered(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

// retainOnce deletes, for every schedule registered here, its finished
// runs older than its retention, a batch at a time, and logs what it
// deleted. It stops at the first error.
func (s *Scheduler) retainOnce(ctx context.Context) (err error) {
	var names []string
	var applied []int64
	defer func() {
		// Say what this pass applied, for the CLI and the status page.
		if len(names) > 0 && ctx.Err() == nil {
			if rerr := s.q.ReportRetention(ctx, store.ReportRetentionParams{Names: names, RetentionsUs: applied}); rerr != nil && err == nil {
				err = fmt.Errorf("schedule: report retention: %w", rerr)
			}
		}
	}()
	for _, e := range s.snapshot() {
		age := s.retention(e)
		if age <= 0 {
			names, applied = append(names, e.name), append(applied, int64(KeepRuns))
			continue
		}
		var total int64
		for first := true; ; first = false {
			var row store.PruneScheduleRunsRow
			err := s.tx(ctx, func(q *store.Queries) error {
				if err := q.SetLocalStatementTimeout(ctx, fmt.Sprint(retainStatement.Milliseconds())); err != nil {
					return err
				}
				var err error
				row, err = q.PruneScheduleRuns(ctx, store.PruneScheduleRunsParams{Name: e.name, OlderThanUs: us(age), BatchSize: s.retainBatch})
				return err
			})
			if err != nil {
				s.logRetained(ctx, e.name, age, total)
				return fmt.Errorf("schedule: %q: %w", e.name, err)
			}
			if first {
				// The first batch says whether the catch-up window lets
				// this age apply; if not, every run is kept.
				names, applied = append(names, e.name), append(applied, us(age))
				if !row.Eligible {
					applied[len(applied)-1] = int64(KeepRuns)
				}
			}
			total += row.Deleted
			if row.Deleted < int64(s.retainBatch) || ctx.Err() != nil {
				break
			}
		}
		s.logRetained(ctx, e.name, age, total)
	}
	return ctx.Err()
}

func (s *Scheduler) logRetained(ctx context.Context, name string, age time.Duration, n int64) {
	if n > 0 {
		s.log.InfoContext(ctx, "schedule: old runs deleted (retention)", "schedule", name, "deleted", n, "older_than", age.String())
	}
}

// reportedRetention reads a stored retention_us: nil (no pass reported)
// is 0, a negative one KeepRuns.
func reportedRetention(us *int64) time.Duration {
	switch {
	case us == nil:
		return 0
	case *us < 0:
		return KeepRuns
	}
	return dur(*us)
}

// checkRetention validates a retention setting named field.
func checkRetention(field string, r, catchUpWindow time.Duration) error {
	switch {
	case r == 0 || r == KeepRuns:
		return nil
	case r < 0:
		return invalid(field, fmt.Sprintf("%s is negative: use schedule.KeepRuns to keep every run", r))
	case r < time.Hour:
		return invalid(field, fmt.Sprintf("%s is shorter than an hour: keep runs long enough to look at them (or schedule.KeepRuns)", r))
	case catchUpWindow > 0 && r <= catchUpWindow:
		return invalid(field, fmt.Sprintf("%s is within the catch-up window (%s): make it longer than CatchUpWindow, or the old runs are never deleted", r, catchUpWindow))
	}
	return nil
}

// warnKept warns at Register when the retention in force for d does not
// reach past its stored catch-up window, so its runs are kept (a pass
// would otherwise be silently idle for it).
func (s *Scheduler) warnKept(ctx context.Context, d Definition, window time.Duration) {
	r := d.Retention
	if r == 0 {
		r = s.cfg.Retention
	}
	if r > 0 && window > 0 && r <= window {
		s.log.WarnContext(ctx, "schedule: finished runs are kept: the retention is within the catch-up window; set Definition.Retention longer than CatchUpWindow, or KeepRuns",
			"schedule", d.Name, "retention", r.String(), "catch_up_window", window.String())
	}
}
