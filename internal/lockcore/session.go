package lockcore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/store"
)

// ErrPooler means the dedicated connection reaches Postgres through a
// connection pooler (see gate.ErrPooler, which it is).
var ErrPooler = errors.New("gate: connection goes through a pooler; session advisory locks need a direct connection")

// ErrClosed means the sessions cache was closed (see gate.ErrClosed, which
// it is).
var ErrClosed = errors.New("gate: closed")

const (
	// checkIdleAfter: a shared session idle this long is checked (without
	// a round trip) before use.
	checkIdleAfter = time.Second
	// statementBound bounds a statement on a session of its own whose
	// caller set no deadline.
	statementBound = 30 * time.Second
)

// SessionBound is how long a statement or a ping on a shared session (Share)
// may go unanswered before the session is closed, whatever its caller's
// deadline: a statement cut short closes the connection, which frees every
// lock of the process at once, while the runs under them may still be
// ending. It is longer than the server's own bound on a client it no longer
// hears from (11 s, SessionSetup's keepalives): past it, a silent network
// has already cost the server the locks; before it, a slow answer is only a
// slow server or a starved client, and each lock whose validity ran out
// meanwhile is reported lost to its holder (its run cancelled) while the
// session keeps the lock until the holder releases it.
const SessionBound = 15 * time.Second

// SessionName is the application_name of the sessions advisory locks are
// held on: "pgclaim locks hostname:pid".
var SessionName = "pgclaim locks " + ProcessName()

// SetApplicationName sets a dedicated session's application_name to $1
// unless the pool's configuration gave it one (the application's own name
// for its instance says more than ours).
const SetApplicationName = "SELECT set_config('application_name', $1, false) WHERE current_setting('application_name') = ''"

// ErrStandby is the refusal of a lock session opened on a server in
// recovery: it has SQLSTATE 25006 (pgerr.ReadOnly), as a write there would.
var ErrStandby = &pgconn.PgError{Severity: "ERROR", Code: "25006",
	Message: "the lock session reaches a server in recovery (a standby): advisory locks are held on the primary only"}

// ProcessName is "hostname:pid", what names this process's dedicated
// sessions (and what holders default to).
func ProcessName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "unknown"
	}
	return h + ":" + strconv.Itoa(os.Getpid())
}

// Session is a connection taken out of the pool (pgxpool.Conn.Hijack) and
// dedicated to holding advisory locks: all the locks of the Sessions it
// belongs to, which one session holds at once (the server drops them all
// together when it ends). It never goes back to the pool.
//
// A session is used by one caller at a time: Sessions.Get hands it out for
// statements, and Sessions.Put, Session.Watch or Session.Close hand it back;
// Keeper.Stop of a watch takes it again. While nobody runs statements on
// it, one goroutine watches it for all the locks it holds.
type Session struct {
	Conn *pgx.Conn
	Q    *store.Queries // statements on Conn; each answered one confirms the session
	pid  uint32
	c    *Sessions

	// guarded by c.mu
	idleSince time.Time
	watches   map[*watch]struct{}
	keeper    *Keeper // the watch of the idle session; nil while in use
	ended     error   // why the session ended (nil while open)
}

// watch is one lock's watch on a shared session.
type watch struct {
	valid  *Validity // nil: confirmed by pings only
	every  time.Duration
	onLost func(error)
	k      *Keeper
	once   sync.Once // lose or stop, whichever comes first
	taken  sync.Once // Stop takes the session once
	lapse  *time.Timer
}

func (w *watch) lose(err error) {
	w.once.Do(func() {
		if w.lapse != nil {
			w.lapse.Stop()
		}
		w.k.err = err
		if w.onLost != nil {
			w.onLost(err)
		}
		close(w.k.done)
	})
}

// Sessions gives out the one dedicated session its locks are held on, and
// opens another when that one has ended. Whatever the number of locks held
// or tried at once, it holds one connection taken out of Pool. The zero
// value with Pool set is ready to use.
type Sessions struct {
	Pool *pgxpool.Pool
	// Schema qualifies pgclaim's objects in the sessions' statements (nil:
	// found through search_path).
	Schema *qualify.Schema

	shared   bool // by several users (Share): a lapse never closes the session
	once     sync.Once
	use      chan struct{} // a token: exclusive use of cur for statements
	mu       sync.Mutex
	cur      *Session
	inUse    bool
	closed   bool
	reserved map[[2]int32]chan struct{} // closed when the key is free again
	batch    batches                    // TryLockBatched, ReleaseBatched
}

