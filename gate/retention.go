package gate

// Retention: a Gate deletes the ledger's finished ticks once they are older
// than Config.Retention, in small batches, each statement bounded in time,
// from a goroutine Once starts at most every 10 minutes: a job due every
// second does not grow pgclaim_ticks forever.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// DefaultRetention is how long finished ticks are kept when
// Config.Retention does not say otherwise.
const DefaultRetention = 7 * 24 * time.Hour

// KeepTicks, as Config.Retention, keeps every tick: nothing is deleted but
// by Prune.
const KeepTicks time.Duration = -1

const (
	// retainBatch is the most ticks one statement deletes.
	retainBatch = 1000
	// retainStatement bounds each deleting statement.
	retainStatement = 5 * time.Second
	// retainEvery: a Gate deletes 10 minutes after New at the soonest,
	// then at most every 10 minutes, each time with up to a fifth more of
	// jitter so that instances do not delete in step.
	retainEvery = 10 * time.Minute
)

// checkRetention validates Config.Retention against the skew tolerance tol.
func checkRetention(r, tol time.Duration) error {
	switch {
	case r == 0 || r == KeepTicks:
		return nil
	case r < 0:
		return invalid("Config.Retention", fmt.Sprintf("%s is negative: use gate.KeepTicks to keep every tick", r))
	case r < time.Hour:
		return invalid("Config.Retention", fmt.Sprintf("%s is shorter than an hour: keep ticks long enough to look at them (or gate.KeepTicks)", r))
	case r <= tol:
		return invalid("Config.Retention", fmt.Sprintf("%s does not exceed SkewTolerance (%s): an instance firing late could claim a deleted tick again", r, tol))
	}
	return nil
}

func jittered(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

// maybeRetain starts a retention pass when one is due and none runs.
func (g *Gate) maybeRetain() {
	if g.retention <= 0 {
		return
	}
	next := g.nextRetain.Load()
	if time.Now().UnixNano() < next || !g.nextRetain.CompareAndSwap(next, time.Now().Add(jittered(retainEvery)).UnixNano()) {
		return
	}
	if !g.retaining.TryLock() {
		return
	}
	go func() {
		defer g.retaining.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := g.retainOnce(ctx); err != nil && !pgerr.Refused(err) {
			g.opts.Logger.WarnContext(ctx, "gate: delete old ticks (retention); trying again at the next pass", "error", err)
		}
	}()
}

// retainOnce deletes finished ticks older than the retention, a batch at a
// time, and logs how many.
func (g *Gate) retainOnce(ctx context.Context) (int64, error) {
	if g.retention <= 0 {
		return 0, nil // KeepTicks
	}
	if w := time.Duration(g.catchUp.Load()); w >= g.retention {
		return 0, nil // CatchUp could take a deleted tick for a missed one (CatchUp refuses such a window)
	}
	var total int64
	defer func() {
		if total > 0 {
			g.opts.Logger.InfoContext(ctx, "gate: old ticks deleted (retention)", "deleted", total, "older_than", g.retention.String())
		}
	}()
	for ctx.Err() == nil {
		var n int64
		err := pgx.BeginTxFunc(ctx, g.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			q := store.New(g.schema.Wrap(tx))
			if err := q.SetLocalStatementTimeout(ctx, fmt.Sprint(retainStatement.Milliseconds())); err != nil {
				return err
			}
			var err error
			n, err = q.PruneTicksBatch(ctx, store.PruneTicksBatchParams{OlderThanUs: g.retention.Microseconds(), BatchSize: g.retainBatch})
			return err
		})
		if err != nil {
			return total, fmt.Errorf("gate: retention: %w", err)
		}
		total += n
		if n < int64(g.retainBatch) {
			break
		}
	}
	return total, ctx.Err()
}
