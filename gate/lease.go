package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// ErrReleased is returned by Extend and Release on a LeaseHandle that was
// already released.
var ErrReleased = errors.New("gate: lease already released")

// LeaseConfig configure a Lease.
type LeaseConfig struct {
	// Holder identifies this instance in lock rows and in logs. Default:
	// "hostname:pid".
	Holder string

	// Logger receives acquired / lost / released records, each with the caller's context
	// where there is one. Default (nil): slog.Default(), so warnings and
	// errors reach the process's logger; set a logger with
	// slog.DiscardHandler to silence it.
	Logger *slog.Logger

	// Hooks observes the same events for metrics and tracing. Default:
	// no-op.
	Hooks Hooks

	// AtMost is the lease length: a holder that neither extends nor
	// releases the lease (it crashed, or lost the network) loses it this
	// long after the last acquisition or extension, by database time.
	// Required; at least 1ms.
	AtMost time.Duration

	// AtLeast is how long the lease stays held after it was acquired, even
	// when it is released sooner. It keeps a fast job from running again on
	// an instance that fires the same schedule a little later. Zero (the
	// default) releases at once; never more than AtMost.
	AtLeast time.Duration

	// KeepAlive is how often a held lease is extended automatically, by
	// another AtMost from database time. Default: AtMost/3. Must be less
	// than AtMost. Each extension must be answered before the lease's
	// validity (AtMost less the margin: see LeaseHandle.Context) runs out;
	// a failed one is retried after KeepAlive/4.
	KeepAlive time.Duration

	// NoKeepAlive turns automatic extension off: the holder calls Extend
	// itself, or the lease runs out AtMost after it was taken.
	NoKeepAlive bool
	// Schema is the schema pgclaim's objects live in (pgclaim.WithSchema);
	// its statements name it. Default: "", found through search_path.
	Schema string
}

func (o LeaseConfig) instance() instance {
	return instance{Holder: o.Holder, Logger: o.Logger, Hooks: o.Hooks, Schema: o.Schema}
}

// check validates the options and fills defaults.
func (o LeaseConfig) check() (LeaseConfig, error) {
	switch {
	case o.AtMost <= 0:
		return o, invalid("LeaseConfig.AtMost", "must be positive")
	case o.AtMost < time.Millisecond:
		return o, invalid("LeaseConfig.AtMost", "must be at least 1ms")
	case o.AtLeast < 0:
		return o, invalid("LeaseConfig.AtLeast", "must not be negative")
	case o.AtLeast > o.AtMost:
		return o, invalid("LeaseConfig.AtLeast", fmt.Sprintf("%v exceeds AtMost (%v)", o.AtLeast, o.AtMost))
	case o.KeepAlive < 0:
		return o, invalid("LeaseConfig.KeepAlive", "must not be negative")
	case o.KeepAlive >= o.AtMost:
		return o, invalid("LeaseConfig.KeepAlive", fmt.Sprintf("%v must be less than AtMost (%v)", o.KeepAlive, o.AtMost))
	}
	if err := checkSchemaName("LeaseConfig", o.Schema); err != nil {
		return o, err
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = o.AtMost / 3
	}
	in := o.instance().withDefaults()
	o.Holder, o.Logger, o.Hooks = in.Holder, in.Logger, in.Hooks
	return o, nil
}

// margin is how long before the lease may expire in the database a holder
// counts it lost: with keep-alive, a quarter of AtMost, or half the time
// from one keep-alive to AtMost when that is shorter, so a keep-alive
// always has time to answer; without keep-alive, none (the holder extends
// the lease itself, and its context ends AtMost after the last extension
// was sent).
func (o LeaseConfig) margin() time.Duration {
	if o.NoKeepAlive {
		return 0
	}
	return min(o.AtMost/4, (o.AtMost-o.KeepAlive)/2)
}

// validity is how long one acquisition or extension keeps the lease held
// by this instance's reckoning: AtMost less the margin.
func (o LeaseConfig) validity() time.Duration { return o.AtMost - o.margin() }

