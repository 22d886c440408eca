package gate

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/pgclaim/pgclaim/internal/lockcore"
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
var ErrPooler = lockcore.ErrPooler

// pingEvery: while a lock is held the watcher blocks on the socket, so a
// terminated backend or a server shutdown is seen at once; a silent network
// is found by pinging after this much quiet (lockcore.PingEvery), and a
// session not confirmed for sessionValidity is lost. A variable only so
// tests can change it.
var pingEvery = lockcore.PingEvery

// sessionValidity is how long one confirmation of a run's session keeps
// the run going (lockcore.SessionValidity: see there for the margin).
const sessionValidity = lockcore.SessionValidity

// watchAfter is how long into a run the watcher starts. Starting it costs a
// goroutine and a hand-over between threads when it is stopped, which was
// about a tenth of a whole Once cycle for a job that returns at once. A job
// that returns sooner is not watched; its release statement then finds a
// session that has ended (and the run reports the lost lock). A session lost
// earlier is seen the moment the watcher starts, since the read returns what
// the server sent meanwhile. A variable only so tests can change it.
var watchAfter = time.Millisecond

// Exclusive runs fn while holding the session advisory lock for name (see
// AdvisoryKey), and returns fn's error. It does not consult the ledger: use
// it for work that must not overlap but is not tied to a scheduled instant.
//
// The lock is taken with pg_try_advisory_lock on a connection taken out of
// the pool, so it is never handed to other code while locked; it is released
// with an explicit pg_advisory_unlock before the connection is reused, and
// the connection is closed instead whenever the unlock is not confirmed.
// Run.Fence carries a fencing token from pgclaim_fence(); the statement
// that grants it also writes a WAL record, so that it is durable (and,
// under synchronous replication, on the standby) before fn runs.
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
	lockcore.GrowStack() // see there: work is often started on a new goroutine
	if err := checkName("name", name); err != nil {
		return err
	}
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	class, key := schemaKey(g.opts.Schema, name)
	free, ok := g.sessions.Reserve(ctx, class, key, g.wait)
	if !ok {
		return g.skipped(ctx, name, time.Time{}, ErrHeld)
	}
	s, err := g.sessions.Get(ctx)
	if err != nil {
		free()
		return err
	}
	sent := time.Now()
	fence, ok, err := g.lock(ctx, s, name, class, key)
	if err != nil {
		free()
		return explain(ctx, g.pool, g.schema, err)
	}
	if !ok {
		free()
		return g.skipped(ctx, name, time.Time{}, ErrHeld)
	}
	run := Run{Name: name, Holder: g.opts.Holder, Fence: fence}
	return g.hold(ctx, s, sent, run, fn, lockRelease{class: class, key: key}, free)
}

// lock takes the advisory lock (class, key) for name on s, waiting up to
// Config.LockWait. When it is held elsewhere (ok false) s goes back to the
// cache; on error s is closed (a failed statement may leave the lock held).
func (g *Gate) lock(ctx context.Context, s *lockcore.Session, name string, class, key int32) (fence int64, ok bool, err error) {
	fence, ok, err = s.TryLock(ctx, class, key, g.wait)
	switch {
	case err != nil:
		s.Close()
		return 0, false, fmt.Errorf("gate: %q: take advisory lock: %w", name, err)
	case !ok:
		g.sessions.Put(s)
	}
	return fence, ok, nil
}

// releaser ends a run held on a session.
type releaser interface {
	// release ends the run on s, which should still hold the lock, and
	// unlocks; unlocked reports whether the lock was still held.
	release(ctx context.Context, s *lockcore.Session, run Run, out Outcome, jobErr error) (unlocked bool, err error)
	// record writes the outcome without the session, after it was lost.
	record(ctx context.Context, run Run, out Outcome, jobErr error) error
}

// lockRelease ends an Exclusive run: unlock only.
type lockRelease struct{ class, key int32 }

func (r lockRelease) release(ctx context.Context, s *lockcore.Session, _ Run, _ Outcome, _ error) (bool, error) {
	return s.Q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: r.class, LockKey: r.key})
}

func (lockRelease) record(context.Context, Run, Outcome, error) error { return nil }

