package gate

// A term: one leadership of this instance, from the lock or lease that
// began it to the close recorded in pgclaim_terms; its watcher, its
// step-down and its end.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/store"
)

// term is one leadership of this instance.
type term struct {
	e        *Elector
	fence    int64
	start    time.Time
	deferEnd bool
	sess     *lockcore.Session // advisory variant: the connection holding the lock
	sq       *store.Queries    // queries on sess

	// spare (advisory variant) is a second dedicated connection, opened
	// once the term has started, on which the term is closed when sess
	// has ended: the pool may hold no idle connection then (sess was
	// taken out of it), and the successor waits for the close, which
	// would otherwise wait for a connect. nil until opened, and after
	// takeSpare.
	spareMu   sync.Mutex
	spare     *lockcore.Session
	spareDone bool // takeSpare was called: a spare opened later is closed

	ctx    context.Context // cancelled when leadership ends
	cancel context.CancelCauseFunc
	obsCtx context.Context // the campaign's values, for events found by the watcher

	valid    *lockcore.Validity // confirmed until (instance clock); step down after
	keeper   *lockcore.Keeper   // confirms the lock or lease
	acquired chan struct{}      // closed once EventAcquired was reported
	watchEnd chan struct{}      // closed when the keeper has ended

	resigned atomic.Bool
	crashed  atomic.Bool // tests: end like a dead process, closing nothing

	stepped atomic.Bool // leadership ended locally

	mu   sync.Mutex
	lost error

	endOnce sync.Once
	endDone chan struct{}
	endErr  error
}

func (e *Elector) newTerm(fence int64, sent time.Time, deferEnd bool) *term {
	t := &term{
		e: e, fence: fence, start: sent, deferEnd: deferEnd,
		valid:    lockcore.NewValidity(sent, e.validity(), nil),
		acquired: make(chan struct{}),
		watchEnd: make(chan struct{}),
		endDone:  make(chan struct{}),
	}
	t.ctx, t.cancel = context.WithCancelCause(context.Background())
	return t
}

// validity is how long one confirmation of the lock or lease keeps this
// instance leading: 3/4 TTL, a quarter short of the earliest moment a
// standby can take over without the old leader's hand-over.
func (e *Elector) validity() time.Duration { return e.o.TTL - e.o.TTL/4 }

// checkEvery is how often a leader confirms its lock or lease.
func (e *Elector) checkEvery() time.Duration { return e.o.TTL / 4 }

func (t *term) lostErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lost
}

// stepDown ends the leadership locally, once: IsLeader turns false, then the
// leadership context is cancelled. A non-nil why marks the leadership lost
// and is reported.
func (t *term) stepDown(why error) {
	t.mu.Lock()
	if t.stepped.Load() {
		t.mu.Unlock()
		return
	}
	t.stepped.Store(true)
	t.lost = why
	t.mu.Unlock()
	if why != nil {
		t.cancel(why)
		t.e.in.emit(t.obsCtx, Event{Kind: EventLost, Name: t.e.name, Holder: t.e.o.Holder, Fence: t.fence, Err: why})
	} else {
		t.cancel(context.Canceled)
	}
}

// keep starts the term's keeper, confirming the lock (advisory variant) or
// renewing the lease every TTL/4 with the campaign's values; it steps down
// when the keeper finds the term lost.
func (t *term) keep() {
	onLost := func(err error) {
		<-t.acquired // report the loss after the acquisition
		t.stepDown(t.lossErr(err))
	}
	if t.sess != nil {
		t.keeper = t.sess.Watch(t.obsCtx, lockcore.WatchConfig{Every: t.e.checkEvery(), Validity: t.valid}, onLost)
	} else {
		t.keeper = t.e.renewLease(t, onLost)
	}
}

// stopWatch stops the keeper.
func (t *term) stopWatch() { t.keeper.Stop() }

// watch waits for the keeper to end, then (for a lost term not run by Run)
// closes the term.
func (t *term) watch() {
	<-t.keeper.Done()
	close(t.watchEnd)
	if t.lostErr() != nil && !t.deferEnd {
		ctx, cancel := releaseCtx(t.obsCtx)
		_ = t.end(ctx, reasonLost)
		cancel()
	}
}

