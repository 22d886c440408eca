package claim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pollGroup is the workers of this process that claim the same rows: one
// DBTX, one claim statement, equal WorkerConfig.Args. While notifications
// reach them, any claim of one of them is the safety-net poll of all: a
// worker's poll comes PollInterval after the group's latest claim, not
// after its own, so idle workers of one table cost one statement per
// PollInterval between them, and a busy group polls not at all.
type pollGroup struct {
	key   string
	users int          // guarded by pollGroups.mu
	last  atomic.Int64 // the latest claim's start, unix nanoseconds
}

var pollGroups = struct {
	mu sync.Mutex
	m  map[string]*pollGroup
}{m: map[string]*pollGroup{}}

// joinPollGroup returns w's group; leave it with leavePollGroup.
func joinPollGroup[K any](w *Worker[K]) *pollGroup {
	key := fmt.Sprintf("%p\x00%s\x00%#v", w.c.db, w.c.c.sqlBatch.text, w.cfg.Args)
	pollGroups.mu.Lock()
	defer pollGroups.mu.Unlock()
	g := pollGroups.m[key]
	if g == nil {
		g = &pollGroup{key: key}
		pollGroups.m[key] = g
	}
	g.users++
	return g
}

func leavePollGroup(g *pollGroup) {
	pollGroups.mu.Lock()
	defer pollGroups.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(pollGroups.m, g.key)
	}
}

// claimed records a claim of the group that started at t.
func (g *pollGroup) claimed(t time.Time) {
	n := t.UnixNano()
	for {
		old := g.last.Load()
		if old >= n || g.last.CompareAndSwap(old, n) {
			return
		}
	}
}

// turn reports whether the group's poll is due within ahead of now and, if
// so, takes it (as a claim starting at the moment it is due, returned), so
// that of the workers whose timers fire together one polls; otherwise the
// moment it is due.
func (g *pollGroup) turn(now time.Time, ahead, interval time.Duration) (time.Time, bool) {
	n := now.UnixNano()
	for {
		old := g.last.Load()
		due := old + int64(interval)
		if due-n > int64(ahead) {
			return time.Unix(0, due), false
		}
		at := max(due, n)
		if g.last.CompareAndSwap(old, at) {
			return time.Unix(0, at), true
		}
	}
}

// latest is the start of the group's latest claim.
func (g *pollGroup) latest() time.Time { return time.Unix(0, g.last.Load()) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// pollAhead is how long before a poll is due its worker takes the
// connection it claims on.
const pollAhead = 20 * time.Millisecond

// takeAhead takes a connection of pool for the poll due at due and waits
// until then (or a wake-up, when the claim goes at once); nil when the pool
// has none to give now. The caller claims on it and releases it.
func takeAhead(ctx context.Context, pool *pgxpool.Pool, due time.Time, heard, woken <-chan struct{}) *pgxpool.Conn {
	actx, cancel := context.WithDeadline(ctx, due)
	conn, err := pool.Acquire(actx)
	cancel()
	if err != nil {
		return nil // the claim takes one as it always does
	}
	t := time.NewTimer(time.Until(due))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-heard:
	case <-woken:
	}
	return conn
}
