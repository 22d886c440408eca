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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/internal/lockcore"
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
	// statements run at READ COMMITTED.
	do(ctx context.Context, fn func(q *store.Queries, g guard) error) error
	// release gives the lock up (a no-op after a loss).
	release()
}

// guard names the lease a guarded statement checks (zero: none, the
// statement runs on the lock's session).
type guard struct {
	name  string
	fence int64
}

// lockKey is the advisory key of a schedule's lock: gate's key space,
// under a name no gate job uses.
func lockKey(name string) (class, key int32) { return gate.AdvisoryKey("pgclaim.schedule:" + name) }

// LockKey returns the two-int4 session advisory key (pg_locks classid and
// objid) an instance holds while it runs or records the schedule name,
// for tools that show who holds which lock. With Config.LeaseLocks the
// lock is instead the lease row "pgclaim.schedule:NAME" of pgclaim_locks.
func LockKey(name string) (class, key int32) { return lockKey(name) }

// lockName is a schedule's lease row name in pgclaim_locks.
func lockName(name string) string { return "pgclaim.schedule:" + name }

// pingEvery: a held session is watched by blocking on its socket; after
// this much quiet it is pinged, to find a silent network failure.
var pingEvery = 5 * time.Second

// advisoryLocker holds session advisory locks on connections taken out of
// the pool (lockcore.Sessions), watched while held: the server drops the
// lock the moment the session ends, which is what lets another instance
// take a dead holder's run over at once.
type advisoryLocker struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	ss   *lockcore.Sessions // replaced by close, so a later Run starts afresh
}

func (l *advisoryLocker) leases() bool { return false }

func (l *advisoryLocker) sessions() *lockcore.Sessions {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ss == nil {
		l.ss = &lockcore.Sessions{Pool: l.pool}
	}
	return l.ss
}

func (l *advisoryLocker) check(ctx context.Context) error {
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

func (l *advisoryLocker) close() {
	l.mu.Lock()
	ss := l.ss
	l.ss = nil
	l.mu.Unlock()
	if ss != nil {
		ss.Close()
	}
}

func (l *advisoryLocker) acquire(ctx context.Context, name string, _ time.Duration) (held, error) {
	ss := l.sessions()
	class, key := lockKey(name)
	var s *lockcore.Session
	var ok bool
	var err error
	for try := 0; try < 2; try++ {
		if s, err = ss.Get(ctx); err != nil {
			return nil, fmt.Errorf("schedule: %q: lock connection: %w", name, err)
		}
		_, ok, err = s.TryLock(ctx, class, key, 0)
		if err == nil {
			break
		}
		s.Close() // the lock may have been taken: closing drops it
		if !s.Ended(err) {
			break
		}
		// A cached session that ended while idle: once more, fresh.
	}
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: take lock: %w", name, err)
	}
	if !ok {
		ss.Put(s)
		return nil, nil
	}
	h := &advisoryHeld{ss: ss, s: s, class: class, key: key, lostc: make(chan struct{})}
	h.watch()
	return h, nil
}

// advisoryHeld is a session advisory lock while held. Its session is
// watched (Session.Watch) whenever no statement runs on it.
type advisoryHeld struct {
	ss         *lockcore.Sessions
	s          *lockcore.Session
	class, key int32
	mu         sync.Mutex // serializes do, release and the watch
	keeper     *lockcore.Keeper
	lostc      chan struct{}
	lostOnce   sync.Once
	err        error // set before lostc is closed
}

func (h *advisoryHeld) markLost(err error) {
	h.lostOnce.Do(func() {
		h.err = fmt.Errorf("%w: the lock's session ended: %v", ErrLost, err)
		close(h.lostc)
	})
}

// watch starts watching the session: a terminated backend or a server
// shutdown is seen at once; a quiet connection is pinged.
func (h *advisoryHeld) watch() {
	h.keeper = h.s.Watch(context.Background(), lockcore.WatchConfig{Every: pingEvery}, h.markLost)
}

// unwatch ends the watch; the connection is then free for a statement.
func (h *advisoryHeld) unwatch() { h.keeper.Stop() }

func (h *advisoryHeld) do(ctx context.Context, fn func(q *store.Queries, g guard) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unwatch()
	if err := h.cause(); err != nil {
		return err
	}
	err := fn(h.s.Q, guard{})
	if h.s.Conn.IsClosed() {
		h.markLost(err)
		return h.cause()
	}
	h.watch()
	return err
}

func (h *advisoryHeld) lost() <-chan struct{} { return h.lostc }

func (h *advisoryHeld) cause() error {
	select {
	case <-h.lostc:
		return h.err
	default:
		return nil
	}
}

func (h *advisoryHeld) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unwatch()
	if h.cause() != nil {
		h.s.Close()
		return
	}
	ctx, cancel := lockcore.ReleaseContext(context.Background())
	defer cancel()
	h.ss.Unlock(ctx, h.s, h.class, h.key)
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
	var fence int64
	sent := time.Now()
	err := l.s.tx(ctx, func(q *store.Queries) error {
		r, err := q.AcquireLease(ctx, store.AcquireLeaseParams{Name: lockName(name), Holder: l.s.holder, AtMostUs: us(lease)})
		fence = r.Fence
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: take lease: %w", name, err)
	}
	h := &leaseHeld{l: l, name: lockName(name), fence: fence, lostc: make(chan struct{})}
	h.stop = l.s.keep(ctx, "lease", name, sent, lease, func(ctx context.Context) error {
		return l.s.tx(ctx, func(q *store.Queries) error {
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
	stop  func()
	lostc chan struct{}
	err   atomic.Pointer[error]
}

func (h *leaseHeld) lost() <-chan struct{} { return h.lostc }

func (h *leaseHeld) cause() error {
	if p := h.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (h *leaseHeld) do(ctx context.Context, fn func(q *store.Queries, g guard) error) error {
	if err := h.cause(); err != nil {
		return err
	}
	return h.l.s.tx(ctx, func(q *store.Queries) error { return fn(q, guard{name: h.name, fence: h.fence}) })
}

func (h *leaseHeld) release() {
	h.stop()
	if h.cause() != nil {
		return
	}
	ctx, cancel := lockcore.ReleaseContext(context.Background())
	defer cancel()
	_ = h.l.s.tx(ctx, func(q *store.Queries) error {
		_, err := q.ReleaseLease(ctx, store.ReleaseLeaseParams{Name: h.name, Fence: h.fence, AtLeastUs: 0})
		return err
	})
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
		if errors.Is(err, lockcore.ErrExpired) {
			onLost(fmt.Errorf("%w: the %s was not renewed in time", ErrLost, what))
		} else {
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