// Lease is a named lease lock kept in the pgclaim_locks table: a ShedLock
// style lock row with database-time expiry, extension and fencing.
//
// Every operation is one self-contained statement (sent in its own READ
// COMMITTED transaction, in one round trip), so a Lease works through
// PgBouncer in transaction pooling mode, where session advisory locks
// cannot. (Configure such a pool as the pooler requires, e.g. with
// pgx.QueryExecModeExec when it does not keep prepared statements.) Each acquisition gets a fresh fencing token from
// pgclaim_fence(); extension and release are scoped to it, so a holder
// whose lease expired and was taken over can neither extend nor release the
// new holder's lease. An expired row is taken over only for its own name.
//
// A Lease is safe for concurrent use; it holds no state between
// acquisitions.
type Lease struct {
	named
	o  LeaseConfig
	in instance // o's Holder, Logger and Hooks
}

// NewLease returns the lease lock called name, kept through pool. Like
// New, it refuses a database without pgclaim's tables (one query, bounded
// by 10 s).
func NewLease(pool *pgxpool.Pool, name string, cfg LeaseConfig) (*Lease, error) {
	n, o, err := newNamed(pool, name, cfg, "pgclaim_locks", "pgclaim_fence_seq", "pgclaim_fence()")
	if err != nil {
		return nil, err
	}
	return &Lease{named: n, o: o, in: o.instance()}, nil
}

// Name returns the lease's name.
func (l *Lease) Name() string { return l.name }

