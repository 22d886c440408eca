package claim

// One run of a Worker (Run or Drain): the loop that claims batches while
// there is room, waits for wake-ups and the poll, and hands each claim to
// its work (work.go).

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// entry is one claim held by a run.
type entry[K any] struct {
	cl   Claim[K]
	lost atomic.Bool
	// finishing is set before the first statement that finishes, fails or
	// releases the claim: from then on that statement, not the heartbeat,
	// reports the claim if it is lost.
	finishing atomic.Bool
	cancel    context.CancelFunc
	// valid is the claim's validity (with a lease; nil without): when
	// it runs out, expired is set and the work's context cancelled.
	valid   *lockcore.Validity
	expired atomic.Bool
}

// expire ends e's work once its validity has run out.
func (r *run[K]) expire(e *entry[K]) {
	r.mu.Lock()
	e.expired.Store(true)
	cancel := e.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

type run[K any] struct {
	w        *Worker[K]
	stopping context.Context // the caller's ctx: done means stop
	workCtx  context.Context // for work and statements: ends StopTimeout after stop

	mu    sync.Mutex
	st    Stats
	err   error // the first failure that cannot go away: ends the run
	stop  context.CancelFunc
	held  map[*entry[K]]struct{}
	freed chan struct{} // a slot was freed (for Drain's polling)
	// retries wakes the run when rows it sent back with a backoff become
	// claimable.
	retries *retryClock
	// onReader: the last claim reached a read-only server (readonly.go).
	onReader bool
}

// fail records err, a failure that cannot go away, as the run's result (the
// first one wins) and stops the run as a cancellation would.
func (r *run[K]) fail(err error) {
	r.mu.Lock()
	first := r.err == nil
	if first {
		r.err = err
	}
	r.mu.Unlock()
	if first {
		r.w.c.c.report(r.workCtx, Event{}, rec(slog.LevelError, "claim: worker: stopping on a failure that cannot go away", slog.Any("error", err)))
	}
	r.stop()
}

// refused returns the error of a run that ends because the table refused to
// move a row to state, the value of field.
func refused(field, state string, err error) error {
	if pgerr.Permanent(err) {
		return fmt.Errorf("claim: worker: moving a row to %s %q: %w", field, state, pgerr.Explain(err))
	}
	return fmt.Errorf("claim: worker: moving a row to %s %q: %w: the table refuses it: %w", field, state, ErrInvalid, err)
}

func (r *run[K]) count(f func(*Stats)) {
	r.mu.Lock()
	f(&r.st)
	r.mu.Unlock()
}

func (w *Worker[K]) run(ctx context.Context, drain bool) (Stats, error) {
	// ctx, from here on, also ends when the run fails for good (run.fail).
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	if w.cfg.StopTimeout > 0 {
		stop := context.AfterFunc(ctx, func() {
			t := time.AfterFunc(w.cfg.StopTimeout, cancelWork)
			context.AfterFunc(workCtx, func() { t.Stop() })
		})
		defer stop()
	}
	r := &run[K]{
		w:        w,
		stopping: ctx,
		workCtx:  workCtx,
		stop:     stopRun,
		held:     map[*entry[K]]struct{}{},
		freed:    make(chan struct{}, 1),
	}

	hbDone := make(chan struct{})
	hbCtx, stopHB := context.WithCancel(workCtx)
	lease := w.c.c.lease
	if w.c.c.t.leaseUntil == "" {
		lease = 0
	}
	if lease > 0 {
		go func() {
			defer close(hbDone)
			r.heartbeats(hbCtx, lease)
		}()
	} else {
		close(hbDone)
	}
	defer func() {
		stopHB()
		<-hbDone
	}()

	// Wake-ups: announcements of claimable rows (sub, nil when polling
	// only) and the moments rows this run sent back become claimable.
	woken := make(chan struct{}, 1)
	r.retries = &retryClock{wake: func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	}}
	defer r.retries.stop()
	sub, announced := w.subscribe(ctx)
	var heard <-chan struct{}
	if sub != nil {
		defer sub.Close()
		heard = sub.Wake()
	}
	toldMode := sub == nil
	if w.cfg.Recover != nil {
		stopRecovery := r.recover(ctx, woken)
		defer stopRecovery()
	}

	sem := make(chan struct{}, w.cfg.Concurrency)
	var wg sync.WaitGroup
	inflight := func() int { return len(sem) }
	group := joinPollGroup(w)
	defer leavePollGroup(group)
	// wait waits for the next poll, PollInterval after from (the last
	// claim's start, so that its connection goes back to the pool idle for
	// less than the interval), or for a wake-up. While notifications
	// arrive (Run, not Drain), the poll is the group's: PollInterval after
	// the latest claim of any worker of this process claiming the same
	// rows.
	//
	// The poll takes its connection from the pool pollAhead before it is
	// due (held, for the claim), so that the pool hands back the connection
	// of the last poll, idle for just under a PollInterval of 1 s, without
	// the ping pgxpool sends first for one idle over a second.
	var held *pgxpool.Conn
	defer func() {
		if held != nil {
			held.Release()
		}
	}()
	pool, _ := w.c.db.(*pgxpool.Pool)
	wait := func(from time.Time, onFreed bool) {
		if !toldMode {
			toldMode = w.tellMode(ctx, sub, announced)
		}
		shared := !drain && sub != nil && sub.Listening()
		if shared {
			from = later(from, group.latest())
		}
		due := from.Add(w.cfg.PollInterval)
		ahead := time.Duration(0)
		if pool != nil && inflight() < cap(sem) {
			ahead = pollAhead
		}
		t := time.NewTimer(time.Until(due) - ahead)
		defer t.Stop()
		// freed: returns (Drain) or, listening, marks the worker idle again
		// once its work ends; an announcement goes to a worker with room
		// first.
		var freed <-chan struct{}
		if onFreed || sub != nil {
			freed = r.freed
		}
		if sub != nil {
			sub.Idle(inflight() < cap(sem))
			defer sub.Idle(false)
		}
	waiting:
		for {
			select {
			case <-ctx.Done():
			case <-t.C:
				if shared {
					var mine bool
					if due, mine = group.turn(time.Now(), ahead, w.cfg.PollInterval); !mine {
						t.Reset(time.Until(due) - ahead) // another worker of the group claimed since, or polls now
						continue waiting
					}
				}
				if ahead > 0 {
					held = takeAhead(ctx, pool, due, heard, woken)
				}
			case <-freed:
				if !onFreed {
					sub.Idle(inflight() < cap(sem))
					continue waiting
				}
			case <-heard:
			case <-woken:
			}
			break
		}
		if !toldMode {
			toldMode = w.tellMode(ctx, sub, announced)
		}
	}

loop:
	for ctx.Err() == nil {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		// Work still in flight may yet put rows back (Retry.State); only a claim
		// that finds nothing after all work has ended means drained.
		busy := inflight() > 1
		// Claims use workCtx, not ctx: a claim statement cancelled half-way
		// could commit rows this run would never learn of. With a lease
		// such rows go back (to a Sweeper) when it runs out, so the claim
		// is bounded by the lease: an answer later than that holds
		// nothing.
		claimCtx, claimCancel := workCtx, context.CancelFunc(func() {})
		if lease > 0 {
			claimCtx, claimCancel = context.WithTimeout(workCtx, lease)
		}
		claimer := w.c
		if held != nil {
			claimer = &Claimer[K]{db: held, c: w.c.c}
		}
		sent := time.Now()
		cls, err := claimer.ClaimBatch(claimCtx, w.cfg.BatchSize, w.cfg.Args...)
		claimCancel()
		if held != nil {
			held.Release()
			held = nil
		}
		if err != nil {
			<-sem
			if workCtx.Err() != nil {
				break
			}
			if pgerr.Permanent(err) {
				r.fail(fmt.Errorf("claim: worker: claiming rows from Config.From %q to Config.To %q: %w", w.c.c.from, w.c.c.to, pgerr.Explain(err)))
				break
			}
			if permanent(err) {
				r.fail(fmt.Errorf("claim: worker: claiming rows from Config.From %q to Config.To %q: %w: the table refuses the statement: %w",
					w.c.c.from, w.c.c.to, ErrInvalid, err))
				break
			}
			if pgerr.ReadOnly(err) {
				r.readOnly(ctx, err)
			} else {
				w.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: worker: claim batch failed", slog.Any("error", err)))
			}
			wait(time.Now(), false)
			continue
		}
		r.writable(ctx)
		group.claimed(sent)
		if len(cls) == 0 {
			<-sem
			if drain && !busy && !r.othersHold(ctx) {
				break
			}
			wait(sent, drain)
			continue
		}
		if sub != nil && len(cls) == w.cfg.BatchSize {
			sub.Relay() // more may wait: another idle worker of the table claims too
		}
		es := make([]*entry[K], len(cls))
		r.mu.Lock()
		r.st.Claimed += len(cls)
		for i, cl := range cls {
			e := &entry[K]{cl: cl}
			if lease > 0 {
				e.valid = lockcore.NewValidity(sent, validity(lease), func() { r.expire(e) })
			}
			es[i] = e
			r.held[e] = struct{}{}
		}
		r.mu.Unlock()
		for i, e := range es {
			if i > 0 {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					for _, e := range es[i:] {
						r.release(e)
						r.drop(e)
					}
					break loop
				}
			}
			wg.Add(1)
			go func() {
				defer func() {
					r.drop(e)
					<-sem
					select {
					case r.freed <- struct{}{}:
					default:
					}
					wg.Done()
				}()
				r.process(e)
			}()
		}
		if len(cls) < w.cfg.BatchSize && !drain && sub != nil && sub.Listening() {
			// This claim took every row claimable: the next ones are
			// announced, so claim again when told (or at the poll), not
			// at once to find nothing.
			wait(sent, false)
		}
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st, r.err
}
