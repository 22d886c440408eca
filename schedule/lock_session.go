package schedule

// The default lock: a schedule's session advisory lock on the Scheduler's
// one dedicated session (lockcore.Sessions), taken one at a time or, for
// the schedules due at one moment, up to a number in one statement, with
// the lease row it seizes so that its writes are fenced.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/store"
)

// sessionLocker, the default, holds a schedule's session advisory lock on
// the one dedicated session of the Scheduler (lockcore.Sessions, shared by
// all its schedules) and, once the advisory lock is its, seizes the
// schedule's lease row with a fresh fence (SeizeLeases). The advisory lock
// is what lets another instance take a dead holder's run over at once: the
// server drops it the moment the holder's session ends. The lease's fence
// guards the runner's statements, which go through the pool like any
// other: a runner that lost its lock changes nothing, since the next holder
// seized the lease before it could start anything. The session is watched
// while locks are held on it; a lease not renewed in time is lost too.
type sessionLocker struct {
	s  *Scheduler
	mu sync.Mutex
	ss *lockcore.Ref // replaced by close, so a later Run starts afresh
}

func (l *sessionLocker) leases() bool { return false }

func (l *sessionLocker) sessions() *lockcore.Ref {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ss == nil {
		l.ss = lockcore.Share(l.s.pool, l.s.schema)
	}
	return l.ss
}

func (l *sessionLocker) check(ctx context.Context) error {
	ss := l.sessions()
	s, err := ss.Get(ctx)
	if errors.Is(err, gate.ErrPooler) {
		return fmt.Errorf("schedule: %w: use Config.LeaseLocks", err)
	}
	if err == nil {
		ss.Put(s)
	}
	return nil
}

func (l *sessionLocker) close() {
	l.mu.Lock()
	ss := l.ss
	l.ss = nil
	l.mu.Unlock()
	if ss != nil {
		ss.Close()
	}
}

func (l *sessionLocker) acquire(ctx context.Context, name string, lease time.Duration) (held, error) {
	ss := l.sessions()
	class, key := lockKey(l.s.cfg.Schema, name)
	free, ok := ss.Reserve(ctx, class, key, 0)
	if !ok {
		return nil, nil // this instance's runner of the schedule has it
	}
	// The locks of every schedule of the process due at the same moment
	// are taken in one statement on the shared session (bounded like a
	// statement under the lock: one cut off by its deadline closes the
	// session, which drops the locks it took).
	h := &sessionHeld{sch: l.s, ss: ss, free: free, name: lockName(name), valid: validFor(lease, false), lostc: make(chan struct{})}
	h.lostCtx, h.cancelLost = context.WithCancel(context.Background())
	lk, ok, err := ss.TryLockBatched(lockcore.LockRequest{Class: class, Key: key, Validity: validFor(lease, true), OnLost: func(err error) {
		h.lose(fmt.Errorf("%w: the lock's session ended: %v", ErrLost, err))
	}})
	if err != nil {
		h.cancelLost()
		free()
		return nil, fmt.Errorf("schedule: %q: %w", name, err)
	}
	if !ok {
		h.cancelLost()
		free()
		return nil, nil
	}
	h.lk, h.lease, h.schedule, h.keepCtx = lk, lease, name, ctx
	return h, nil
}

// seize seizes the schedule's lease row with a fresh fence, once, and
// renews it while the lock is held: the runner's statements check that
// fence, so a runner that lost its lock changes nothing once this holder
// has seized. A holder that finds nothing to do releases the advisory
// lock without seizing (an instance that looks after another has run the
// instant costs two reads, not four statements).
func (h *sessionHeld) seize(ctx context.Context) error {
	if h.fence != 0 {
		return nil
	}
	if err := h.cause(); err != nil {
		return err
	}
	l := h.sch
	lctx, cancel := context.WithTimeout(ctx, validFor(h.lease, true))
	defer cancel()
	sent := time.Now()
	fence, err := l.seizes.do(lctx, leaseCall{name: h.name, lease: h.lease})
	if err != nil {
		return fmt.Errorf("schedule: %q: take lease: %w", h.schedule, err)
	}
	return h.seized(ctx, fence, sent)
}

// seized makes fence, seized by a statement sent at sent (seize, or the
// common path's StartDue), the lease's, and renews it while the lock is
// held.
func (h *sessionHeld) seized(_ context.Context, fence int64, sent time.Time) error {
	if h.fence != 0 {
		return nil
	}
	if fence == 0 {
		return fmt.Errorf("schedule: %q: take lease: the lease row was not seized", h.schedule)
	}
	l := h.sch
	h.fence = fence
	lease := h.lease
	h.stopRenew = l.keep(h.keepCtx, "lease", h.schedule, sent, lease, func(ctx context.Context) error {
		return l.stmts(ctx, func(q *store.Queries) error {
			_, err := q.ExtendLease(ctx, store.ExtendLeaseParams{Name: h.name, Fence: fence, AtMostUs: us(lease)})
			return err
		})
	}, h.lose)
	return nil
}