// end closes the term, once: it steps down, stops the watcher, records
// ended_at and releases the lock (advisory) — in that order, so a standby
// that gets the lock finds the term closed. Concurrent callers wait for the
// first one.
func (t *term) end(ctx context.Context, reason string) error {
	t.endOnce.Do(func() {
		defer close(t.endDone)
		t.stepDown(nil)
		t.stopWatch()
		<-t.watchEnd
		e := t.e
		spare := t.takeSpare()
		spareUsed := false
		defer func() {
			switch {
			case spare == nil:
			case spareUsed && !t.crashed.Load():
				e.keepNext(spare)
			default:
				spare.Close()
			}
		}()
		if t.crashed.Load() {
			if t.sess != nil {
				t.sess.Close()
			}
			e.cur.CompareAndSwap(t, nil)
			return
		}
		// A term not closed within TTL is superseded by the next leader
		// anyway (and the advisory lock freed when the session is
		// closed): the statements go no longer than that.
		ctx, cancel := context.WithTimeout(ctx, e.o.TTL)
		defer cancel()
		p := store.EndTermParams{Election: e.name, Term: t.fence, Reason: reason}
		// On the term's session while it lives, else on the spare, else
		// through the pool.
		err := errors.New("no session")
		if t.sess != nil && !t.sess.Conn.IsClosed() {
			_, err = t.sq.EndTerm(ctx, p)
		}
		if err != nil && spare != nil && !spare.Conn.IsClosed() {
			sctx, cancel := context.WithTimeout(ctx, e.checkEvery())
			_, err = store.New(t.e.schema.Wrap(oneTrip{spare.Conn})).EndTerm(sctx, p)
			cancel()
			spareUsed = err == nil
			if err != nil {
				e.o.Logger.DebugContext(ctx, "gate: close term on the spare connection failed; closing it through the pool", "name", e.name, "holder", e.o.Holder, "fence", t.fence, "error", err.Error())
			}
		}
		if err != nil {
			err = e.endTermRetrying(ctx, p)
		}
		if err != nil {
			err = fmt.Errorf("gate: election %q: close term %d: %w", e.name, t.fence, err)
		}
		if t.sess != nil {
			if !t.sess.Conn.IsClosed() {
				ok, uerr := t.sq.ElectionUnlock(ctx, store.ElectionUnlockParams{LockClass: e.class, LockKey: e.key})
				switch {
				case uerr != nil:
					e.o.Logger.WarnContext(ctx, "gate: election unlock failed; closing the session", "name", e.name, "holder", e.o.Holder, "fence", t.fence, "error", uerr.Error())
				case !ok:
					e.o.Logger.WarnContext(ctx, "gate: election lock was not held at resign", "name", e.name, "holder", e.o.Holder, "fence", t.fence)
				}
			}
			t.sess.Close()
		}
		t.endErr = err
		e.cur.CompareAndSwap(t, nil)
		if reason == reasonResigned && t.lostErr() == nil {
			e.in.emit(ctx, Event{Kind: EventReleased, Name: e.name, Holder: e.o.Holder, Fence: t.fence, Duration: time.Since(t.start)})
		}
	})
	select {
	case <-t.endDone:
		return t.endErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openSpare opens the term's spare connection in the background (advisory
// variant). A failure leaves the term without one: its close then goes
// through the pool, as it would for a server that restarted.
func (t *term) openSpare() {
	go func() {
		ctx, cancel := context.WithTimeout(t.obsCtx, t.e.o.TTL)
		defer cancel()
		s, err := (&lockcore.Sessions{Pool: t.e.pool, Schema: t.e.schema}).Get(ctx)
		if err != nil {
			t.e.o.Logger.DebugContext(ctx, "gate: open the term's spare connection", "name", t.e.name, "holder", t.e.o.Holder, "fence", t.fence, "error", err.Error())
			return
		}
		t.spareMu.Lock()
		done := t.spareDone
		if !done {
			t.spare = s
		}
		t.spareMu.Unlock()
		if done {
			s.Close()
		}
	}()
}

// takeSpare returns the spare connection (nil when none was opened) for
// the caller to close, and has one opened later closed.
func (t *term) takeSpare() *lockcore.Session {
	t.spareMu.Lock()
	defer t.spareMu.Unlock()
	s := t.spare
	t.spare, t.spareDone = nil, true
	return s
}

// endTermRetrying closes a term through the pool. Failures (the server is
// restarting, the pool's connections died with it) are retried for up to
// TTL: until the term is closed, a successor waits for it, at most TTL.
func (e *Elector) endTermRetrying(ctx context.Context, p store.EndTermParams) error {
	deadline := time.Now().Add(e.o.TTL)
	delay := 20 * time.Millisecond
	for {
		_, err := e.q.EndTerm(ctx, p)
		if err == nil || ctx.Err() != nil || time.Now().Add(delay).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}
