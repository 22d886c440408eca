package claim

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// recover sweeps with the worker's Recover sweeper now and then every
// RecoverEvery until ctx ends, waking the run through woken when rows went
// back to Config.From. The first sweep is done when it returns; the returned
// function stops the rest.
func (r *run[K]) recover(ctx context.Context, woken chan<- struct{}) (stop func()) {
	w := r.w
	sweep := func() {
		sctx, cancel := context.WithTimeout(ctx, max(w.cfg.RecoverEvery, cleanupTimeout))
		swept, err := w.cfg.Recover.Sweep(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			if refusedForGood(err) {
				r.fail(fmt.Errorf("claim: worker: recovery sweep of %s (WorkerConfig.Recover): %w", w.c.c.t.qname, w.cfg.Recover.explain(ctx, err)))
				return
			}
			w.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: worker: recovery sweep failed",
				slog.String("table", w.c.c.t.qname), slog.Any("error", err)))
		}
		for _, s := range swept {
			if s.State == w.c.c.from {
				select {
				case woken <- struct{}{}:
				default:
				}
				break
			}
		}
	}
	sweep()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(w.cfg.RecoverEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				sweep()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// othersHold reports whether, with a Recover sweeper, rows within
// Config.Where are in Config.To, held by other holders (this run holds none
// when it asks): Drain waits for them to be finished or swept. Without
// Recover, or when the database cannot say, false.
func (r *run[K]) othersHold(ctx context.Context) bool {
	w := r.w
	if w.cfg.Recover == nil || ctx.Err() != nil {
		return false
	}
	q := &w.c.c.sqlOpen
	var held bool
	if err := w.c.db.QueryRow(ctx, q.text, q.bind(w.cfg.Args...)...).Scan(&held); err != nil {
		if ctx.Err() == nil {
			w.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: worker: reading whether other holders have rows", slog.Any("error", err)))
		}
		return false
	}
	return held
}
