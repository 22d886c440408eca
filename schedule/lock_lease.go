package schedule

// The lease rows of pgclaim_locks: the lease lock (Config.LeaseLocks, for
// transaction poolers) and the batched statements that take, seize and
// release leases for both kinds of lock.

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgclaim/pgclaim/store"
)

// leaseCall is one runner's lease to take (AcquireLeases) or seize
// (SeizeLeases), batched with the others': the lease row name, held for lease.
type leaseCall struct {
	name  string
	lease time.Duration
}

// acquireLeases takes the lease rows of calls that are free in one
// statement (AcquireLeases) and returns each one's fence, 0 for a lease
// held elsewhere. A name twice in one batch gets it once.
func (s *Scheduler) acquireLeases(ctx context.Context, calls []leaseCall) ([]int64, error) {
	names, leases := distinctLeases(calls)
	rows, err := s.rc.AcquireLeases(ctx, store.AcquireLeasesParams{Holder: s.holder, Names: names, AtMostUs: leases})
	if err != nil {
		return nil, err
	}
	fences := make(map[string]int64, len(rows))
	for _, r := range rows {
		fences[r.Name] = r.Fence
	}
	return fencesOf(calls, fences), nil
}

// distinctLeases lists the names of calls once each, with their leases.
func distinctLeases(calls []leaseCall) (names []string, leasesUs []int64) {
	seen := make(map[string]bool, len(calls))
	for _, c := range calls {
		if !seen[c.name] {
			seen[c.name] = true
			names, leasesUs = append(names, c.name), append(leasesUs, us(c.lease))
		}
	}
	return names, leasesUs
}

// fencesOf answers calls from the fences granted by name: a second call
// for a name gets none.
func fencesOf(calls []leaseCall, fences map[string]int64) []int64 {
	out := make([]int64, len(calls))
	for i, c := range calls {
		out[i] = fences[c.name]
		fences[c.name] = 0
	}
	return out
}

// seizeLeases seizes the lease rows of calls in one statement and returns
// each one's fence. A name twice in one batch (never, while a process
// holds each schedule's lock once) fails the second call.
func (s *Scheduler) seizeLeases(ctx context.Context, calls []leaseCall) ([]int64, error) {
	names, leases := distinctLeases(calls)
	rows, err := s.rc.SeizeLeases(ctx, store.SeizeLeasesParams{Holder: s.holder, Names: names, AtMostUs: leases})
	if err != nil {
		return nil, fmt.Errorf("take leases: %w", err)
	}
	fences := make(map[string]int64, len(rows))
	for _, r := range rows {
		fences[r.Name] = r.Fence
	}
	return fencesOf(calls, fences), nil
}

// releaseGather is how long a batch of lease releases gathers: runs that
// came due together end at about the same time, not at once.
const releaseGather = 5 * time.Millisecond

// releaseCall is one runner's lease release (ReleaseLeases).
type releaseCall struct {
	name  string
	fence int64
}

// releaseLeases releases the leases of calls in one statement (a release
// that finds its lease gone or taken over changes nothing; no caller needs
// to know which).
func (s *Scheduler) releaseLeases(ctx context.Context, calls []releaseCall) ([]struct{}, error) {
	names := make([]string, len(calls))
	fences := make([]int64, len(calls))
	for i, c := range calls {
		names[i], fences[i] = c.name, c.fence
	}
	if err := s.rc.ReleaseLeases(ctx, store.ReleaseLeasesParams{Names: names, Fences: fences}); err != nil {
		return nil, err
	}
	return make([]struct{}, len(calls)), nil
}

// leaseLocker holds lease rows in pgclaim_locks, through the pool: every
// statement stands alone, so it works behind a transaction pooler.
type leaseLocker struct {
	s *Scheduler
}

func (l *leaseLocker) leases() bool { return true }
func (l *leaseLocker) close()       {}

func (l *leaseLocker) check(context.Context) error { return nil }

func (l *leaseLocker) acquire(ctx context.Context, name string, lease time.Duration) (held, error) {
	// Bounded like a statement under the lock: a lease granted by a
	// statement whose answer came too late runs out by itself.
	ctx, cancel := context.WithTimeout(ctx, validFor(lease, false))
	defer cancel()
	sent := time.Now()
	fence, err := l.s.acquires.do(ctx, leaseCall{name: lockName(name), lease: lease})
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: take lease: %w", name, err)
	}
	if fence == 0 {
		return nil, nil // held elsewhere
	}
	h := &leaseHeld{l: l, name: lockName(name), fence: fence, valid: validFor(lease, false), lostc: make(chan struct{})}
	h.stop = l.s.keep(ctx, "lease", name, sent, lease, func(ctx context.Context) error {
		return l.s.stmts(ctx, func(q *store.Queries) error {
			_, err := q.ExtendLease(ctx, store.ExtendLeaseParams{Name: h.name, Fence: fence, AtMostUs: us(lease)})
			return err
		})
	}, func(err error) {
		h.err.Store(&err)
		close(h.lostc)
	})
	return h, nil
}

type leaseHeld struct {
	l     *leaseLocker
	name  string
	fence int64
	valid time.Duration // bounds each do (validFor)
	stop  func()
	lostc chan struct{}
	err   atomic.Pointer[error]
}

func (h *leaseHeld) lost() <-chan struct{} { return h.lostc }

// seize: the lease is the lock, seized with a fresh fence by acquire.
func (h *leaseHeld) seize(context.Context) error { return h.cause() }

func (h *leaseHeld) seized(context.Context, int64, time.Time) error { return h.cause() }

func (h *leaseHeld) leaseFence() int64 { return h.fence }

func (h *leaseHeld) cause() error {
	if p := h.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *leaseHeld) do(ctx context.Context, fn func(ctx context.Context, q *store.Queries, g guard) error) error {
	if err := h.cause(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, h.valid)
	defer cancel()
	return h.l.s.stmts(ctx, func(q *store.Queries) error { return fn(ctx, q, guard{name: h.name, fence: h.fence}) })
}

func (h *leaseHeld) release() {
	h.stop()
	if h.cause() != nil {
		return
	}
	// A release not answered within the validity is moot: the lease
	// runs out by itself.
	ctx, cancel := context.WithTimeout(context.Background(), h.valid)
	defer cancel()
	_, _ = h.l.s.releases.do(ctx, releaseCall{name: h.name, fence: h.fence})
}