// Reserve claims the advisory key (class, key) within this process before
// the lock is taken on the shared session, waiting up to wait for another
// caller's reservation to end: a session holds an advisory lock any number
// of times, so the server cannot keep two callers of one process apart. ok
// false means another caller here holds or is taking the lock. Call free
// once the lock is released or lost.
func (c *Sessions) Reserve(ctx context.Context, class, key int32, wait time.Duration) (free func(), ok bool) {
	k := [2]int32{class, key}
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		if c.reserved == nil {
			c.reserved = map[[2]int32]chan struct{}{}
		}
		ch, busy := c.reserved[k]
		if !busy {
			ch = make(chan struct{})
			c.reserved[k] = ch
			c.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					c.mu.Lock()
					delete(c.reserved, k)
					c.mu.Unlock()
					close(ch)
				})
			}, true
		}
		c.mu.Unlock()
		if wait <= 0 {
			return nil, false
		}
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
			return nil, false
		case <-ctx.Done():
			return nil, false
		}
	}
}

func (c *Sessions) init() { c.once.Do(func() { c.use = make(chan struct{}, 1) }) }

// take waits for exclusive use of the session, then stops its watch.
func (c *Sessions) take(ctx context.Context) error {
	c.init()
	select {
	case c.use <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	c.inUse = true
	s := c.cur
	var k *Keeper
	if s != nil {
		k, s.keeper = s.keeper, nil
	}
	c.mu.Unlock()
	if k != nil {
		k.Stop()
	}
	return nil
}

// give hands the session back: its watch starts again while locks are held
// on it.
func (c *Sessions) give() {
	c.mu.Lock()
	if !c.inUse {
		c.mu.Unlock()
		return
	}
	c.inUse = false
	var done *Session // closed, and no lock left on it
	if s := c.cur; s != nil {
		s.idleSince = time.Now()
		switch {
		case c.closed && len(s.watches) == 0:
			done = s
		case s.ended == nil && len(s.watches) > 0 && s.keeper == nil:
			s.keeper = s.watchIdle()
		}
	}
	c.mu.Unlock()
	if done != nil {
		done.end(ErrClosed)
	}
	<-c.use
}

// Get returns the dedicated session for statements, once no other caller
// uses it: the current one if it still looks alive, or a new one taken from
// the pool. The caller hands it back with Put, Watch or Close. It returns
// ErrClosed after Close, and an error wrapping ErrPooler behind a connection
// pooler.
func (c *Sessions) Get(ctx context.Context) (*Session, error) {
	if err := c.take(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	closed, s := c.closed, c.cur
	c.mu.Unlock()
	if closed {
		c.give()
		return nil, ErrClosed
	}
	if s != nil {
		c.mu.Lock()
		idle := time.Since(s.idleSince)
		c.mu.Unlock()
		if s.Conn.IsClosed() || (idle >= checkIdleAfter && !s.Alive()) {
			s.end(errors.New("the session ended"))
			s = nil
		} else {
			return s, nil
		}
	}
	// A fresh connection from the pool may turn out dead (the server
	// restarted since the pool last used it); the setup statement changes
	// nothing that matters on a dead session, so one retry is safe.
	s, err := c.open(ctx)
	if err != nil && !errors.Is(err, ErrPooler) && ctx.Err() == nil {
		s, err = c.open(ctx)
	}
	if err != nil {
		c.give()
		return nil, err
	}
	c.mu.Lock()
	c.cur = s
	c.mu.Unlock()
	return s, nil
}

// open takes a connection out of the pool and prepares it for locking.
func (c *Sessions) open(ctx context.Context) (*Session, error) {
	pc, err := c.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("gate: acquire connection: %w", err)
	}
	s := &Session{Conn: pc.Hijack(), c: c, watches: map[*watch]struct{}{}}
	s.Q = store.New(c.Schema.Wrap(bounded{s.Conn, s}))
	row, err := s.Q.SessionSetup(ctx)
	if err != nil {
		CloseConn(s.Conn)
		return nil, fmt.Errorf("gate: prepare lock connection: %w", err)
	}
	s.pid = uint32(row.Pid)
	if announced := s.Conn.PgConn().PID(); announced != s.pid {
		CloseConn(s.Conn)
		return nil, fmt.Errorf("%w (pg_backend_pid %d, announced %d)", ErrPooler, s.pid, announced)
	}
	// pg_stat_activity then tells an operator whose locks the session holds
	// (a name the pool's configuration gives is kept). A standby's advisory
	// locks exclude nobody on the primary: no lock is held there.
	var standby bool
	if err := s.Conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), ("+SetApplicationName+") IS NULL", SessionName).Scan(&standby, new(bool)); err != nil {
		CloseConn(s.Conn)
		return nil, fmt.Errorf("gate: prepare lock connection: %w", err)
	}
	if standby {
		CloseConn(s.Conn)
		return nil, fmt.Errorf("gate: prepare lock connection: %w", ErrStandby)
	}
	return s, nil
}

