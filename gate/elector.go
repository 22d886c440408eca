package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// Elector elects one leader among the instances campaigning for the same
// election name: Active/Standby without a flag or a port to remember. While
// the leader lives it stays leader; when it dies, resigns or loses its
// connection, a standby takes over within a bounded time (see
// ElectorConfig.TTL).
//
// Each term is recorded in pgclaim_terms (election, holder, term, started_at,
// ended_at in database time), and the term number is a fencing token from
// pgclaim_fence() (see Run.Fence). At most one term of an election is open
// at a time, and terms never overlap: a new leader starts its term only
// after the previous one was closed, with a higher term number. The
// leader deletes terms that ended longer ago than ElectorConfig.Retention;
// Prune deletes older than any limit.
//
// Leadership changes are reported to ElectorConfig.Hooks and the Logger:
// EventAcquired when this instance starts leading, EventLost when it lost
// leadership, EventReleased when it resigned. Event.Fence is the term.
//
// An Elector campaigns for one instance; it is safe for concurrent use.
type Elector struct {
	named
	o  ElectorConfig
	in instance // o's Holder, Logger and Hooks
	// key of the advisory variant's lock
	class, key int32

	sem chan struct{}        // one campaign at a time
	cur atomic.Pointer[term] // the term held or being ended; nil when none
	// nextRetain is when old terms may be deleted again (unix ns).
	nextRetain atomic.Int64

	// next (advisory variant) is the spare connection of the last term,
	// once that term was closed on it: the next campaign waits for the
	// lock on it instead of opening a connection (a backend started by the
	// server just as the leadership changes hands). It is closed when no
	// campaign takes it within spareIdle.
	nextMu sync.Mutex
	next   *lockcore.Session
	nextT  *time.Timer
}

// spareIdle is how long the last term's spare connection is kept for the
// next campaign.
const spareIdle = time.Minute

// keepNext keeps s for the next campaign, for at most spareIdle.
func (e *Elector) keepNext(s *lockcore.Session) {
	e.nextMu.Lock()
	old := e.next
	e.next = s
	if e.nextT != nil {
		e.nextT.Stop()
	}
	e.nextT = time.AfterFunc(spareIdle, func() {
		e.nextMu.Lock()
		mine := e.next == s // not taken, nor replaced by a later term's
		if mine {
			e.next, e.nextT = nil, nil
		}
		e.nextMu.Unlock()
		if mine {
			s.Close()
		}
	})
	e.nextMu.Unlock()
	if old != nil {
		old.Close()
	}
}

// takeNext returns the session kept by keepNext, if any and still open.
func (e *Elector) takeNext() *lockcore.Session {
	e.nextMu.Lock()
	s := e.next
	e.next = nil
	if e.nextT != nil {
		e.nextT.Stop()
		e.nextT = nil
	}
	e.nextMu.Unlock()
	if s != nil && !s.Alive() {
		s.Close()
		return nil
	}
	return s
}

// NewElector returns an Elector campaigning in the election called name
// through pool. Like New, it refuses a database without pgclaim's tables
// (one query, bounded by 10 s).
func NewElector(pool *pgxpool.Pool, name string, cfg ElectorConfig) (*Elector, error) {
	n, o, err := newNamed(pool, name, cfg, "pgclaim_terms", "pgclaim_fence_seq", "pgclaim_fence()")
	if err != nil {
		return nil, err
	}
	e := &Elector{named: n, o: o, in: o.instance(), sem: make(chan struct{}, 1)}
	e.class, e.key = electionKey(o.Schema, name)
	return e, nil
}

// Name returns the election's name.
func (e *Elector) Name() string { return e.name }

// Prune deletes the election's terms that ended more than olderThan ago (by
// database time) and returns how many it deleted; pgclaim_terms otherwise
// keeps one row per term for good. The open term is never deleted, nor are
// the terms of other elections. Any instance may call it, leading or not,
// for example next to Gate.Prune.
func (e *Elector) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, invalid("olderThan", "must be positive")
	}
	n, err := e.q.PruneTerms(ctx, store.PruneTermsParams{Election: e.name, OlderThanUs: olderThan.Microseconds()})
	if err != nil {
		return 0, fmt.Errorf("gate: prune terms of %q: %w", e.name, err)
	}
	return n, nil
}

// IsLeader reports whether this instance leads now. It turns false before
// the leadership context is cancelled.
func (e *Elector) IsLeader() bool {
	t := e.cur.Load()
	return t != nil && !t.stepped.Load()
}

// Fence returns the fencing token of the current term, or 0 when this
// instance does not lead.
func (e *Elector) Fence() int64 {
	t := e.cur.Load()
	if t == nil || t.stepped.Load() {
		return 0
	}
	return t.fence
}

// Campaign waits until this instance leads the election, or ctx ends, and
// returns the leadership context: it is cancelled when the leadership ends,
// by Resign (context.Cause is context.Canceled) or because it was lost
// (context.Cause wraps ErrLockLost); IsLeader turns false just before.
//
// The leadership context is not derived from ctx: it carries none of ctx's
// values, and ctx ending does not end it. ctx bounds only the wait; its
// values go with EventAcquired and with what the Elector finds later on its
// own (a lost leadership's EventLost and log records, the lease renewals).
// A term recorded in pgclaim_terms as ctx ends is still returned, since the
// statement that starts a term is not cancelled with ctx; an advisory lock
// granted just as ctx ends may instead be given up, with ctx's error.
//
// Campaign on a leader returns the current leadership's context at once.
// When leadership was lost, the term is closed by the Elector; call
// Campaign again to stand for the next one.
func (e *Elector) Campaign(ctx context.Context) (context.Context, error) {
	t, err := e.campaign(ctx, false)
	if err != nil {
		return nil, err
	}
	return t.ctx, nil
}

