package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/store"
)

// Pause pauses the schedule name: no new run of it starts on any instance
// (a run already running finishes). note says why and by who did it; both
// are stored with the time. Every instance hears of it at once through
// LISTEN/NOTIFY, or within its Config.PollInterval. Instants that come due
// while paused are decided, at Resume, by the schedule's catch-up policy;
// they are never reported missed. Registration never changes the pause
// state. Unknown name: ErrNotFound.
func (s *Scheduler) Pause(ctx context.Context, name, note, by string) error {
	if name == "" {
		return invalid("name", "must not be empty")
	}
	err := s.tx(ctx, func(q *store.Queries) error {
		_, err := q.PauseSchedule(ctx, store.PauseScheduleParams{Name: name, Note: note, PausedBy: by})
		return err
	})
	return opErr("pause", name, err)
}

// Resume resumes the paused schedule name on every instance, as promptly
// as Pause. Resuming a schedule that is not paused changes nothing.
// Unknown name: ErrNotFound.
func (s *Scheduler) Resume(ctx context.Context, name string) error {
	if name == "" {
		return invalid("name", "must not be empty")
	}
	err := s.tx(ctx, func(q *store.Queries) error {
		_, err := q.ResumeSchedule(ctx, name)
		return err
	})
	return opErr("resume", name, err)
}

// Trigger asks for a run of the schedule name now: a run of kind
// "triggered" at the database's time, which the next instance to look
// runs once, with the schedule's retry policy. While a triggered run of
// the schedule is still open (not yet finished), Trigger returns that
// run's instant and created false: two operators triggering together get
// one run. A triggered run waits while the schedule is paused. Unknown
// name: ErrNotFound.
func (s *Scheduler) Trigger(ctx context.Context, name string) (instant time.Time, created bool, err error) {
	if name == "" {
		return time.Time{}, false, invalid("name", "must not be empty")
	}
	for range 3 {
		var row store.TriggerScheduleRow
		err = s.tx(ctx, func(q *store.Queries) error {
			var err error
			row, err = q.TriggerSchedule(ctx, name)
			return err
		})
		if err != nil {
			return time.Time{}, false, opErr("trigger", name, err)
		}
		if row.Instant.Valid {
			return tm(row.Instant), row.Created, nil
		}
		// A concurrent trigger's run was committed after this statement
		// began: read again.
	}
	return time.Time{}, false, fmt.Errorf("schedule: %q: trigger: no open triggered run found after a conflict", name)
}

func opErr(op, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	default:
		return fmt.Errorf("schedule: %q: %s: %w", name, op, schemaHint(err))
	}
}

// Missed returns the instants of the schedule name that were due after
// since and are missed: due by its stored definition, after its life began
// (starts_at) and after the instants Prune deleted, outside its latest pause, older than Config.Grace by
// database time, and without a row — nothing recorded them, so no instance
// ran, skipped or decided them. At most limit (at least 1), oldest first;
// more says whether further missed instants follow. An instance that runs
// the schedule records each missed instant when it next looks (its
// catch-up policy decides it, and EventMissed reports it), after which it
// is no longer listed here. Unknown name: ErrNotFound.
func (s *Scheduler) Missed(ctx context.Context, name string, since time.Time, limit int) (instants []time.Time, more bool, err error) {
	if name == "" {
		return nil, false, invalid("name", "must not be empty")
	}
	limit = max(limit, 1)
	st, err := loadSchedule(ctx, s.q, name)
	if err != nil {
		return nil, false, err
	}
	from := st.startsAt
	if since.After(from) {
		from = since
	}
	if st.prunedUntil.After(from) {
		from = st.prunedUntil
	}
	upto := st.dbNow.Add(-s.cfg.Grace)
	if st.paused && st.pausedAt.Before(upto) {
		upto = st.pausedAt
	}
	inPause := func(t time.Time) bool {
		return !st.pausedAt.IsZero() && !t.Before(st.pausedAt) && (st.resumedAt.IsZero() || !t.After(st.resumedAt))
	}
	for from.Before(upto) {
		batch, next := st.spec.between(from, upto, recordChunk)
		if len(batch) == 0 {
			break
		}
		rows, err := s.q.RunInstants(ctx, store.RunInstantsParams{Schedule: name, Kind: kindScheduled, After: ts(from), Upto: ts(batch[len(batch)-1])})
		if err != nil {
			return nil, false, fmt.Errorf("schedule: %q: read runs: %w", name, err)
		}
		have := make(map[time.Time]bool, len(rows))
		for _, r := range rows {
			have[tm(r)] = true
		}
		for _, t := range batch {
			if have[t] || inPause(t) {
				continue
			}
			if len(instants) == limit {
				return instants, true, nil
			}
			instants = append(instants, t)
		}
		if !next {
			break
		}
		from = batch[len(batch)-1]
	}
	return instants, false, nil
}

// Prune deletes the finished runs (succeeded, failed or skipped; never an
// open one) of every stored schedule that finished more than olderThan
// ago by database time, and returns how many it deleted. The instants
// deleted are never recorded again by catch-up nor listed by Missed: each
// schedule keeps, in pruned_until, the newest scheduled or backfilled
// instant deleted. olderThan must be positive and longer than every stored
// schedule's CatchUpWindow (a window of 0, unbounded, does not refuse:
// pruned_until covers it), or Prune deletes nothing and returns an error
// wrapping ErrInvalid that names olderThan and the schedule with the
// widest window. A backfill over a pruned range runs its instants again.
func (s *Scheduler) Prune(ctx context.Context, olderThan time.Duration) (deleted int64, err error) {
	if olderThan <= 0 {
		return 0, invalid("olderThan", "must be positive")
	}
	var row store.PruneRunsRow
	err = s.tx(ctx, func(q *store.Queries) error {
		var err error
		row, err = q.PruneRuns(ctx, us(olderThan))
		return err
	})
	switch {
	case err != nil:
		return 0, fmt.Errorf("schedule: prune: %w", err)
	case row.RefusedBy != "":
		return 0, invalid("olderThan", fmt.Sprintf("%s is within the catch-up window (%s) of schedule %q: catch-up could run a pruned instant again",
			olderThan, dur(row.RefusedWindowUs), row.RefusedBy))
	}
	return row.Deleted, nil
}