// Put hands back a session taken with Get (or with a watch's Stop) whose
// statements are done. A session left busy or inside a transaction is
// closed, which drops every lock it held.
func (c *Sessions) Put(s *Session) {
	if s.Conn.IsClosed() || s.Conn.PgConn().IsBusy() || s.Conn.PgConn().TxStatus() != 'I' {
		s.Close()
		return
	}
	c.give()
}

// Close refuses new callers (Get returns ErrClosed) and closes the session
// once no lock is held on it: the locks of runs in progress are kept until
// they are released.
func (c *Sessions) Close() {
	c.init()
	c.use <- struct{}{}
	c.mu.Lock()
	c.closed = true
	c.inUse = true
	c.mu.Unlock()
	c.give()
}

// bounded runs each statement on a session without its caller's
// cancellation (a cancelled statement closes the connection, which would
// drop every other caller's locks): on a shared session within SessionBound
// whatever the caller's deadline, on a session of its own within the
// caller's deadline, or statementBound when it has none.
// Each statement answered confirms the locks held on the session.
type bounded struct {
	conn *pgx.Conn
	s    *Session
}

func (b bounded) boundCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	switch {
	case b.s.c != nil && b.s.c.shared:
		d = time.Now().Add(SessionBound)
	case !ok:
		d = time.Now().Add(statementBound)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), d)
}

func (b bounded) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := b.boundCtx(ctx)
	defer cancel()
	sent := time.Now()
	tag, err := b.conn.Exec(ctx, sql, args...)
	if err == nil {
		b.s.confirm(sent)
	}
	return tag, err
}

func (b bounded) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	// Rows are read after Query returns: no deadline of our own here.
	return b.conn.Query(context.WithoutCancel(ctx), sql, args...)
}

func (b bounded) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, cancel := b.boundCtx(ctx)
	return boundRow{b.conn.QueryRow(ctx, sql, args...), cancel, b.s, time.Now()}
}

type boundRow struct {
	r      pgx.Row
	cancel context.CancelFunc
	s      *Session
	sent   time.Time
}

func (r boundRow) Scan(dest ...any) error {
	defer r.cancel()
	err := r.r.Scan(dest...)
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		r.s.confirm(r.sent)
	}
	return err
}

// Shared reports whether s is the session of a Sessions shared by several
// users (Share).
func (s *Session) Shared() bool { return s.c != nil && s.c.shared }

// Alive reads what the server may have sent an idle session (a FATAL from
// a terminated backend or a shutdown) without writing, and reports whether
// it is still open: a Ping would add a round trip to every use.
func (s *Session) Alive() bool {
	//lint:ignore SA1019 a read-only liveness check is what is wanted here
	return s.Conn.PgConn().CheckConn() == nil && !s.Conn.IsClosed()
}

// Close closes the connection, which makes the server release every lock
// held on it (each watch on it reports the loss), and hands the session
// back.
func (s *Session) Close() {
	s.end(errors.New("the session was closed"))
	if s.c != nil {
		s.c.give()
	}
}

