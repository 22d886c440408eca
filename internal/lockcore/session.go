package lockcore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/store"
)

// ErrPooler means the dedicated connection reaches Postgres through a
// connection pooler (see gate.ErrPooler, which it is).
var ErrPooler = errors.New("gate: connection goes through a pooler; session advisory locks need a direct connection")

// ErrClosed means the sessions cache was closed (see gate.ErrClosed, which
// it is).
var ErrClosed = errors.New("gate: closed")

const (
	// maxIdleSessions is how many dedicated connections a cache keeps for
	// reuse once their lock is released: enough for as many jobs running at
	// once, so a busy gate does not open a connection per run.
	maxIdleSessions = 16
	// maxIdleTime: a kept connection unused this long is closed.
	maxIdleTime = time.Minute
	// checkIdleAfter: a cached session idle this long is checked (without
	// a round trip) before reuse.
	checkIdleAfter = time.Second
)

// Session is a connection taken out of the pool (pgxpool.Conn.Hijack) and
// dedicated to holding advisory locks. It never goes back to the pool: after
// an explicit, confirmed unlock it is kept in its Sessions cache, otherwise
// it is closed, which makes the server drop any lock it held.
type Session struct {
	Conn      *pgx.Conn
	Q         *store.Queries // statements on Conn
	pid       uint32
	idleSince time.Time
}

// Sessions is a cache of idle dedicated connections taken from one pool.
// The zero value with Pool set is ready to use.
type Sessions struct {
	Pool   *pgxpool.Pool
	mu     sync.Mutex
	idle   []*Session
	closed bool
}

// Get returns a dedicated session: a cached one that still looks alive, or a
// new one taken from the pool. It returns ErrClosed after Close, and an error
// wrapping ErrPooler behind a connection pooler.
func (c *Sessions) Get(ctx context.Context) (*Session, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		n := len(c.idle)
		if n == 0 {
			c.mu.Unlock()
			break
		}
		s := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		if time.Since(s.idleSince) >= checkIdleAfter && !s.Alive() {
			s.Close()
			continue
		}
		return s, nil
	}
	// A fresh connection from the pool may turn out dead (the server
	// restarted since the pool last used it); the setup statement changes
	// nothing that matters on a dead session, so one retry is safe.
	s, err := c.open(ctx)
	if err != nil && !errors.Is(err, ErrPooler) && ctx.Err() == nil {
		s, err = c.open(ctx)
	}
	return s, err
}

// open takes a connection out of the pool and prepares it for locking.
func (c *Sessions) open(ctx context.Context) (*Session, error) {
	pc, err := c.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("gate: acquire connection: %w", err)
	}
	s := &Session{Conn: pc.Hijack()}
	s.Q = store.New(s.Conn)
	row, err := s.Q.SessionSetup(ctx)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("gate: prepare lock connection: %w", err)
	}
	s.pid = uint32(row.Pid)
	if announced := s.Conn.PgConn().PID(); announced != s.pid {
		s.Close()
		return nil, fmt.Errorf("%w (pg_backend_pid %d, announced %d)", ErrPooler, s.pid, announced)
	}
	return s, nil
}

// Put caches a session whose locks are all released, or closes it.
func (c *Sessions) Put(s *Session) {
	if s.Conn.IsClosed() || s.Conn.PgConn().IsBusy() || s.Conn.PgConn().TxStatus() != 'I' {
		s.Close()
		return
	}
	s.idleSince = time.Now()
	c.mu.Lock()
	if c.closed || len(c.idle) >= maxIdleSessions {
		c.mu.Unlock()
		s.Close()
		return
	}
	c.idle = append(c.idle, s)
	// Get takes the most recently used, so the oldest sit at the front;
	// close those idle too long.
	var stale []*Session
	for len(c.idle) > 0 && s.idleSince.Sub(c.idle[0].idleSince) > maxIdleTime {
		stale = append(stale, c.idle[0])
		c.idle[0] = nil
		c.idle = c.idle[1:]
	}
	c.mu.Unlock()
	for _, s := range stale {
		s.Close()
	}
}

// Close closes every idle session and refuses new ones.
func (c *Sessions) Close() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.closed = true
	c.mu.Unlock()
	for _, s := range idle {
		s.Close()
	}
}

// Alive reads what the server may have sent an idle session (a FATAL from
// a terminated backend or a shutdown) without writing, and reports whether
// it is still open: a Ping would add a round trip to every use.
func (s *Session) Alive() bool {
	//lint:ignore SA1019 a read-only liveness check is what is wanted here
	return s.Conn.PgConn().CheckConn() == nil && !s.Conn.IsClosed()
}

// Close closes the connection; the server then releases its locks.
func (s *Session) Close() { CloseConn(s.Conn) }

// CloseConn closes c, a connection taken out of its pool, and cuts its
// socket, so the server sees the session end (and frees its locks) at once.
func CloseConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
	// After a timed-out statement pgconn closes in the background, first
	// sending a cancel request that can wait up to 15 s. Cut the socket now
	// so the server sees the session end and frees its locks.
	_ = c.PgConn().Conn().Close()
}

