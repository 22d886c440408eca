package gate

// One tick through the ledger: its claim (after the job's lock, when it
// waits), what a tick not run records and returns, and its outcome.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/store"
)

// once claims the tick (name, at) and runs fn. tol is the skew tolerance in
// microseconds, nil for none. The claim is one ClaimTick statement: through
// the pool for LedgerOnly; otherwise on a dedicated session, taking the
// job's advisory lock in the same statement, or after waiting for it
// (Config.LockWait, ClaimTickHeld).
func (g *Gate) once(ctx context.Context, name string, at time.Time, tol *int64, fn Func) error {
	lockcore.GrowStack() // see there: a cron library calls Once on a new goroutine
	ts := pgtype.Timestamptz{Time: at, Valid: true}
	p := store.ClaimTickParams{Job: name, FireAt: ts, LockMode: "none", ToleranceUs: tol, Holder: g.opts.Holder}
	if g.ledger {
		row, err := g.q.ClaimTick(ctx, p)
		if err != nil {
			if lost := g.claimLost(ctx, name, at, err); lost != nil {
				return lost
			}
			return fmt.Errorf("gate: %q: claim tick: %w", name, err)
		}
		run := Run{Name: name, FireAt: at, Holder: g.opts.Holder, Fence: row.Fence}
		g.opts.emit(ctx, Event{Kind: EventAcquired, Name: name, FireAt: at, Holder: run.Holder, Fence: run.Fence})
		return g.opts.runHeld(ctx, run, ledgerHold{g: g, run: run}, fn, true)
	}

	p.LockClass, p.LockKey = schemaKey(g.opts.Schema, name)
	free, ok := g.sessions.Reserve(ctx, p.LockClass, p.LockKey, g.wait)
	if !ok {
		// A run of this process holds the job's lock (or is taking it):
		// the server cannot tell, the session being the same.
		return g.heldSkip(ctx, name, at)
	}
	held := false
	defer func() {
		if !held {
			free()
		}
	}()
	s, err := g.sessions.Get(ctx)
	if err != nil {
		return err
	}
	p.LockMode = "try"
	sent := time.Now()
	var row store.ClaimTickRow
	if g.wait > 0 {
		var ok bool
		if row, ok, err = g.claimAfterWait(ctx, s, p, &sent); !ok {
			return err
		}
	} else {
		row, err = s.Q.ClaimTick(ctx, p)
		if err != nil {
			// A tick claimed already, a refused fire time and a lock
			// held elsewhere abort nothing on the session, which holds
			// no lock then.
			if lost := g.claimLost(ctx, name, at, err); lost != nil {
				g.sessions.Put(s)
				return lost
			}
			s.Close()
			return fmt.Errorf("gate: %q: claim tick: %w", name, err)
		}
	}
	// Only a claim that won the tick looks for a dead holder's tick
	// (ClaimTick reports stale only then).
	if row.Stale {
		if err := g.abandonStale(ctx, s, name, p.LockClass, p.LockKey, row.Fence); err != nil {
			return g.claimBroken(ctx, name, at, row.Fence, err)
		}
	}
	run := Run{Name: name, FireAt: at, Holder: g.opts.Holder, Fence: row.Fence}
	held = true
	return g.hold(ctx, s, sent, run, fn, tickRelease{g: g, class: p.LockClass, key: p.LockKey}, free)
}