// end closes the session for good: every watch on it is lost with err, and
// its Sessions opens another at the next Get.
func (s *Session) end(err error) {
	CloseConn(s.Conn)
	if s.c == nil {
		return
	}
	s.c.mu.Lock()
	if s.ended == nil {
		s.ended = err
	}
	ws := s.watches
	s.watches = map[*watch]struct{}{}
	if s.c.cur == s {
		s.c.cur = nil
	}
	s.c.mu.Unlock()
	for w := range ws {
		w.lose(err)
	}
}

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
	deadline := time.Now().Add(wait)
	for {
		row, err := s.Q.AdvisoryTryLock(ctx, store.AdvisoryTryLockParams{LockClass: class, LockKey: key})
		left := time.Until(deadline)
		if err != nil || row.Locked || left <= 0 {
			return row.Fence, row.Locked && err == nil, err
		}
		// Waiting on the server would keep the session from every other
		// lock of the process: try again shortly, the session free
		// meanwhile.
		s.c.give()
		t := time.NewTimer(min(retryLockEvery, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		_ = s.c.take(context.Background())
		s.c.mu.Lock()
		gone := s.c.cur != s || s.ended != nil
		s.c.mu.Unlock()
		if gone || s.Conn.IsClosed() {
			return 0, false, errors.New("the session ended while waiting for the lock")
		}
		if ctx.Err() != nil {
			return 0, false, ctx.Err()
		}
	}
}

// retryLockEvery is how often TryLock tries a lock held elsewhere while it
// waits.
const retryLockEvery = 25 * time.Millisecond

// Unlock releases the advisory lock (class, key) held by s and keeps s for
// reuse in c, or closes s when the unlock is not confirmed.
func (c *Sessions) Unlock(ctx context.Context, s *Session, class, key int32) {
	if ok, err := s.Q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: class, LockKey: key}); err != nil || !ok {
		s.Close()
		return
	}
	c.Put(s)
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

// Watch registers a lock held on s and hands s back (as Put does): while
// nobody runs statements on s, one goroutine watches it for every lock held
// on it, blocking on the connection's socket (pgconn's
// WaitForNotification): a terminated backend or a server shutdown sends a
// FATAL error and closes the socket, which ends the read at once. After
// c.Every of silence (the shortest of the locks' settings) it pings, to
// find a dead network. Every ping and every statement answered on s
// confirms c.Validity. When the session is lost, onLost is called once,
// from the watching goroutine, for each lock on it. A lock whose validity
// runs out unconfirmed is lost (ErrExpired): on a shared session (Share)
// that lock alone, whose holder still releases it on the session (a slow
// answer is not a lost session: see SessionBound); on a session of its own
// the session ends, since a session that does not answer may have lost
// every lock.
//
// The returned Keeper's Stop unregisters the lock and takes s again for
// statements (hand it back with Put or Close); Done is closed when the
// session is lost or the watch stopped. ctx is not used for cancellation:
// the watch ends by Stop or with the session. c.After is ignored: the
// session is watched anyway while it holds locks.
func (s *Session) Watch(_ context.Context, c WatchConfig, onLost func(error)) *Keeper {
	k := s.register(c, onLost)
	s.c.give()
	return k
}

// register is Watch without handing s back: the caller still uses it.
func (s *Session) register(c WatchConfig, onLost func(error)) *Keeper {
	w := &watch{valid: c.Validity, every: c.Every, onLost: onLost, k: &Keeper{done: make(chan struct{})}}
	stop := func(take bool) error {
		s.c.mu.Lock()
		_, on := s.watches[w]
		delete(s.watches, w)
		if w.lapse != nil {
			w.lapse.Stop()
		}
		s.c.mu.Unlock()
		first := false
		w.taken.Do(func() { first = true })
		if !first {
			<-w.k.done
			return w.k.err
		}
		if take {
			_ = s.c.take(context.Background())
		}
		if on {
			w.once.Do(func() { close(w.k.done) })
		}
		<-w.k.done
		return w.k.err
	}
	w.k.stopFn = func() error { return stop(true) }
	w.k.detachFn = func() error { return stop(false) }
	s.c.mu.Lock()
	ended := s.ended
	if ended == nil {
		s.watches[w] = struct{}{}
		if s.c.shared && c.Validity != nil {
			s.armLapse(w)
		}
	}
	s.c.mu.Unlock()
	if ended != nil {
		w.lose(ended)
	}
	return w.k
}