// TryLock takes the advisory lock (class, key), waiting up to wait (0: not
// at all). It returns a fencing token from pgclaim_fence(), made durable by
// the statement that grants it, or ok false when another session holds the
// lock.
func (s *Session) TryLock(ctx context.Context, class, key int32, wait time.Duration) (fence int64, ok bool, err error) {
	if wait <= 0 {
		row, err := s.Q.AdvisoryTryLock(ctx, store.AdvisoryTryLockParams{LockClass: class, LockKey: key})
		return row.Fence, row.Locked && err == nil, err
	}
	fence, err = s.Q.AdvisoryLockWait(ctx, store.AdvisoryLockWaitParams{
		LockTimeout: lockTimeout(wait),
		LockClass:   class,
		LockKey:     key,
	})
	if isLockTimeout(err) {
		return 0, false, nil
	}
	return fence, err == nil, err
}

// Unlock releases the advisory lock (class, key) held by s and keeps s for
// reuse in c, or closes s when the unlock is not confirmed.
func (c *Sessions) Unlock(ctx context.Context, s *Session, class, key int32) {
	if ok, err := s.Q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: class, LockKey: key}); err != nil || !ok {
		s.Close()
		return
	}
	c.Put(s)
}

// lockTimeout renders d for the lock_timeout setting (milliseconds, at
// least 1).
func lockTimeout(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return fmt.Sprintf("%dms", ms)
}

// isLockTimeout reports SQLSTATE 55P03 lock_not_available.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// Ended reports whether err, from a statement on s, means the session has
// ended: the connection is closed and the failure was not a timeout on this
// side (after which the server may still hold the session).
func (s *Session) Ended(err error) bool {
	return s.Conn.IsClosed() && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// PingEvery is how much quiet on an advisory lock's session makes its
// watch ping (WatchConfig.Every for the locks of gate's Once and Exclusive
// and of the scheduler).
const PingEvery = time.Second

// SessionValidity is how long one confirmation of an advisory lock's session
// (the statement that took the lock, a statement answered on it, or a ping
// answered) keeps a run under the lock going, counted from when it was
// sent: a session that has not answered for that long is counted lost and
// its run cancelled, since a network that went silent cannot say whether
// the server still holds the lock. With pings after PingEvery of quiet, a
// silent network is found 2–3 s after it fell silent.
//
// The margin: the server frees the lock of a client it no longer hears from
// no sooner than its TCP keepalive gives up on it, 11 s after the last
// packet it received (SessionSetup sets tcp_keepalives_idle 5 s, interval
// 2 s, count 3); a quiet connection exchanges a packet at least every 5 s,
// so that is at least 6 s after the network fell silent, and the run is
// cancelled at least 3 s before another instance can take the lock on the
// same server. After a failover the promoted server holds no lock at all
// and a run elsewhere may start as soon as it accepts connections; the
// fencing token is what refuses the old run's writes there.
const SessionValidity = 3 * time.Second

// WatchConfig configures Session.Watch.
type WatchConfig struct {
	// After is how long from now the watch starts (0: at once). A lock
	// released sooner costs no goroutine; a session lost meanwhile is seen
	// the moment the watch starts, since the read returns what the server
	// sent.
	After time.Duration
	// Every is how much quiet on the socket makes the watch ping.
	Every time.Duration
	// Validity, when set, is confirmed by every ping that succeeds (each
	// ping bounded by it), and the session counts as lost (ErrExpired) when
	// it runs out. Without it a ping is bounded by Every.
	Validity *Validity
}

// Watch starts a Keeper watching s while it holds a lock. The watching
// goroutine blocks reading the connection's socket (pgconn's
// WaitForNotification): a terminated backend or a server shutdown sends a
// FATAL error and closes the socket, which ends the read at once. After
// c.Every of silence it pings, to find a dead network. Pings run with ctx's
// values, not its cancellation; the watch ends when ctx does. When the
// session is lost, onLost is called once, from the watching goroutine.
//
// A network that goes silent (open sockets, no answer) is found by the
// ping's deadline: with c.Validity, at the latest when the validity runs
// out (ErrExpired), that is its length after the send time of the last
// ping answered; without, at most 2×c.Every after the last answer.
func (s *Session) Watch(ctx context.Context, c WatchConfig, onLost func(error)) *Keeper {
	values := context.WithoutCancel(ctx)
	return keep(ctx, c.After, func(stop context.Context) error {
		pc := s.Conn.PgConn()
		for {
			wait, until := c.Every, time.Time{}
			if c.Validity != nil {
				until = c.Validity.Until()
				if wait = min(wait, time.Until(until)); wait <= 0 {
					return ErrExpired
				}
			}
			wctx, wcancel := context.WithTimeout(stop, wait)
			err := pc.WaitForNotification(wctx)
			quiet := wctx.Err() != nil
			wcancel()
			if stop.Err() != nil && !pc.IsClosed() {
				return nil // stopped
			}
			if err == nil {
				continue // a notification; nothing here listens
			}
			if quiet && !pc.IsClosed() {
				sent := time.Now()
				if c.Validity == nil {
					until = sent.Add(c.Every)
				}
				pctx, pcancel := context.WithDeadline(values, until)
				err = pc.Ping(pctx)
				pcancel()
				if err == nil {
					if c.Validity != nil {
						c.Validity.Confirm(sent)
					}
					continue
				}
				if c.Validity != nil && !time.Now().Before(until) {
					// No answer before the validity ran out: a silent
					// network, or a server too slow to count on.
					return ErrExpired
				}
			}
			return err
		}
	}, onLost)
}