// claimAfterWait waits for the job's lock on s (Config.LockWait), then
// claims the tick with ClaimTickHeld; but a tick claimed already is not
// waited for (its run may be what holds the lock). ok is false when the
// tick is not claimed, with what Once returns; s has then been kept or
// closed. sent is set to when the claim was sent.
func (g *Gate) claimAfterWait(ctx context.Context, s *lockcore.Session, p store.ClaimTickParams, sent *time.Time) (store.ClaimTickRow, bool, error) {
	name, at := p.Job, p.FireAt.Time
	h, err := s.Q.HeldTick(ctx, store.HeldTickParams{Job: name, FireAt: p.FireAt})
	if err != nil {
		s.Close()
		return store.ClaimTickRow{}, false, fmt.Errorf("gate: %q: look up tick: %w", name, err)
	}
	if h.Claimed {
		g.sessions.Put(s)
		return store.ClaimTickRow{}, false, g.skipped(ctx, name, at, errTaken)
	}
	_, locked, err := g.lock(ctx, s, name, p.LockClass, p.LockKey)
	if err != nil {
		return store.ClaimTickRow{}, false, err
	}
	if !locked {
		return store.ClaimTickRow{}, false, g.heldSkip(ctx, name, at)
	}
	*sent = time.Now()
	row, err := s.Q.ClaimTickHeld(ctx, store.ClaimTickHeldParams{
		LockMode: "held", Job: name, LockClass: p.LockClass, LockKey: p.LockKey,
		ToleranceUs: p.ToleranceUs, FireAt: p.FireAt, Holder: p.Holder,
	})
	if err != nil {
		s.Close()
		return store.ClaimTickRow{}, false, fmt.Errorf("gate: %q: claim tick: %w", name, err)
	}
	if row.Fence == 0 {
		if row.LeftLocked {
			s.Close() // not expected: the lock would be left held; drop the session
		} else {
			g.sessions.Put(s)
		}
		return store.ClaimTickRow{}, false, g.notClaimed(ctx, name, at, row)
	}
	return store.ClaimTickRow{Fence: row.Fence, Stale: row.Stale}, true, nil
}

// ClaimTick's refusals, each an error that aborted the statement and with
// it the tick's insert (pgclaim_raise, migration 00008): the insert won
// the tick while the job's lock was held elsewhere, or the fire time is out
// of tolerance (the message ends with database time, in microseconds since
// 1970).
const (
	refusedCode = "PGC01"
	skewedCode  = "PGC02"
)

// claimLost returns what Once returns for a ClaimTick that did not claim
// the tick, with err the statement's error: the tick was claimed already
// (no row), its fire time was refused, or the job's lock is held
// elsewhere. It returns nil for any other error.
func (g *Gate) claimLost(ctx context.Context, name string, at time.Time, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return g.skipped(ctx, name, at, errTaken)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return nil
	}
	switch pe.Code {
	case refusedCode:
		return g.heldSkip(ctx, name, at)
	case skewedCode:
		i := strings.LastIndexByte(pe.Message, ' ')
		us, perr := strconv.ParseInt(pe.Message[i+1:], 10, 64)
		if perr != nil {
			return nil
		}
		return g.skewed(ctx, name, at, time.UnixMicro(us))
	}
	return nil
}

// notClaimed reports a claim after a wait for the lock that did not get
// the tick: its fire time was refused, or the tick was claimed already.
// The claim released the lock.
func (g *Gate) notClaimed(ctx context.Context, name string, at time.Time, row store.ClaimTickHeldRow) error {
	switch {
	case !row.InTolerance:
		return g.skewed(ctx, name, at, row.DbNow.Time)
	case row.Taken:
		return g.skipped(ctx, name, at, errTaken)
	default:
		return g.heldSkip(ctx, name, at)
	}
}

// abandonStale marks abandoned the ticks of job still running (but the one
// with ownFence, this run's), which a claim found while holding the job's
// lock: their holders' sessions had ended. It reports each with
// EventAbandoned. On error s has been closed, and with it any lock it held.
func (g *Gate) abandonStale(ctx context.Context, s *lockcore.Session, job string, class, key int32, ownFence int64) error {
	r, err := s.Q.AbandonTicks(ctx, store.AbandonTicksParams{
		LockClass: class, LockKey: key, Job: job, OwnFence: ownFence,
		Error: "gate: abandoned: the holder's session ended before the run finished (found by " + g.opts.Holder + ")",
	})
	if err == nil && r.Locked && !r.Unlocked {
		err = errors.New("unlock not confirmed")
	}
	if err != nil {
		s.Close() // the lock count is unknown: drop the session
		return fmt.Errorf("gate: %q: mark abandoned ticks: %w", job, err)
	}
	for i := range min(len(r.FireAt), len(r.Holder), len(r.Fence)) {
		g.opts.emit(ctx, Event{
			Kind: EventAbandoned, Name: job, FireAt: r.FireAt[i].Time, Holder: g.opts.Holder, Fence: r.Fence[i],
			Outcome: OutcomeAbandoned,
			Err:     fmt.Errorf("run of %q by %s was abandoned: its session ended before the run finished", job, r.Holder[i]),
		})
	}
	return nil
}