// armLapse makes w lost with ErrExpired once its validity runs out
// unconfirmed, whether or not the session is being watched or used
// meanwhile; called with c.mu held.
func (s *Session) armLapse(w *watch) {
	w.lapse = time.AfterFunc(time.Until(w.valid.Until()), func() {
		s.c.mu.Lock()
		if left := time.Until(w.valid.Until()); left > 0 {
			if _, on := s.watches[w]; on {
				w.lapse.Reset(left)
			}
			s.c.mu.Unlock()
			return
		}
		_, on := s.watches[w]
		delete(s.watches, w)
		s.c.mu.Unlock()
		if on {
			w.lose(ErrExpired)
		}
	})
}

// watchIdle starts the watch of an idle session holding locks; called with
// c.mu held.
func (s *Session) watchIdle() *Keeper {
	return keep(context.Background(), 0, func(stop context.Context) error {
		pc := s.Conn.PgConn()
		for {
			every, until := PingEvery, time.Time{}
			s.c.mu.Lock()
			for w := range s.watches {
				if w.every > 0 {
					every = min(every, w.every)
				}
				if w.valid != nil && !s.c.shared {
					if u := w.valid.Until(); until.IsZero() || u.Before(until) {
						until = u
					}
				}
			}
			s.c.mu.Unlock()
			wait := every
			if !until.IsZero() {
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
				switch {
				case s.c.shared:
					until = sent.Add(SessionBound)
				case until.IsZero():
					until = sent.Add(every)
				}
				pctx, pcancel := context.WithDeadline(context.Background(), until)
				err = pc.Ping(pctx)
				pcancel()
				if err == nil {
					s.confirm(sent)
					continue
				}
				if !time.Now().Before(until) {
					if s.c.shared {
						return fmt.Errorf("no answer to a ping for %v", SessionBound)
					}
					// No answer before a validity ran out: a silent
					// network, or a server too slow to count on.
					return ErrExpired
				}
			}
			return err
		}
	}, func(err error) { s.end(err) })
}

// confirm extends the validity of every lock on s after an answer to a
// statement sent at sent.
func (s *Session) confirm(sent time.Time) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	for w := range s.watches {
		if w.valid != nil {
			w.valid.Confirm(sent)
		}
	}
}

// shared holds the Sessions of each pool that its users share (Share).
var shared = struct {
	mu sync.Mutex
	m  map[sharedKey]*Sessions
	n  map[*Sessions]int // users of each
}{m: map[sharedKey]*Sessions{}, n: map[*Sessions]int{}}

// sharedKey is what users share a Sessions by: the pool and the schema of
// pgclaim's objects its statements name.
type sharedKey struct {
	pool   *pgxpool.Pool
	schema string
}

// Ref is one user's share of the Sessions of a pool: every Gate and
// Scheduler of a process on the same pool holds its advisory locks on one
// session. Close ends this user's share; the session closes once the last
// user's is ended and no lock is held on it.
type Ref struct {
	*Sessions
	closed atomic.Bool
}

// Share returns a share of pool's Sessions for pgclaim's objects in schema
// (nil: found through search_path), created at the first share.
func Share(pool *pgxpool.Pool, schema *qualify.Schema) *Ref {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	k := sharedKey{pool, schema.Name()}
	c := shared.m[k]
	if c == nil {
		c = &Sessions{Pool: pool, Schema: schema, shared: true}
		shared.m[k] = c
	}
	shared.n[c]++
	return &Ref{Sessions: c}
}

// Get is Sessions.Get for this user: ErrClosed once it has closed its share.
func (r *Ref) Get(ctx context.Context) (*Session, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	return r.Sessions.Get(ctx)
}

// TryLockBatched is Sessions.TryLockBatched for this user: ErrClosed once
// it has closed its share.
func (r *Ref) TryLockBatched(req LockRequest) (Locked, bool, error) {
	if r.closed.Load() {
		return Locked{}, false, ErrClosed
	}
	return r.Sessions.TryLockBatched(req)
}

// Close ends this user's share.
func (r *Ref) Close() {
	if r.closed.Swap(true) {
		return
	}
	c := r.Sessions
	shared.mu.Lock()
	shared.n[c]--
	last := shared.n[c] == 0
	if last {
		delete(shared.n, c)
		if k := (sharedKey{c.Pool, c.Schema.Name()}); shared.m[k] == c {
			delete(shared.m, k)
		}
	}
	shared.mu.Unlock()
	if last {
		c.Close()
	}
}