// TryAcquire takes the lease if it is free or expired, without waiting. It
// returns an error wrapping ErrHeld when another holder has it. ctx bounds
// only this call: the lease is held until Release, or until it is lost.
//
// Unless NoKeepAlive is set, the lease is extended every KeepAlive until it
// is released or lost.
func (l *Lease) TryAcquire(ctx context.Context) (*LeaseHandle, error) {
	lockcore.GrowStack() // see there: a cron library acquires on a new goroutine
	sent := time.Now()
	row, err := l.q.AcquireLease(ctx, store.AcquireLeaseParams{
		Name:     l.name,
		Holder:   l.o.Holder,
		AtMostUs: l.o.AtMost.Microseconds(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		l.in.emit(ctx, Event{Kind: EventSkipped, Name: l.name, Holder: l.o.Holder, Err: ErrHeld})
		return nil, fmt.Errorf("%w: lease %q", ErrHeld, l.name)
	}
	if err != nil {
		return nil, fmt.Errorf("gate: lease %q: acquire: %w", l.name, err)
	}
	h := &LeaseHandle{l: l, fence: row.Fence, start: sent}
	h.ctx, h.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	h.mu.Lock()
	h.valid = lockcore.NewValidity(sent, l.o.validity(), h.expired)
	h.mu.Unlock()
	l.in.emit(ctx, Event{Kind: EventAcquired, Name: l.name, Holder: l.o.Holder, Fence: h.fence})
	if !l.o.NoKeepAlive {
		h.keeper = lockcore.Renew(h.ctx, lockcore.RenewConfig{
			Every: l.o.KeepAlive, Retry: max(l.o.KeepAlive/4, time.Millisecond), Validity: h.valid, Renew: h.renew,
			OnFail: func(err error) {
				l.o.Logger.WarnContext(h.ctx, "gate: lease extension failed", "name", l.name, "holder", l.o.Holder, "fence", h.fence, "error", err.Error())
			},
		}, func(err error) { h.markLost(h.lostErr(err)) })
	}
	return h, nil
}

// Do runs fn while holding the lease: it takes the lease (returning an error
// wrapping ErrHeld, without running fn, when it is held elsewhere), runs fn
// with the lease's fencing token in run.Fence, and releases the lease when
// fn returns (keeping AtLeast).
//
// fn's context is cancelled when ctx ends or the lease is lost (its
// extension found it expired or taken over); Do then returns an error
// wrapping ErrLockLost, joined with fn's own error if any.
func (l *Lease) Do(ctx context.Context, fn Func) error {
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	h, err := l.TryAcquire(ctx)
	if err != nil {
		return explain(ctx, l.pool, l.schema, err)
	}
	run := Run{Name: l.name, Holder: l.o.Holder, Fence: h.fence}
	return l.in.runHeld(ctx, run, leaseHold{h}, fn, true)
}

// leaseHold is a Do's hold of the lease (the lease row implementation of
// lockcore.Held).
type leaseHold struct{ *LeaseHandle }

func (h leaseHold) Release(ctx context.Context, _ lockcore.Outcome, _ error) (lost, err error) {
	err = h.LeaseHandle.Release(ctx)
	if errors.Is(err, ErrLockLost) {
		return err, nil
	}
	return nil, err
}

// LeaseHandle is one acquisition of a Lease. Its fencing token is fixed for
// the acquisition's life; extensions keep it.
type LeaseHandle struct {
	l     *Lease
	fence int64
	start time.Time

	ctx    context.Context
	cancel context.CancelCauseFunc

	valid  *lockcore.Validity // the instance-clock bound: the lease may have expired after it
	keeper *lockcore.Keeper   // the keep-alive; nil without one

	mu       sync.Mutex
	lost     error // why the lease was lost; nil while held
	released bool
}

// Fence returns the fencing token of this acquisition (see Run.Fence):
// greater than the fencing token of every earlier acquisition of any lease,
// across server restarts and primary promotions. Pass it to the systems the
// holder writes to so they can refuse a stale holder.
func (h *LeaseHandle) Fence() int64 { return h.fence }

// Context returns a context that is cancelled when the lease is released or
// lost: an extension found it expired or taken over, or no extension
// succeeded for AtMost less the margin since the last successful one (by
// the instance's clock, counted from when that extension was sent, so it is
// never later than the database's expiry). The margin, with keep-alive, is
// AtMost/4, or half of AtMost − KeepAlive when that is shorter: a holder
// whose network went silent is cancelled at least that long before another
// instance can take the lease over. Without keep-alive there is none: the
// context ends AtMost after the last extension was sent. context.Cause then
// wraps ErrLockLost. It carries the values of the context given to
// TryAcquire, not its cancellation.
func (h *LeaseHandle) Context() context.Context { return h.ctx }

// Extend pushes the lease's expiry to AtMost from now (database time). It
// returns an error wrapping ErrLockLost when the lease had expired or was
// taken over, or was not answered before the lease's validity ran out (its
// deadline, whatever ctx's), and ErrReleased after Release. Other errors (the database
// could not be reached) leave the lease as it was: it may still be
// extended before it runs out.
func (h *LeaseHandle) Extend(ctx context.Context) error {
	h.mu.Lock()
	released, lost := h.released, h.lost
	h.mu.Unlock()
	if released {
		return ErrReleased
	}
	if lost != nil {
		return lost
	}
	// An answer after the validity confirms nothing: the lease may be
	// gone by then.
	ctx, cancel := context.WithDeadline(ctx, h.valid.Until())
	defer cancel()
	sent := time.Now()
	held, err := h.renew(ctx)
	if err != nil && !time.Now().Before(h.valid.Until()) {
		return h.markLost(h.lostErr(lockcore.ErrExpired))
	}
	if pgerr.Permanent(err) {
		return h.markLost(h.lostErr(err))
	}
	if err != nil {
		return err
	}
	if !held {
		return h.markLost(h.lostErr(lockcore.ErrGone))
	}
	h.mu.Lock()
	lost = h.lost
	h.mu.Unlock()
	if lost != nil {
		return lost
	}
	h.valid.Confirm(sent)
	return nil
}

// renew extends the lease once; held is false when it had expired or was
// taken over.
func (h *LeaseHandle) renew(ctx context.Context) (held bool, err error) {
	l := h.l
	_, err = l.q.ExtendLease(ctx, store.ExtendLeaseParams{Name: l.name, Fence: h.fence, AtMostUs: l.o.AtMost.Microseconds()})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("gate: lease %q: extend: %w", l.name, err)
	}
	return true, nil
}

// lostErr is the ErrLockLost for a loss lockcore reported: the lease ran
// out, was found expired or taken over, or its extension was refused for
// good (then wrapping the server's error, explained).
func (h *LeaseHandle) lostErr(why error) error {
	switch {
	case errors.Is(why, lockcore.ErrExpired):
		return fmt.Errorf("%w: lease %q (fence %d) ran out without extension", ErrLockLost, h.l.name, h.fence)
	case errors.Is(why, lockcore.ErrGone):
		return fmt.Errorf("%w: lease %q (fence %d) expired or was taken over", ErrLockLost, h.l.name, h.fence)
	}
	var pe *pgconn.PgError
	if errors.As(why, &pe) {
		why = pe // the server's words, without the statement's prefix again
	}
	return fmt.Errorf("%w: lease %q (fence %d): the server refused its extension: %w", ErrLockLost, h.l.name, h.fence, pgerr.Explain(why))
}

// Release gives the lease up, keeping it held until AtLeast after it was
// acquired. Only this acquisition's lease is touched: when the lease had
// expired or was taken over, Release changes nothing and returns an error
// wrapping ErrLockLost. The handle's context is cancelled. A second Release
// returns ErrReleased.
func (h *LeaseHandle) Release(ctx context.Context) error {
	l := h.l
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return ErrReleased
	}
	h.released = true
	h.mu.Unlock()
	// No extension may run after the release statement.
	if h.keeper != nil {
		h.keeper.Stop()
	}

	// A release not answered within AtMost is moot: the lease has run
	// out by then.
	rctx, rcancel := context.WithTimeout(ctx, l.o.AtMost)
	n, err := l.q.ReleaseLease(rctx, store.ReleaseLeaseParams{Name: l.name, Fence: h.fence, AtLeastUs: l.o.AtLeast.Microseconds()})
	rcancel()
	h.valid.Stop()
	h.mu.Lock()
	lost := h.lost
	h.mu.Unlock()
	if err != nil && lost != nil {
		// Lost already: the release could change nothing anyway.
		h.cancel(context.Canceled)
		return fmt.Errorf("%w (release: %v)", lost, err)
	}
	if err != nil {
		h.cancel(context.Canceled)
		return fmt.Errorf("gate: lease %q: release: %w", l.name, err)
	}
	if n == 0 && lost == nil {
		lost = h.markLost(fmt.Errorf("%w: lease %q (fence %d) expired or was taken over before release", ErrLockLost, l.name, h.fence))
	}
	h.cancel(context.Canceled)
	l.in.emit(ctx, Event{Kind: EventReleased, Name: l.name, Holder: l.o.Holder, Fence: h.fence, Duration: time.Since(h.start), Err: lost})
	return lost
}

// markLost records why the lease was lost (once), cancels the handle's
// context and reports it. It returns the recorded reason.
func (h *LeaseHandle) markLost(why error) error {
	h.mu.Lock()
	if h.lost != nil {
		why = h.lost
		h.mu.Unlock()
		return why
	}
	h.lost = why
	h.valid.Stop()
	h.mu.Unlock()
	h.cancel(why)
	h.l.in.emit(h.ctx, Event{Kind: EventLost, Name: h.l.name, Holder: h.l.o.Holder, Fence: h.fence, Err: why})
	return why
}

// expired runs when the instance-clock bound passes without an extension:
// from then on the database may consider the lease expired.
func (h *LeaseHandle) expired() {
	h.mu.Lock()
	over := h.lost != nil || h.released
	h.mu.Unlock()
	if !over {
		h.markLost(h.lostErr(lockcore.ErrExpired))
	}
}
