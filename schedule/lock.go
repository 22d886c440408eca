package schedule

// This file is the scheduler's one source of exclusivity: the lock that
// makes one instance at a time the runner of a schedule (a session
// advisory lock, or a lease row for transaction poolers), and the keeper
// that renews a lease while it is held. Everything else calls it through
// locker and held.

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

// lockName is a schedule's lease row name in pgclaim_locks.
func lockName(name string) string { return "pgclaim.schedule:" + name }

const (
	releaseTimeout = 10 * time.Second
	maxIdleConns   = 4
)

// pingEvery: a held session is watched by blocking on its socket; after
// this much quiet it is pinged, to find a silent network failure.
var pingEvery = 5 * time.Second

// advisoryLocker holds session advisory locks on connections taken out of
// the pool, watched while held: the server drops the lock the moment the
// session ends, which is what lets another instance take a dead holder's
// run over at once.
type advisoryLocker struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	idle []*pgx.Conn
}

func (l *advisoryLocker) leases() bool { return false }

func (l *advisoryLocker) conn(ctx context.Context) (*pgx.Conn, error) {
	l.mu.Lock()
	for n := len(l.idle); n > 0; n = len(l.idle) {
		c := l.idle[n-1]
		l.idle = l.idle[:n-1]
		//lint:ignore SA1019 a read-only liveness check, no round trip
		if c.PgConn().CheckConn() == nil && !c.IsClosed() {
			l.mu.Unlock()
			return c, nil
		}
		closeConn(c)
	}
	l.mu.Unlock()
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("schedule: acquire connection: %w", err)
	}
	c := pc.Hijack()
	row, err := store.New(c).SessionSetup(ctx)
	if err != nil {
		closeConn(c)
		return nil, fmt.Errorf("schedule: prepare lock connection: %w", err)
	}
	if uint32(row.Pid) != c.PgConn().PID() {
		closeConn(c)
		return nil, fmt.Errorf("%w (pg_backend_pid %d, announced %d): use Config.LeaseLocks", gate.ErrPooler, row.Pid, c.PgConn().PID())
	}
	return c, nil
}

func (l *advisoryLocker) check(ctx context.Context) error {
	c, err := l.conn(ctx)
	if errors.Is(err, gate.ErrPooler) {
		return err
	}
	if err == nil {
		l.put(c)
	}
	return nil
}

func (l *advisoryLocker) put(c *pgx.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.idle) >= maxIdleConns || c.IsClosed() || c.PgConn().TxStatus() != 'I' {
		go closeConn(c)
		return
	}
	l.idle = append(l.idle, c)
}

func (l *advisoryLocker) close() {
	l.mu.Lock()
	idle := l.idle
	l.idle = nil
	l.mu.Unlock()
	for _, c := range idle {
		closeConn(c)
	}
}

// closeConn closes c and cuts its socket, so the server sees the session
// end (and frees its locks) at once.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
	_ = c.PgConn().Conn().Close()
}

func (l *advisoryLocker) acquire(ctx context.Context, name string, _ time.Duration) (held, error) {
	c, err := l.conn(ctx)
	if err != nil {
		return nil, err
	}
	class, key := lockKey(name)
	ok, err := store.New(c).TrySchedLock(ctx, store.TrySchedLockParams{LockClass: class, LockKey: key})
	if err != nil {
		closeConn(c) // the lock may have been taken: closing drops it
		return nil, fmt.Errorf("schedule: %q: take lock: %w", name, err)
	}
	if !ok {
		l.put(c)
		return nil, nil
	}
	h := &advisoryHeld{l: l, c: c, class: class, key: key, lostc: make(chan struct{})}
	h.watch()
	return h, nil
}

// advisoryHeld is a session advisory lock while held. Its connection is
// watched whenever no statement runs on it.
type advisoryHeld struct {
	l          *advisoryLocker
	c          *pgx.Conn
	class, key int32
	mu         sync.Mutex // serializes do, release and the watch
	stopWatch  context.CancelFunc
	watching   chan struct{} // closed when the watch has ended
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

// watch starts watching the connection: a goroutine blocks reading it, so
// a terminated backend or a server shutdown is seen at once; a quiet
// connection is pinged.
func (h *advisoryHeld) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	h.stopWatch, h.watching = cancel, done
	go func() {
		defer close(done)
		pc := h.c.PgConn()
		for {
			wctx, wcancel := context.WithTimeout(ctx, pingEvery)
			err := pc.WaitForNotification(wctx)
			quiet := wctx.Err() != nil
			wcancel()
			if ctx.Err() != nil && !pc.IsClosed() {
				return
			}
			if err == nil {
				continue
			}
			if quiet && !pc.IsClosed() {
				pctx, pcancel := context.WithTimeout(context.Background(), pingEvery)
				err = pc.Ping(pctx)
				pcancel()
				if err == nil {
					continue
				}
			}
			h.markLost(err)
			return
		}
	}()
}

// unwatch ends the watch; the connection is then free for a statement.
func (h *advisoryHeld) unwatch() {
	h.stopWatch()
	<-h.watching
}

func (h *advisoryHeld) do(ctx context.Context, fn func(q *store.Queries, g guard) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unwatch()
	if err := h.cause(); err != nil {
		return err
	}
	err := fn(store.New(h.c), guard{})
	if h.c.IsClosed() {
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
		closeConn(h.c)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	ok, err := store.New(h.c).AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: h.class, LockKey: h.key})
	if err != nil || !ok {
		closeConn(h.c)
		return
	}
	h.l.put(h.c)
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
	h.stop = l.s.keep(sent, lease, func(ctx context.Context) error {
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
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_ = h.l.s.tx(ctx, func(q *store.Queries) error {
		_, err := q.ReleaseLease(ctx, store.ReleaseLeaseParams{Name: h.name, Fence: h.fence, AtLeastUs: 0})
		return err
	})
}

// keep renews a lease of length lease, first granted by a statement sent
// at sent, every lease/3 until the returned stop is called. A renewal that
// finds the lease gone (pgx.ErrNoRows), or no renewal succeeding before
// the lease's validity (measured on this host's monotonic clock from the
// send time of the last success) is near its end, calls onLost once with
// an error wrapping ErrLost. Each renewal's deadline ends before the
// validity does. While s.stalled is set (tests), the keeper does nothing
// at all, as a stopped process would.
func (s *Scheduler) keep(sent time.Time, lease time.Duration, renew func(context.Context) error, onLost func(error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	margin := lease / 10
	go func() {
		defer close(done)
		valid := sent.Add(lease)
		wait := lease / 3
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			if s.stalled.Load() {
				wait = lease / 3
				continue
			}
			deadline := valid.Add(-margin)
			if !time.Now().Before(deadline) {
				onLost(fmt.Errorf("%w: the lease was not renewed in time", ErrLost))
				return
			}
			rctx, rcancel := context.WithDeadline(ctx, deadline)
			at := time.Now()
			err := renew(rctx)
			rcancel()
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				valid, wait = at.Add(lease), lease/3
			case errors.Is(err, pgx.ErrNoRows):
				onLost(fmt.Errorf("%w: the lease had expired or was taken over", ErrLost))
				return
			default:
				wait = min(lease/20, time.Until(deadline)) // retry soon
			}
		}
	}()
	return func() { cancel(); <-done }
}
