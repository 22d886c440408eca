package schedule

// Sharing out the schedules due at one moment: an instance with room for
// n of them takes the locks of up to n in one statement, in name order,
// each lock going to the first instance that tries it (as SKIP LOCKED
// shares out rows). Without it, each instance tries the locks of the
// schedules it picked, and those another instance picked too go to the
// quicker one while the slower's slot waits for the next look.

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// shareOut takes, with session locks, the locks of up to room of due
// (schedules due at their wake-up) in one statement and starts the attend
// of each it took; a schedule another holder has gets its next instant as
// its wake-up, as its look would have given. It returns those of due it
// did not try (room ran out before them), and due itself with lease locks
// or when the statement fails (the looks then decide, and report).
func (s *Scheduler) shareOut(ctx context.Context, due []*entry, room int, wake map[string]time.Time, start func(*entry, held)) []*entry {
	sl, ok := s.locks.(*sessionLocker)
	if !ok {
		return due
	}
	var cand, rest []*entry
	sts := map[*entry]*stored{}
	for _, e := range due {
		s.mu.Lock()
		st := e.st
		s.mu.Unlock()
		if st == nil {
			rest = append(rest, e)
			continue
		}
		sts[e] = st
		cand = append(cand, e)
	}
	if len(cand) < 2 {
		return due
	}
	slices.SortFunc(cand, func(a, b *entry) int { return strings.Compare(a.name, b.name) })
	names := make([]string, len(cand))
	leases := make([]time.Duration, len(cand))
	for i, e := range cand {
		names[i], leases[i] = e.name, sts[e].def.Lease
	}
	hs, taken, err := sl.acquireUpTo(ctx, names, leases, room)
	if err != nil {
		if ctx.Err() == nil {
			level := slog.LevelDebug
			if pgerr.Permanent(err) {
				level = slog.LevelWarn
			}
			s.log.Log(ctx, level, "schedule: share out the schedules due (each is looked at instead)", "error", pgerr.Explain(err))
		}
		return due
	}
	// The runners of the locks taken start on the common path together:
	// one StartDue for all of them.
	fast := 0
	for i, e := range cand {
		if _, _, ok := s.dueNow(sts[e]); ok && hs[i] != nil {
			fast++
		}
	}
	s.starts.expect(fast, startExpect)
	now := s.dbNow()
	for i, e := range cand {
		switch {
		case hs[i] != nil:
			start(e, hs[i])
		case taken[i]:
			// Another instance is the schedule's runner now; look again at
			// the next instant.
			wake[e.name] = time.Time{}
			if st := sts[e]; !st.paused {
				wake[e.name] = st.spec.next(now)
			}
		default:
			rest = append(rest, e)
		}
	}
	return rest
}