// claimBroken handles a claim whose session failed (and was closed) after
// the tick was inserted with fence, 0 for none: the job cannot run without
// its lock, so its tick is recorded as not run, and err is returned.
func (g *Gate) claimBroken(ctx context.Context, name string, at time.Time, fence int64, err error) error {
	if fence == 0 {
		return err
	}
	out := Outcome(lockcore.Classify(ctx, err))
	rctx, cancel := releaseCtx(ctx)
	defer cancel()
	run := Run{Name: name, FireAt: at, Holder: g.opts.Holder, Fence: fence}
	if rerr := g.finishTick(rctx, run, out, fmt.Errorf("gate: job not run: %w", err)); rerr != nil {
		g.opts.Logger.ErrorContext(ctx, "gate: record tick outcome", "name", name, "fire_at", at, "outcome", string(out), "error", rerr)
	}
	return err
}

// errTaken is the ErrSkipped returned for a tick claimed already.
var errTaken = fmt.Errorf("%w: tick claimed already", ErrSkipped)

// skipped reports a skip and returns why, naming the tick.
func (g *Gate) skipped(ctx context.Context, name string, at time.Time, why error) error {
	g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, FireAt: at, Holder: g.opts.Holder, Err: why})
	return &skipError{why: why, name: name, at: at}
}

// skipError is what skipped returns: why, for the tick (name, at), or for
// name alone when at is zero. Every instance but one gets it for each tick,
// so its text is built only when it is read.
type skipError struct {
	why  error
	name string
	at   time.Time
}

func (e *skipError) Error() string {
	if e.at.IsZero() {
		return fmt.Sprintf("%v: %q", e.why, e.name)
	}
	return fmt.Sprintf("%v: %q at %s", e.why, e.name, e.at.Format(time.RFC3339Nano))
}

func (e *skipError) Unwrap() error { return e.why }

// errLockBusy is the ErrHeld of a tick skipped because another run of its
// job holds the job's lock.
var errLockBusy = fmt.Errorf("%w: the job's lock is held by another run; this tick is not run", ErrHeld)

// heldSkip reports a tick that Once skipped because the job's lock is held
// elsewhere, and returns a *HeldError. It looks at the ledger once more: a
// tick claimed meanwhile by an instance racing this one is a normal skip
// (errTaken); otherwise the tick is run nowhere, which is reported at warn
// level with the run holding the lock (the job's latest running tick), when
// the ledger shows one.
func (g *Gate) heldSkip(ctx context.Context, name string, at time.Time) error {
	ts := pgtype.Timestamptz{Time: at, Valid: true}
	// Another instance may be claiming the tick right now, which no
	// snapshot shows yet: one whose insert waited for this claim's and
	// went on when it was undone, or (after Config.LockWait) the lock's
	// holder itself, between taking the lock and committing its claim. The
	// probe waits for such a claim to end. Without it, instances firing
	// one tick together reported it held, "not run", while it ran.
	claimed, err := g.probe.ProbeTick(ctx, store.ProbeTickParams{Job: name, FireAt: ts})
	if err == nil && claimed {
		return g.skipped(ctx, name, at, errTaken)
	}
	h, herr := g.q.HeldTick(ctx, store.HeldTickParams{Job: name, FireAt: ts})
	if err == nil {
		err = herr
	}
	if err == nil && h.Claimed {
		return g.skipped(ctx, name, at, errTaken)
	}
	var why error
	held := &HeldError{Name: name, FireAt: at}
	switch {
	case err != nil:
		why = fmt.Errorf("%w (holder unknown: %v)", errLockBusy, err)
	case h.RunningFireAt.Valid:
		why = fmt.Errorf("%w: held by the run of %s by %s, running since %s", errLockBusy,
			h.RunningFireAt.Time.Format(time.RFC3339Nano), h.Holder, h.RunningSince.Time.Format(time.RFC3339Nano))
		held.Holder, held.HolderFireAt, held.Since = h.Holder, h.RunningFireAt.Time, h.RunningSince.Time
	default:
		why = fmt.Errorf("%w: held by a run not in the ledger (an Exclusive run of %q)", errLockBusy, name)
	}
	g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, FireAt: at, Holder: g.opts.Holder, Err: why, HeldBy: h.Holder})
	held.err = fmt.Errorf("%w: %q at %s", why, name, at.Format(time.RFC3339Nano))
	return held
}

