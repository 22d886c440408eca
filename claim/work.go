package claim

// One claim's work in a run: its transaction, the finish or the failure,
// the heartbeat that extends its lease, the release on stop.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrPanic is matched by the error recorded for work that panicked.
var ErrPanic = errors.New("claim: work panicked")

// callWork runs f, turning a panic into an error matching ErrPanic.
func callWork(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, r, debug.Stack())
		}
	}()
	return f()
}

// cleanupTimeout bounds the statements that give a claim back or record its
// failure after the work's context has ended.
const cleanupTimeout = 10 * time.Second

// validity is how long a claim, or a heartbeat that extended it, keeps its
// work going, counted from when the statement was sent: three quarters of
// the lease, a quarter short of the moment the row's lease can run out in
// the database and another worker claim it.
func validity(lease time.Duration) time.Duration { return lease - lease/4 }

func (r *run[K]) drop(e *entry[K]) {
	r.mu.Lock()
	delete(r.held, e)
	r.mu.Unlock()
	if e.valid != nil {
		e.valid.Stop()
	}
}

// cleanupCtx is for statements that must run after the work's context
// ended: giving a claim back or recording a failure.
func (r *run[K]) cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.workCtx), cleanupTimeout)
}

func (r *run[K]) release(e *entry[K]) {
	e.finishing.Store(true)
	ctx, cancel := r.cleanupCtx()
	defer cancel()
	err := r.w.c.release(ctx, e.cl, rec(slog.LevelInfo, "claim: worker: released on stop",
		slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence)))
	r.settle(ctx, e, err, "Config.From", r.w.c.c.from, func(s *Stats) { s.Released++ }, "claim: worker: release failed")
}

// settle counts how a statement that gave e's claim back, or recorded its
// failure, moving the row to state (the value of field), ended: ErrLost as
// lost; another error as unrecorded, logged at error level as msg with
// attrs (a refusal by the table also ends the run: see refused); nil
// through done.
func (r *run[K]) settle(ctx context.Context, e *entry[K], err error, field, state string, done func(*Stats), msg string, attrs ...slog.Attr) {
	switch {
	case errors.Is(err, ErrLost):
		r.count(func(s *Stats) { s.Lost++ })
	case err != nil:
		r.count(func(s *Stats) { s.Unrecorded++ })
		if permanent(err) {
			r.fail(refused(field, state, err))
		}
		attrs = append([]slog.Attr{slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence)}, append(attrs, slog.Any("error", err))...)
		r.w.c.c.report(ctx, Event{}, rec(slog.LevelError, msg, attrs...))
	default:
		r.count(done)
	}
}

func (r *run[K]) process(e *entry[K]) {
	w := r.w
	if r.stopping.Err() != nil {
		r.release(e)
		return
	}
	ctx, cancel := context.WithCancel(r.workCtx)
	defer cancel()
	r.mu.Lock()
	e.cancel = cancel
	lost := e.lost.Load() || e.expired.Load()
	r.mu.Unlock()
	if lost {
		r.count(func(s *Stats) { s.Lost++ })
		return
	}

	tx, err := w.begin(ctx)
	if err != nil {
		w.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: worker: begin failed", slog.Any("key", e.cl.Key), slog.Any("error", err)))
		r.release(e)
		return
	}
	werr := callWork(func() error { return w.cfg.Work(ctx, tx, e.cl) })
	e.finishing.Store(true)
	final := false // a failure no retry can cure: straight to Failed
	if werr == nil {
		ferr := w.c.WithTx(tx).finishWith(ctx, e.cl, w.cfg.Done, nil, 0)
		if ferr != nil && permanent(ferr) {
			ferr = refused("WorkerConfig.Done", w.cfg.Done, ferr)
			r.fail(ferr)
			final = true
		}
		if ferr == nil {
			ferr = tx.Commit(ctx)
		}
		if ferr == nil {
			r.count(func(s *Stats) { s.Succeeded++ })
			return
		}
		if errors.Is(ferr, ErrLost) {
			r.rollback(tx)
			r.count(func(s *Stats) { s.Lost++ })
			return
		}
		werr = ferr
	}
	r.rollback(tx)

	if e.lost.Load() {
		r.count(func(s *Stats) { s.Lost++ })
		w.c.c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: claim lost during work",
			slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence), slog.Any("error", werr)))
		return
	}
	if e.expired.Load() {
		r.count(func(s *Stats) { s.Lost++ })
		w.c.c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: claim not confirmed within three quarters of its lease; work stopped, the row goes back when its lease runs out",
			slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence), slog.Any("error", werr)))
		return
	}
	if r.stopping.Err() != nil && ctx.Err() != nil && (errors.Is(werr, context.Canceled) || errors.Is(werr, context.DeadlineExceeded)) {
		r.release(e)
		return
	}
	state, retry := w.cfg.Failed, false
	var retryIn time.Duration
	if p := w.cfg.Retry; p.State != "" && e.cl.Attempts < p.MaxAttempts && !final {
		state, retry, retryIn = p.State, true, p.wait(e.cl.Attempts)
	}
	cctx, ccancel := r.cleanupCtx()
	defer ccancel()
	err = w.c.finishWith(cctx, e.cl, state, werr, retryIn, rec(slog.LevelWarn, "claim: worker: work failed",
		slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence), slog.Int("attempts", e.cl.Attempts),
		slog.String("state", state), slog.Any("error", werr)))
	field := "WorkerConfig.Failed"
	if retry {
		field = "WorkerConfig.Retry.State"
	}
	if err == nil && retry && retryIn > 0 {
		r.retries.add(retryIn)
	}
	r.settle(cctx, e, err, field, state, func(s *Stats) {
		if retry {
			s.Retried++
		} else {
			s.Failed++
		}
	}, "claim: worker: recording failure failed", slog.Any("work_error", werr))
}

func (r *run[K]) rollback(tx pgx.Tx) {
	ctx, cancel := r.cleanupCtx()
	defer cancel()
	_ = tx.Rollback(ctx)
}

// heartbeats extends the leases of every held claim every lease/3
// (lease/12 after a failure), each heartbeat bounded by the latest of the
// claims' validities; it confirms the validity of the claims it found held, and
// cancels the work of claims found lost.
func (r *run[K]) heartbeats(ctx context.Context, lease time.Duration) {
	t := time.NewTimer(lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(lease / 3)
		r.mu.Lock()
		es := make([]*entry[K], 0, len(r.held))
		cls := make([]Claim[K], 0, len(r.held))
		for e := range r.held {
			es = append(es, e)
			cls = append(cls, e.cl)
		}
		r.mu.Unlock()
		if len(es) == 0 {
			continue
		}
		// An answer after every claim's validity has run out confirms
		// nothing: the heartbeat is bounded by the latest.
		sent := time.Now()
		var until time.Time
		for _, e := range es {
			if u := e.valid.Until(); u.After(until) {
				until = u
			}
		}
		hctx, cancel := context.WithDeadline(ctx, until)
		lost, err := r.w.c.heartbeat(hctx, cls, lease, func(i int) bool { return es[i].finishing.Load() })
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.w.c.c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: heartbeat failed", slog.Any("error", err)))
			}
			t.Reset(lease / 12)
			continue
		}
		for i, l := range lost {
			if !l {
				// Extended, or locked by a transaction with its
				// token unchanged (the work's own, which no other
				// claim or sweep can pass while it lasts).
				es[i].valid.Confirm(sent)
				continue
			}
			e := es[i]
			r.mu.Lock()
			e.lost.Store(true)
			cancel := e.cancel
			r.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		}
	}
}
