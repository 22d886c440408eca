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
		return fmt.Errorf("schedule: %q: %s: %w", name, op, err)
	}
}
