package gate

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/store"
)

// AdvisoryClass is the first half of every advisory lock key pgclaim takes:
// the bytes "pgcl" read as a big-endian int32 (0x7067636c = 1885823852).
//
// pgclaim uses the two-int4 form pg_advisory_lock(int4, int4). Postgres keeps
// that form apart from the single-bigint form (pg_locks.objsubid is 2 rather
// than 1), so pgclaim's locks can never collide with a bigint-keyed advisory
// lock taken by anything else in the database (goose, application code,
// other libraries), and a two-int4 user collides only if it picks this same
// class. It also makes pgclaim's locks easy to list:
//
//	SELECT * FROM pg_locks
//	WHERE locktype = 'advisory' AND classid = 1885823852 AND objsubid = 2;
const AdvisoryClass int32 = 0x7067636c

// AdvisoryKey returns the advisory lock key guarding name: AdvisoryClass and
// the 32-bit FNV-1a hash of name's UTF-8 bytes, read as an int32.
//
// The mapping is part of pgclaim's compatibility promise: every build and
// version computes the same key for the same name, so instances running
// different releases still exclude each other. Two names whose hashes
// collide (about one pair in 2^32) would exclude each other too; that costs
// a skipped run, never a double one.
func AdvisoryKey(name string) (class, key int32) {
	h := fnv.New32a()
	h.Write([]byte(name))
	return AdvisoryClass, int32(h.Sum32())
}

// ErrPooler means the dedicated connection reaches Postgres through a
// connection pooler: the backend pid reported by pg_backend_pid() differs
// from the one announced when the connection was opened. Session advisory
// locks cannot be trusted there (under transaction pooling the lock stays on
// a server connection other clients then use), so advisory exclusion
// refuses to run. Use the ledger alone (Config.LedgerOnly) with a lease lock,
// or connect directly.
var ErrPooler = errors.New("gate: connection goes through a pooler; session advisory locks need a direct connection")

const (
	// maxIdleSessions is how many dedicated connections a Gate keeps for
	// reuse once their lock is released: enough for as many jobs running at
	// once, so a busy gate does not open a connection per run.
	maxIdleSessions = 16
	// maxIdleTime: a kept connection unused this long is closed.
	maxIdleTime = time.Minute
	// checkIdleAfter: a cached session idle this long is checked (without
	// a round trip) before reuse.
	checkIdleAfter = time.Second
	// releaseTimeout bounds the unlock and the outcome write after a run,
	// which go ahead even when the caller's context has ended.
	releaseTimeout = 10 * time.Second
)

// pingEvery: while a lock is held the watcher blocks on the socket, so a
// terminated backend or a server shutdown is seen at once; a silent network
// failure is found by a ping after this much quiet, answered within as long.
// A variable only so tests can shorten it.
var pingEvery = 5 * time.Second

// watchAfter is how long into a run the watcher starts. Starting it costs a
// goroutine and a hand-over between threads when it is stopped, which was
// about a tenth of a whole Once cycle for a job that returns at once. A job
// that returns sooner is not watched; its release statement then finds a
// session that has ended (and the run reports the lost lock). A session lost
// earlier is seen the moment the watcher starts, since the read returns what
// the server sent meanwhile. A variable only so tests can change it.
var watchAfter = time.Millisecond

// session is a connection taken out of the pool (pgxpool.Conn.Hijack) and
// dedicated to holding advisory locks. It never goes back to the pool: after
// an explicit, confirmed unlock it is kept in the gate's own small cache,
// otherwise it is closed, which makes the server drop any lock it held.
type session struct {
	conn      *pgx.Conn
	q         *store.Queries
	pid       uint32
	idleSince time.Time
}

// sessions is a Gate's cache of idle dedicated connections.
type sessions struct {
	pool   *pgxpool.Pool
	mu     sync.Mutex
	idle   []*session
	closed bool
}