// Resign gives up leadership: IsLeader turns false, the leadership context
// is cancelled, the term is closed and the lock or lease released, so a
// standby takes over at once. It does nothing when this instance does not
// lead. Resign does not wait for work started under the leadership context
// to stop: stop it first, or use Run, which closes the term only once fn
// has returned (and then campaigns again).
func (e *Elector) Resign(ctx context.Context) error {
	t := e.cur.Load()
	if t == nil {
		return nil
	}
	t.resigned.Store(true)
	t.stepDown(nil)
	if t.deferEnd {
		return nil
	}
	return t.end(ctx, reasonResigned)
}

// Run campaigns, runs fn while this instance leads, and campaigns again when
// leadership is lost or resigned. fn gets the election name, the holder and
// the term number (in run.Fence), and a context with ctx's values that is
// cancelled when leadership ends or ctx ends; Run closes the term once fn
// has returned (a panic in fn closes it too, then goes on).
//
// Run returns when ctx ends (with ctx's error, or fn's when that is not a
// cancellation), or when fn returns while still leading (with fn's error;
// leadership is resigned first).
func (e *Elector) Run(ctx context.Context, fn Func) error {
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	for {
		t, err := e.campaign(ctx, true)
		if err != nil {
			return err
		}
		ferr, ended := e.lead(ctx, t, fn)
		if ctx.Err() != nil {
			if ferr != nil && !errors.Is(ferr, context.Canceled) && !errors.Is(ferr, context.DeadlineExceeded) {
				return ferr
			}
			return ctx.Err()
		}
		if ended {
			if ferr != nil {
				e.o.Logger.WarnContext(ctx, "gate: leader function failed as leadership ended", "name", e.name, "holder", e.o.Holder, "fence", t.fence, "error", ferr.Error())
			}
			if t.resigned.Load() && e.o.Mechanism == LeaseRow {
				// Let a standby's next try win before standing again.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(e.o.RetryInterval):
				}
			}
			continue
		}
		return ferr
	}
}

// lead runs fn for term t and closes the term afterwards. ended reports that
// leadership ended (lost or resigned) before fn returned.
func (e *Elector) lead(ctx context.Context, t *term, fn Func) (ferr error, ended bool) {
	h := &termHold{t: t}
	ferr = e.in.runHeld(ctx, Run{Name: e.name, Holder: e.o.Holder, Fence: t.fence}, h, fn, false)
	return ferr, h.ended
}

// termHold is Run's hold of a term: its release closes the term.
type termHold struct {
	t     *term
	ended bool // leadership had ended when fn returned
}

func (h *termHold) Context() context.Context { return h.t.ctx }

func (h *termHold) Release(ctx context.Context, _ lockcore.Outcome, _ error) (lost, err error) {
	t, e := h.t, h.t.e
	h.ended = t.ctx.Err() != nil
	reason := reasonResigned
	if t.lostErr() != nil {
		reason = reasonLost
	}
	t.stepDown(nil)
	if err := t.end(ctx, reason); err != nil {
		e.o.Logger.WarnContext(ctx, "gate: closing term failed", "name", e.name, "holder", e.o.Holder, "fence", t.fence, "error", err.Error())
	}
	return nil, nil
}

// stand tries to win a term with try until it succeeds or ctx ends, pausing
// delay after each failure. A failure is logged as a warning unless it only
// says that another instance leads (pgx.ErrNoRows); behind a pooler, or
// once closed, the campaign ends with the error.
func (e *Elector) stand(ctx context.Context, delay time.Duration, try func() (*term, error)) (*term, error) {
	for {
		t, err := try()
		switch {
		case err == nil:
			return t, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, ErrPooler) || errors.Is(err, ErrClosed):
			return nil, err
		case pgerr.Permanent(err): // a missing privilege: no retry cures it
			return nil, explain(ctx, e.pool, e.schema, err)
		case !errors.Is(err, pgx.ErrNoRows):
			e.o.Logger.WarnContext(ctx, "gate: campaign failed; retrying", "name", e.name, "holder", e.o.Holder, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// campaign waits for leadership. deferEnd marks a term whose end is left to
// Run.
func (e *Elector) campaign(ctx context.Context, deferEnd bool) (*term, error) {
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-e.sem }()

	if cur := e.cur.Load(); cur != nil {
		if !cur.stepped.Load() {
			return cur, nil
		}
		// A term that ended locally but is not closed yet: close it first.
		reason := reasonResigned
		if cur.lostErr() != nil {
			reason = reasonLost
		}
		ectx, cancel := releaseCtx(ctx)
		_ = cur.end(ectx, reason)
		cancel()
	}

	var (
		t   *term
		err error
	)
	if e.o.Mechanism == LeaseRow {
		t, err = e.campaignLease(ctx, deferEnd)
	} else {
		t, err = e.campaignAdvisory(ctx, deferEnd)
	}
	if err != nil {
		return nil, err
	}
	t.obsCtx = context.WithoutCancel(ctx)
	if t.sess != nil {
		t.openSpare()
	}
	t.keep()
	e.cur.Store(t)
	e.in.emit(ctx, Event{Kind: EventAcquired, Name: e.name, Holder: e.o.Holder, Fence: t.fence})
	close(t.acquired)
	go t.watch()
	go e.retainTerms(t)
	return t, nil
}

// Reasons a term ends, as stored in pgclaim_terms.end_reason.
const (
	reasonResigned = "resigned"
	reasonLost     = "lost"
)