// skewed returns the *SkewError for fireAt at, measured against dbNow.
func (g *Gate) skewed(ctx context.Context, name string, at, dbNow time.Time) error {
	err := &SkewError{Name: name, FireAt: at, DBNow: dbNow, Tolerance: g.tolerance,
		err: fmt.Errorf("%w: %q at %s is %s from database time %s (tolerance %s)",
			ErrClockSkew, name, at.Format(time.RFC3339Nano), at.Sub(dbNow), dbNow.Format(time.RFC3339Nano), g.tolerance)}
	g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, FireAt: at, Holder: g.opts.Holder, Err: err})
	return err
}

// ledgerHold is the hold of a LedgerOnly run: the tick's row, which no
// keeper can find lost; the release records the outcome through the pool.
type ledgerHold struct {
	g   *Gate
	run Run
}

func (ledgerHold) Context() context.Context { return neverLost }

func (h ledgerHold) Release(ctx context.Context, out lockcore.Outcome, jobErr error) (error, error) {
	if err := h.g.finishTick(ctx, h.run, Outcome(out), jobErr); err != nil {
		h.g.opts.Logger.ErrorContext(ctx, "gate: record tick outcome", "name", h.run.Name, "fire_at", h.run.FireAt, "outcome", string(out), "error", err)
	}
	return nil, nil
}

// finishTick records a run's outcome through the pool, retrying while ctx
// allows: after a server restart the pool's first connections are dead.
func (g *Gate) finishTick(ctx context.Context, run Run, out Outcome, jobErr error) error {
	p := store.FinishTickParams{
		Outcome: string(out), Error: errText(jobErr), Job: run.Name,
		FireAt: pgtype.Timestamptz{Time: run.FireAt, Valid: true}, Fence: run.Fence,
	}
	backoff := 50 * time.Millisecond
	for {
		_, err := g.q.FinishTick(ctx, p)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// errText is err's message for the ledger, nil for nil.
func errText(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

// tickRelease ends a ledger run held under the advisory lock.
type tickRelease struct {
	g          *Gate
	class, key int32
}

func (r tickRelease) release(ctx context.Context, s *lockcore.Session, run Run, out Outcome, jobErr error) (bool, error) {
	unlocked, err := s.Q.FinishTickUnlock(ctx, store.FinishTickUnlockParams{
		LockClass: r.class, LockKey: r.key, Outcome: string(out), Error: errText(jobErr),
		Job: run.Name, FireAt: pgtype.Timestamptz{Time: run.FireAt, Valid: true}, Fence: run.Fence,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// Not expected: the tick was not running under this fence, so
		// the statement finished nothing and unlocked nothing.
		r.g.opts.Logger.ErrorContext(ctx, "gate: tick was not running at finish", "name", run.Name, "fire_at", run.FireAt, "fence", run.Fence)
		unlocked, err = s.Q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: r.class, LockKey: r.key})
	}
	if err != nil {
		return false, err
	}
	return unlocked, nil
}

func (r tickRelease) record(ctx context.Context, run Run, out Outcome, jobErr error) error {
	return r.g.finishTick(ctx, run, out, jobErr)
}