// get returns a dedicated session: a cached one that still looks alive, or a
// new one taken from the pool.
func (c *sessions) get(ctx context.Context) (*session, error) {
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
		if time.Since(s.idleSince) >= checkIdleAfter {
			// Reads what the server may have sent meanwhile (a FATAL
			// from a terminated backend or a shutdown) without writing:
			// a Ping would add a round trip to every Once.
			//lint:ignore SA1019 a read-only liveness check is what is wanted here
			if err := s.conn.PgConn().CheckConn(); err != nil || s.conn.IsClosed() {
				s.close()
				continue
			}
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
func (c *sessions) open(ctx context.Context) (*session, error) {
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("gate: acquire connection: %w", err)
	}
	s := &session{conn: pc.Hijack()}
	s.q = store.New(s.conn)
	row, err := s.q.SessionSetup(ctx)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("gate: prepare lock connection: %w", err)
	}
	s.pid = uint32(row.Pid)
	if announced := s.conn.PgConn().PID(); announced != s.pid {
		s.close()
		return nil, fmt.Errorf("%w (pg_backend_pid %d, announced %d)", ErrPooler, s.pid, announced)
	}
	return s, nil
}

// put caches a session whose locks are all released, or closes it.
func (c *sessions) put(s *session) {
	if s.conn.IsClosed() || s.conn.PgConn().IsBusy() || s.conn.PgConn().TxStatus() != 'I' {
		s.close()
		return
	}
	s.idleSince = time.Now()
	c.mu.Lock()
	if c.closed || len(c.idle) >= maxIdleSessions {
		c.mu.Unlock()
		s.close()
		return
	}
	c.idle = append(c.idle, s)
	// get takes the most recently used, so the oldest sit at the front;
	// close those idle too long.
	var stale []*session
	for len(c.idle) > 0 && s.idleSince.Sub(c.idle[0].idleSince) > maxIdleTime {
		stale = append(stale, c.idle[0])
		c.idle[0] = nil
		c.idle = c.idle[1:]
	}
	c.mu.Unlock()
	for _, s := range stale {
		s.close()
	}
}

// close closes every idle session and refuses new ones.
func (c *sessions) close() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.closed = true
	c.mu.Unlock()
	for _, s := range idle {
		s.close()
	}
}

// close closes the connection; the server then releases its locks.
func (s *session) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.conn.Close(ctx)
	// After a timed-out statement pgconn closes in the background, first
	// sending a cancel request that can wait up to 15 s. Cut the socket now
	// so the server sees the session end and frees its locks.
	_ = s.conn.PgConn().Conn().Close()
}

// tryLock takes the advisory lock for key, waiting up to wait (0: not at
// all). It returns a fencing token; ErrHeld when another session holds the
// lock.
func (s *session) tryLock(ctx context.Context, class, key int32, wait time.Duration) (int64, error) {
	if wait <= 0 {
		row, err := s.q.AdvisoryTryLock(ctx, store.AdvisoryTryLockParams{LockClass: class, LockKey: key})
		if err != nil {
			return 0, err
		}
		if !row.Locked {
			return 0, ErrHeld
		}
		return row.Fence, nil
	}
	fence, err := s.q.AdvisoryLockWait(ctx, store.AdvisoryLockWaitParams{
		LockTimeout: lockTimeout(wait),
		LockClass:   class,
		LockKey:     key,
	})
	if isLockTimeout(err) {
		return 0, ErrHeld
	}
	return fence, err
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

// watcher watches a session while it holds a lock.
type watcher struct {
	stopWatch context.CancelFunc
	start     *time.Timer // starts the watch after watchAfter
	done      chan struct{}
	err       error // why the session was lost; read after done
}

// watch starts watching s, watchAfter from now. The watching goroutine
// blocks reading the connection's socket (pgconn's WaitForNotification): a
// terminated backend or a server shutdown sends a FATAL error and closes the
// socket, which ends the read at once. After pingEvery of silence it pings,
// to find a dead network. When the session is lost, onLost is called once,
// from the watching goroutine.
func (s *session) watch(onLost func(error)) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{stopWatch: cancel, done: make(chan struct{})}
	w.start = time.AfterFunc(watchAfter, func() {
		defer close(w.done)
		pc := s.conn.PgConn()
		for {
			wctx, wcancel := context.WithTimeout(ctx, pingEvery)
			err := pc.WaitForNotification(wctx)
			quiet := wctx.Err() != nil
			wcancel()
			if ctx.Err() != nil && !pc.IsClosed() {
				return // stopped
			}
			if err == nil {
				continue // a notification; nothing here listens
			}
			if quiet && !pc.IsClosed() {
				pctx, pcancel := context.WithTimeout(context.Background(), pingEvery)
				err = pc.Ping(pctx)
				pcancel()
				if err == nil {
					continue
				}
			}
			w.err = err
			onLost(err)
			return
		}
	})
	return w
}