// hold runs fn while s holds the run's lock (the advisory session
// implementation of lockcore.Held: s watched while fn runs, released or
// dropped afterwards) and reports the run. sent is when the statement that
// took the lock was sent: the session counts as confirmed from then for
// sessionValidity.
func (g *Gate) hold(ctx context.Context, s *lockcore.Session, sent time.Time, run Run, fn Func, r releaser, free func()) error {
	g.opts.emit(ctx, Event{Kind: EventAcquired, Name: run.Name, FireAt: run.FireAt, Holder: run.Holder, Fence: run.Fence})
	h := &sessionHold{g: g, s: s, run: run, r: r, free: free}
	var cancel context.CancelCauseFunc
	h.ctx, cancel = context.WithCancelCause(context.Background())
	valid := lockcore.NewValidity(sent, sessionValidity, nil)
	h.keeper = s.Watch(ctx, lockcore.WatchConfig{After: watchAfter, Every: pingEvery, Validity: valid}, func(cause error) {
		if errors.Is(cause, lockcore.ErrExpired) {
			cause = fmt.Errorf("session not confirmed for %v (a silent network?)", sessionValidity)
		}
		h.lost = fmt.Errorf("%w: %q: %v", ErrLockLost, run.Name, cause)
		cancel(h.lost)
		g.opts.emit(ctx, h.lostEvent(h.lost))
	})
	return g.opts.runHeld(ctx, run, h, fn, true)
}

// sessionHold is a run's hold of an advisory lock on a dedicated session.
type sessionHold struct {
	g      *Gate
	s      *lockcore.Session
	run    Run
	r      releaser
	free   func()          // ends the lock's reservation in this process (Sessions.Reserve)
	ctx    context.Context // cancelled when the watcher finds the session lost
	keeper *lockcore.Keeper
	lost   error // what the watcher reported; read after keeper.Stop
}

func (h *sessionHold) Context() context.Context { return h.ctx }

func (h *sessionHold) lostEvent(err error) Event {
	return Event{Kind: EventLost, Name: h.run.Name, FireAt: h.run.FireAt, Holder: h.run.Holder, Fence: h.run.Fence, Err: err}
}

// Release stops the watch, then ends the run on the session (unlocking) and
// keeps the session for reuse; a session that ended, or whose unlock was not
// confirmed, is closed, which frees the lock on the server, and the outcome
// is written through the pool instead. A run whose session was not
// confirmed in time (the watch's validity ran out) while the shared session
// stayed open is ended as lost on the session, which keeps every other lock
// of the process (lockcore.SessionBound).
func (h *sessionHold) Release(ctx context.Context, out lockcore.Outcome, jobErr error) (error, error) {
	g, s, run := h.g, h.s, h.run
	defer h.free()
	lost := h.keeper.Stop()
	lapsed := errors.Is(lost, lockcore.ErrExpired) && s.Shared() && !s.Conn.IsClosed()
	if lost == nil || lapsed {
		if lapsed {
			out, jobErr = lockcore.Lost, h.lostText(jobErr)
		}
		// A session that does not answer within its validity is closed
		// (which frees the lock) rather than waited for.
		sctx, cancel := context.WithTimeout(ctx, sessionValidity)
		unlocked, err := h.r.release(sctx, s, run, Outcome(out), jobErr)
		cancel()
		switch {
		case err != nil && s.Ended(err):
			// The session ended while the job ran, or before the release
			// (for a short job that was not watched): the lock went with it.
			lost = err
		case err != nil:
			// Closing the connection frees the lock on the server.
			s.Close()
			g.opts.Logger.ErrorContext(ctx, "gate: release advisory lock", "name", run.Name, "error", err)
			h.record(ctx, Outcome(out), jobErr)
			return h.lost, nil
		case !unlocked && !lapsed:
			lost = errors.New("the session no longer held the lock at release")
		default:
			g.sessions.Put(s)
			return h.lost, nil
		}
	}
	s.Close()
	if h.lost == nil { // found at release, not by the watcher
		h.lost = fmt.Errorf("%w: %q: %v", ErrLockLost, run.Name, lost)
		g.opts.emit(ctx, h.lostEvent(h.lost))
	}
	h.record(ctx, OutcomeLost, h.lostText(jobErr))
	return h.lost, nil
}

// lostText is what a lost run records: the loss, and the job's own error
// when it is more than the loss.
func (h *sessionHold) lostText(jobErr error) error {
	if jobErr != nil && !errors.Is(jobErr, ErrLockLost) && !errors.Is(jobErr, context.Canceled) {
		return fmt.Errorf("%v; job: %v", h.lost, jobErr)
	}
	return h.lost
}

// record writes the run's outcome through the pool, logging a failure.
func (h *sessionHold) record(ctx context.Context, out Outcome, jobErr error) {
	if err := h.r.record(ctx, h.run, out, jobErr); err != nil {
		h.g.opts.Logger.ErrorContext(ctx, "gate: record outcome", "name", h.run.Name, "outcome", string(out), "error", err)
	}
}
