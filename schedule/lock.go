package schedule

// This file is the scheduler's one source of exclusivity: the lock that
// makes one instance at a time the runner of a schedule (a session
// advisory lock, or a lease row for transaction poolers), and the keeper
// that renews a lease while it is held. Everything else calls it through
// locker and held. The mechanism is internal/lockcore's, as gate's is:
// its Sessions and Session.Watch for advisory locks, Renew and Validity
// for leases, ReleaseContext for every release.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// locker takes a schedule's lock.
type locker interface {
	// acquire takes the lock of the schedule name, valid for lease
	// without renewal (the lease locker renews it while held). It returns
	// nil, nil when another holder has it.
	acquire(ctx context.Context, name string, lease time.Duration) (held, error)
	// leases reports whether the lock is a lease (a dead holder's run is
	// taken over at its lease's expiry) rather than a session lock (at
	// once).
	leases() bool
	// check refuses a setup that cannot work (a pooler in front of
	// session locks); a database it cannot reach is not an error here.
	check(ctx context.Context) error
	// close closes what the locker keeps between runs.
	close()
}

// held is a schedule's lock while held.
type held interface {
	// lost is closed when exclusivity is lost: the session died, or the
	// lease could not be renewed in time.
	lost() <-chan struct{}
	// cause says why it was lost (nil while held).
	cause() error
	// do runs fn with queries that take effect only while the lock is
	// held: on the lock's own session (a statement there fails once the
	// session, and with it the lock, is gone), or through the pool with g
	// naming the lease, which the guarded statements check. fn's
	// statements run at READ COMMITTED, under the ctx fn is given: ctx's
	// values, bounded by the lock's validity (see validFor).
	do(ctx context.Context, fn func(ctx context.Context, q *store.Queries, g guard) error) error
	// release gives the lock up (a no-op after a loss).
	release()
	// leaseFence is the fence of a lease lock's grant (0 for a session
	// lock): a running run with an older fence was started under an
	// earlier grant.
	leaseFence() int64
	// seize makes the holder's writes fenced before its first: the
	// session lock seizes the schedule's lease row (see
	// sessionHeld.seize); a lease lock already is one. Call it before
	// anything is written under the lock.
	seize(ctx context.Context) error
	// seized is seize done by a statement of the caller's, sent at sent,
	// that seized the lease row with fence (guard fence 0); a lease lock
	// ignores it.
	seized(ctx context.Context, fence int64, sent time.Time) error
}

// guard names the lease a guarded statement checks (zero: none, the
// statement runs on the lock's session).
type guard struct {
	name  string
	fence int64
}

// lockKey is the advisory key of a schedule's lock: gate's key space,
// under a name no gate job uses; in a schema of its own (Config.Schema),
// a key of that schema's.
func lockKey(schema, name string) (class, key int32) {
	if schema != "" {
		return gate.AdvisoryKey("pgclaim.schedule:" + schema + ":" + name)
	}
	return gate.AdvisoryKey("pgclaim.schedule:" + name)
}

// LockKey returns the two-int4 session advisory key (pg_locks classid and
// objid) an instance holds while it runs or records the schedule name,
// for tools that show who holds which lock. With Config.LeaseLocks the
// lock is instead the lease row "pgclaim.schedule:NAME" of pgclaim_locks.
func LockKey(name string) (class, key int32) { return lockKey("", name) }

// lockName is a schedule's lease row name in pgclaim_locks.
func lockName(name string) string { return "pgclaim.schedule:" + name }

// validFor is how long one confirmation of a schedule's lock holds it by
// this instance's reckoning, counted from when it was sent, for a schedule
// whose Lease is lease: 9/10 of the lease (as for the run's lease, see
// keep), and for a session advisory lock at most lockcore.SessionValidity.
// Every statement run under the lock (held.do) is bounded by it, and a
// session not confirmed for that long (by a statement or by the watch's
// ping) is lost: its run is cancelled before another instance can take the
// lock (lockcore.SessionValidity states the margin) or the lease.
func validFor(lease time.Duration, session bool) time.Duration {
	v := lease - lease/10
	if session {
		v = min(v, lockcore.SessionValidity)
	}
	return v
}

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

// keep renews a lease of length lease (the schedule's lock, or a run's
// lease), first granted by a statement sent at sent, every lease/3 until
// the returned stop is called (lockcore.Renew). The lease counts as held
// until 9/10 of its length after the send time of the last success (a
// lockcore.Validity, on this host's monotonic clock), so a renewal's
// deadline ends before the database's expiry; a renewal that finds the
// lease gone (pgx.ErrNoRows), or none succeeding within the validity,
// calls onLost once with an error wrapping ErrLost. A renewal that failed
// otherwise is logged and retried after lease/20. Renewals run with ctx's
// values, not its cancellation. While s.stalled is set (tests), the keeper
// does nothing at all, as a stopped process would.
func (s *Scheduler) keep(ctx context.Context, what, name string, sent time.Time, lease time.Duration, renew func(context.Context) error, onLost func(error)) (stop func()) {
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k := lockcore.Renew(kctx, lockcore.RenewConfig{
		Every:    lease / 3,
		Retry:    lease / 20,
		Validity: lockcore.NewValidity(sent, lease-lease/10, nil),
		Renew: func(rctx context.Context) (bool, error) {
			if s.stalled.Load() {
				s.freeze(kctx)
				if err := rctx.Err(); err != nil {
					return false, err // the stall outlasted the validity
				}
			}
			err := renew(rctx)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		},
		OnFail: func(err error) {
			s.log.WarnContext(ctx, "schedule: renewal failed (retrying)", "schedule", name, "lease", what, "error", err)
		},
	}, func(err error) {
		switch {
		case errors.Is(err, lockcore.ErrExpired):
			onLost(fmt.Errorf("%w: the %s was not renewed in time", ErrLost, what))
		case pgerr.Permanent(err):
			onLost(fmt.Errorf("%w: the server refuses the %s's renewal: %w", ErrLost, what, pgerr.Explain(err)))
		default:
			onLost(fmt.Errorf("%w: the %s had expired or was taken over", ErrLost, what))
		}
	})
	return func() { cancel(); k.Stop() }
}

// freeze blocks while s.stalled is set (tests), or until ctx ends.
func (s *Scheduler) freeze(ctx context.Context) {
	for s.stalled.Load() && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
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