// stop ends the watch and returns why the session was lost, or nil. The
// session is usable again once stop returns nil.
func (w *watcher) stop() error {
	w.stopWatch()
	if w.start.Stop() {
		return nil // never started
	}
	<-w.done
	return w.err
}

// Exclusive runs fn while holding the session advisory lock for name (see
// AdvisoryKey), and returns fn's error. It does not consult the ledger: use
// it for work that must not overlap but is not tied to a scheduled instant.
//
// The lock is taken with pg_try_advisory_lock on a connection taken out of
// the pool, so it is never handed to other code while locked; it is released
// with an explicit pg_advisory_unlock before the connection is reused, and
// the connection is closed instead whenever the unlock is not confirmed.
// Run.Fence carries a fencing token from pgclaim_fence_seq.
//
// While fn runs, a goroutine blocks reading that connection. If the session
// is lost (its backend terminated, the server restarted, the network
// failed), fn's context is cancelled at once with a cause wrapping
// ErrLockLost, EventLost is reported, and Exclusive returns an error
// wrapping ErrLockLost after fn returns. fn should stop promptly: another
// instance may take the lock as soon as the server has dropped the session.
//
// When another session holds the lock, Exclusive returns an error wrapping
// ErrHeld (and ErrSkipped) at once, or after Config.LockWait if set. Behind
// a pooler it refuses with ErrPooler.
func (g *Gate) Exclusive(ctx context.Context, name string, fn Func) error {
	if err := checkName("name", name); err != nil {
		return err
	}
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	s, err := g.sessions.get(ctx)
	if err != nil {
		return err
	}
	class, key := AdvisoryKey(name)
	fence, err := s.tryLock(ctx, class, key, g.wait)
	if err != nil {
		if errors.Is(err, ErrHeld) {
			g.sessions.put(s)
			return g.skipped(ctx, name, time.Time{}, ErrHeld)
		}
		s.close() // a failed statement may leave the lock held: drop the session
		return fmt.Errorf("gate: %q: take advisory lock: %w", name, err)
	}
	run := Run{Name: name, Holder: g.opts.Holder, Fence: fence}
	return g.hold(ctx, s, run, fn, lockRelease{class: class, key: key})
}

// releaser ends a run held on a session.
type releaser interface {
	// release ends the run on s, which should still hold the lock, and
	// unlocks; unlocked reports whether the lock was still held.
	release(ctx context.Context, s *session, run Run, out Outcome, jobErr error) (unlocked bool, err error)
	// record writes the outcome without the session, after it was lost.
	record(ctx context.Context, run Run, out Outcome, jobErr error) error
}

// lockRelease ends an Exclusive run: unlock only.
type lockRelease struct{ class, key int32 }

func (r lockRelease) release(ctx context.Context, s *session, _ Run, _ Outcome, _ error) (bool, error) {
	return s.q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: r.class, LockKey: r.key})
}

