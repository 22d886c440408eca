package chaos

// The worker's claims: each row's fate, a batch claimed, its effects
// written and finished (in a broken mode, without its guard), and the audit.

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/claim"
)

// fate decides, deterministically from the seed, the row and the attempt,
// whether the row's work fails for good, fails this once, or succeeds.
func (w *worker) fate(id int64, attempt int) (fail, retry bool) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d", w.cfg.Seed, id, attempt)
	v := int(h.Sum64() % 1000)
	return v < w.cfg.FailPermille, v >= w.cfg.FailPermille && v < w.cfg.FailPermille+w.cfg.RetryPermille
}

// work does the batch's work, then finishes its claims in one transaction
// that also writes the effects of the rows it moved to DONE. Every finish
// attempted is then recorded in chaos_audit with its token and result.
func (w *worker) work(ctx context.Context, cls []claim.Claim[int64]) error {
	var ok, retry, failed []claim.Claim[int64]
	for _, c := range cls {
		if !sleepCtx(ctx, w.cfg.WorkPerRow) {
			// The instance is stopping: the claims stay PROCESSING
			// until swept (a new incarnation sweeps at start-up).
			return ctx.Err()
		}
		f, r := w.fate(c.Key, c.Attempts)
		switch {
		case f, r && c.Attempts >= w.cfg.MaxAttempts:
			failed = append(failed, c)
		case r:
			retry = append(retry, c)
		default:
			ok = append(ok, c)
		}
	}
	result := map[int64]string{}
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		cl := w.claimer.WithTx(tx)
		var done []claim.Claim[int64]
		if w.cfg.Broken == BrokenNoFence {
			var err error
			done, err = finishUnfenced(ctx, tx, ok)
			if err != nil {
				return err
			}
		} else {
			var lost []claim.Claim[int64]
			var err error
			done, lost, err = cl.FinishBatch(ctx, ok, "DONE")
			if err != nil {
				return err
			}
			for _, c := range lost {
				result[c.Key] = "lost"
			}
		}
		for _, c := range done {
			result[c.Key] = "done"
		}
		if err := w.writeEffects(ctx, tx, done); err != nil {
			return err
		}
		if len(retry) > 0 {
			done, lost, err := cl.FinishBatch(ctx, retry, "PAUSED")
			if err != nil {
				return err
			}
			mark(result, done, "retry")
			mark(result, lost, "lost")
		}
		if len(failed) > 0 {
			ids, fences := keysFences(failed)
			if _, err := tx.Exec(ctx, `UPDATE chaos_rows r SET reason = $3
				FROM unnest($1::bigint[], $2::bigint[]) AS x(id, fence)
				WHERE r.id = x.id AND r.fence = x.fence AND r.state = 'PROCESSING'`,
				ids, fences, fmt.Sprintf("work failed (instance %s)", w.holder)); err != nil {
				return err
			}
			done, lost, err := cl.FinishBatch(ctx, failed, "FAILED")
			if err != nil {
				return err
			}
			mark(result, done, "failed")
			mark(result, lost, "lost")
		}
		return nil
	})
	if err != nil {
		for _, c := range cls {
			result[c.Key] = "error"
		}
	} else if w.cfg.Acks {
		w.ackRows(cls, result)
	}
	w.audit(ctx, cls, result)
	return err
}

// ackRows reports the rows whose DONE finish was just committed.
func (w *worker) ackRows(cls []claim.Claim[int64], result map[int64]string) {
	var b strings.Builder
	b.WriteString(msgAckRows + " " + w.holder)
	n := 0
	for _, c := range cls {
		if result[c.Key] == "done" {
			fmt.Fprintf(&b, " %d:%d", c.Key, c.Fence)
			n++
		}
	}
	if n > 0 {
		w.say(b.String())
	}
}

func mark(m map[int64]string, cls []claim.Claim[int64], v string) {
	for _, c := range cls {
		m[c.Key] = v
	}
}

func keysFences(cls []claim.Claim[int64]) (ids, fences []int64) {
	ids = make([]int64, len(cls))
	fences = make([]int64, len(cls))
	for i, c := range cls {
		ids[i], fences[i] = c.Key, c.Fence
	}
	return ids, fences
}

// finishUnfenced is the broken finish: no token, no state check.
func finishUnfenced(ctx context.Context, tx pgx.Tx, cls []claim.Claim[int64]) ([]claim.Claim[int64], error) {
	if len(cls) == 0 {
		return nil, nil
	}
	ids, _ := keysFences(cls)
	rows, err := tx.Query(ctx, `UPDATE chaos_rows SET state = 'DONE' WHERE id = ANY($1::bigint[]) RETURNING id`, ids)
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	in := map[int64]bool{}
	for _, id := range got {
		in[id] = true
	}
	var done []claim.Claim[int64]
	for _, c := range cls {
		if in[c.Key] {
			done = append(done, c)
		}
	}
	return done, nil
}

func (w *worker) writeEffects(ctx context.Context, tx pgx.Tx, done []claim.Claim[int64]) error {
	if len(done) == 0 {
		return nil
	}
	ids, fences := keysFences(done)
	_, err := tx.Exec(ctx, `INSERT INTO chaos_effects (row_id, fence, instance)
		SELECT x.id, x.fence, $3 FROM unnest($1::bigint[], $2::bigint[]) AS x(id, fence)`, ids, fences, w.holder)
	return err
}

// audit records every finish attempted (best effort: an instance killed
// right after its commit leaves no audit, which the checker allows).
func (w *worker) audit(ctx context.Context, cls []claim.Claim[int64], result map[int64]string) {
	ids, fences := keysFences(cls)
	res := make([]string, len(cls))
	for i, c := range cls {
		res[i] = result[c.Key]
		if res[i] == "" {
			res[i] = "error"
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := w.pool.Exec(actx, `INSERT INTO chaos_audit (row_id, fence, instance, result)
		SELECT x.id, x.fence, $3, x.res FROM unnest($1::bigint[], $2::bigint[], $4::text[]) AS x(id, fence, res)`,
		ids, fences, w.holder, res)
	if err != nil {
		w.log.Warn("audit", "error", err)
	}
}
