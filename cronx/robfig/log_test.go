package robfig

import (
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/cronx/internal/crontest"
	"github.com/pgclaim/pgclaim/gate"
)

// TestLogsByDefault: without Config.Logger, a firing with no instant is an
// error and a tick skipped behind a slow run a warning on the default
// logger (see crontest.LogsByDefault). Not parallel: it replaces the
// default logger.
func TestLogsByDefault(t *testing.T) {
	crontest.LogsByDefault(t, func(g *gate.Gate, name string, sched gate.Schedule, fn gate.Func, now func() time.Time, maxDelay time.Duration) (func(), error) {
		job, err := NewJob(g, name, sched, fn, Config{MaxDelay: maxDelay, now: now})
		if err != nil {
			return nil, err
		}
		return job.Run, nil
	})
}