func (lockRelease) record(context.Context, Run, Outcome, error) error { return nil }

// hold runs fn while s holds the run's lock, watching s, then releases the
// lock (or drops the session) and reports the outcome.
func (g *Gate) hold(ctx context.Context, s *session, run Run, fn Func, r releaser) error {
	g.opts.emit(ctx, Event{Kind: EventAcquired, Name: run.Name, FireAt: run.FireAt, Holder: run.Holder, Fence: run.Fence})
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := s.watch(func(cause error) {
		err := fmt.Errorf("%w: %q: %v", ErrLockLost, run.Name, cause)
		cancel(err)
		g.opts.emit(ctx, Event{Kind: EventLost, Name: run.Name, FireAt: run.FireAt, Holder: run.Holder, Fence: run.Fence, Err: err})
	})
	start := time.Now()
	panicked, fnErr := callJob(runCtx, fn, run)
	d := time.Since(start)
	lost := w.stop()
	watched := lost != nil // the watcher reported the loss

	out := outcomeOf(ctx, fnErr)
	if panicked != nil {
		out, fnErr = OutcomeAbandoned, panicError(panicked)
	}
	// The unlock and the outcome are written even if ctx has ended.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer rcancel()
	var lostErr error
	if lost == nil {
		unlocked, err := r.release(rctx, s, run, out, fnErr)
		switch {
		case err != nil && sessionEnded(s, err):
			// The session ended while the job ran, or before the release
			// (for a short job that was not watched): the lock went with it.
			lost = err
		case err != nil:
			// Closing the connection frees the lock on the server.
			s.close()
			g.opts.Logger.ErrorContext(ctx, "gate: release advisory lock", "name", run.Name, "error", err)
			if err := r.record(rctx, run, out, fnErr); err != nil {
				g.opts.Logger.ErrorContext(ctx, "gate: record outcome", "name", run.Name, "outcome", string(out), "error", err)
			}
		case !unlocked:
			s.close()
			lost = errors.New("the session no longer held the lock at release")
		default:
			g.sessions.put(s)
		}
	}
	if lost != nil {
		s.close()
		lostErr = fmt.Errorf("%w: %q: %v", ErrLockLost, run.Name, lost)
		if !watched {
			g.opts.emit(ctx, Event{Kind: EventLost, Name: run.Name, FireAt: run.FireAt, Holder: run.Holder, Fence: run.Fence, Err: lostErr})
		}
		text := lostErr
		if fnErr != nil && !errors.Is(fnErr, ErrLockLost) && !errors.Is(fnErr, context.Canceled) {
			text = fmt.Errorf("%v; job: %v", lostErr, fnErr)
		}
		out = OutcomeLost
		if err := r.record(rctx, run, out, text); err != nil {
			g.opts.Logger.ErrorContext(ctx, "gate: record outcome", "name", run.Name, "outcome", string(out), "error", err)
		}
	}
	ev := finished(run, out, d, fnErr)
	if lostErr != nil {
		ev.Err = lostErr
	}
	g.opts.emit(ctx, ev)
	if panicked != nil {
		panic(panicked)
	}
	if lostErr != nil {
		if fnErr != nil && !errors.Is(fnErr, ErrLockLost) {
			return fmt.Errorf("%w (job: %w)", lostErr, fnErr)
		}
		return lostErr
	}
	return fnErr
}

// sessionEnded reports whether err, from a statement on s, means the
// session has ended: the connection is closed and the failure was not a
// timeout on this side (after which the server may still hold the session).
func sessionEnded(s *session, err error) bool {
	return s.conn.IsClosed() && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// callJob calls fn and recovers a panic, returned as panicked.
func callJob(ctx context.Context, fn Func, run Run) (panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	return nil, fn(ctx, run)
}

// panicError is the error recorded for a job that panicked.
func panicError(p any) error { return fmt.Errorf("gate: job panicked: %v", p) }
