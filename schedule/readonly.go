package schedule

import (
	"context"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// onReader is the state of a read-only episode: the scheduler's statements
// reach a read-only server (SQLSTATE 25006), a standby or a writer's address
// pointing at a reader for a while after a failover.
type onReader struct {
	mu   sync.Mutex
	on   bool
	last time.Time // the latest refusal
}

// readerGap is how long without a read-only refusal ends an episode: reads
// pass on a reader, so an attend that only read says nothing.
func (s *Scheduler) readerGap() time.Duration { return max(5*time.Second, 4*s.cfg.PollInterval) }

// reader reports whether err is a read-only server's refusal. If so it drops
// the pool's connections, so that the next statements connect anew and
// reach the writer once the address points at it again, and reports the
// episode once, at error level.
func (s *Scheduler) reader(ctx context.Context, name string, err error) bool {
	if !pgerr.ReadOnly(err) {
		return false
	}
	s.pool.Reset()
	now := time.Now()
	s.readOnly.mu.Lock()
	first := !s.readOnly.on || now.Sub(s.readOnly.last) > s.readerGap()
	s.readOnly.on, s.readOnly.last = true, now
	s.readOnly.mu.Unlock()
	if first && ctx.Err() == nil {
		s.log.ErrorContext(ctx, "schedule: "+pgerr.ReadOnlyServer+"; dropping the pool's connections and trying again every poll interval",
			"schedule", name, "error", err)
	}
	return true
}

// writer ends a read-only episode once a schedule was attended with no
// read-only refusal for readerGap.
func (s *Scheduler) writer(ctx context.Context) {
	s.readOnly.mu.Lock()
	over := s.readOnly.on && time.Since(s.readOnly.last) > s.readerGap()
	if over {
		s.readOnly.on = false
	}
	s.readOnly.mu.Unlock()
	if over {
		s.log.InfoContext(ctx, "schedule: the writer answers again")
	}
}
