package lockcore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
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

// Ended reports whether err, from a statement on s, means the session has
// ended: the connection is closed and the failure was not a timeout on this
// side (after which the server may still hold the session).
func (s *Session) Ended(err error) bool {
	return s.Conn.IsClosed() && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}
