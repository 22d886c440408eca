package schedule

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// takenSpacing is how often, at most, an instance at its Config.MaxConcurrent
// asks which of the schedules it could not attend yet are taken (see
// untaken).
const takenSpacing = 100 * time.Millisecond

// untaken returns those of due (schedules due at their wake-up that this
// instance has no room to attend all at once) that may still need it: it
// asks, in one statement, which are taken — another instance holds the
// lock, or the instant is finished with no run open — and moves their
// wake-up to their next instant, as a look would have. With more schedules
// due than room, the looks of an instance that frees a slot then go to the
// runs no one has started, not to ones another instance has run meanwhile.
// On error it returns due unchanged: the looks decide, as without it.
func (s *Scheduler) untaken(ctx context.Context, due []*entry, wake map[string]time.Time) []*entry {
	p := store.TakenSchedulesParams{LeaseMode: s.cfg.LeaseLocks}
	for _, e := range due {
		class, key := lockKey(s.cfg.Schema, e.name)
		p.LockClass = class
		p.Names = append(p.Names, e.name)
		p.Dues = append(p.Dues, ts(wake[e.name]))
		p.LockKeys = append(p.LockKeys, key)
	}
	var taken []string
	err := s.stmts(ctx, func(q *store.Queries) error {
		var err error
		taken, err = q.TakenSchedules(ctx, p)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			// A missing privilege (the looks need the same ones, and the
			// first to fail ends Run with the fix) is said at warn.
			level := slog.LevelDebug
			if pgerr.Permanent(err) {
				level = slog.LevelWarn
			}
			s.log.Log(ctx, level, "schedule: which due schedules are taken (each is looked at instead)", "error", pgerr.Explain(err))
		}
		return due
	}
	if len(taken) == 0 {
		return due
	}
	gone := make(map[string]bool, len(taken))
	for _, n := range taken {
		gone[n] = true
	}
	now := s.dbNow()
	left := due[:0:0]
	for _, e := range due {
		s.mu.Lock()
		st := e.st
		s.mu.Unlock()
		if !gone[e.name] || st == nil || st.paused {
			left = append(left, e)
			continue
		}
		wake[e.name] = st.spec.next(now)
	}
	return left
}