// sessionHeld is a schedule's lock while held: the advisory lock on the
// Scheduler's session and the lease row seized under it.
type sessionHeld struct {
	sch        *Scheduler
	ss         *lockcore.Ref
	lk         lockcore.Locked // the advisory lock, its session and watch
	schedule   string
	lease      time.Duration   // the schedule's Lease
	keepCtx    context.Context // acquire's: the values renewals run with
	free       func()          // ends the lock's reservation in this process
	name       string          // the lease row
	fence      int64           // the lease's fence (0 until seized)
	valid      time.Duration
	stopRenew  func()
	lostc      chan struct{}
	lostCtx    context.Context // cancelled when the lock is lost
	cancelLost context.CancelFunc
	once       sync.Once
	err        atomic.Pointer[error]
}

func (h *sessionHeld) lose(err error) {
	h.once.Do(func() {
		h.err.Store(&err)
		close(h.lostc)
		h.cancelLost()
	})
}

func (h *sessionHeld) lost() <-chan struct{} { return h.lostc }

func (h *sessionHeld) leaseFence() int64 { return h.fence }

func (h *sessionHeld) cause() error {
	if p := h.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *sessionHeld) do(ctx context.Context, fn func(ctx context.Context, q *store.Queries, g guard) error) error {
	if err := h.cause(); err != nil {
		return err
	}
	// A statement through the pool is bounded by the lease's validity, and
	// cut short when the lock is lost meanwhile (its session ended or was
	// not confirmed): the runner must see the loss, not wait on a silent
	// network.
	ctx, cancel := context.WithTimeout(ctx, h.valid)
	defer cancel()
	defer context.AfterFunc(h.lostCtx, cancel)()
	err := h.sch.stmts(ctx, func(q *store.Queries) error { return fn(ctx, q, guard{name: h.name, fence: h.fence}) })
	if cause := h.cause(); err != nil && cause != nil {
		return cause
	}
	return err
}

func (h *sessionHeld) release() {
	if h.stopRenew != nil {
		h.stopRenew()
	}
	if h.cause() == nil && h.fence != 0 {
		// A release not answered in time is moot: the lease runs out,
		// and the next holder seizes it anyway.
		ctx, cancel := context.WithTimeout(context.Background(), h.valid)
		_, _ = h.sch.releases.do(ctx, releaseCall{name: h.name, fence: h.fence})
		cancel()
	}
	// Unlocked on the session even when its validity ran out (a slow
	// answer; the run was cancelled), with the other releases of the
	// moment: the session keeps every other lock of the process.
	h.ss.ReleaseBatched(h.lk)
	h.free()
	h.cancelLost()
}

// acquireUpTo takes, in one statement, the locks of up to n of names in
// their order (lockcore.TryLocksUpTo), each valid for its leases[i]: the
// instances with room share out the schedules due at one moment, none
// trying a lock another took first. It returns the locks taken by index
// of names, and which of names another holder has (tried and not taken,
// or held by another runner of this process); the rest were not tried.
func (l *sessionLocker) acquireUpTo(ctx context.Context, names []string, leases []time.Duration, n int) (map[int]held, map[int]bool, error) {
	ss := l.sessions()
	taken := map[int]bool{}
	var reqs []lockcore.LockRequest
	var idx []int // reqs[j] is names[idx[j]]
	var hs []*sessionHeld
	for i, name := range names {
		class, key := lockKey(l.s.cfg.Schema, name)
		free, ok := ss.Reserve(ctx, class, key, 0)
		if !ok {
			taken[i] = true // this instance's runner of the schedule has it
			continue
		}
		h := &sessionHeld{sch: l.s, ss: ss, free: free, name: lockName(name), valid: validFor(leases[i], false), lostc: make(chan struct{}),
			lease: leases[i], schedule: name, keepCtx: ctx}
		h.lostCtx, h.cancelLost = context.WithCancel(context.Background())
		reqs = append(reqs, lockcore.LockRequest{Class: class, Key: key, Validity: validFor(leases[i], true), OnLost: func(err error) {
			h.lose(fmt.Errorf("%w: the lock's session ended: %v", ErrLost, err))
		}})
		idx = append(idx, i)
		hs = append(hs, h)
	}
	got, tried, err := ss.TryLocksUpTo(ctx, reqs, n)
	out := make(map[int]held, len(got))
	for j, h := range hs {
		lk, ok := got[j]
		if !ok {
			h.cancelLost()
			h.free()
			if err == nil && j < tried {
				taken[idx[j]] = true
			}
			continue
		}
		h.lk = lk
		out[idx[j]] = h
	}
	if err != nil {
		return nil, nil, fmt.Errorf("schedule: take the locks of the schedules due: %w", err)
	}
	return out, taken, nil
}
