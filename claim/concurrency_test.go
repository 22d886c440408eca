package claim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

const concRows = 10000

// TestBatchClaimFinishExactlyOnce: 8 goroutines, each with its own pool,
// claim batches and finish them in a transaction that also writes one
// effect per row. Every row must end DONE with exactly one effect.
func TestBatchClaimFinishExactlyOnce(t *testing.T) {
	t.Parallel()
	batchExactlyOnce(t, Config{From: "PAUSED", To: "PROCESSING"})
}

// The same with Config.Spread: batches start at random rows and wrap
// around; the last rows are found however the pivots fell.
func TestBatchClaimFinishExactlyOnceSpread(t *testing.T) {
	t.Parallel()
	batchExactlyOnce(t, Config{From: "PAUSED", To: "PROCESSING", Spread: true})
}

func batchExactlyOnce(t *testing.T, cfg Config) {
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", concRows)
	addAudit(t, db.Pool, "bigint")

	const workers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed, lostTotal := 0, 0
	errs := make(chan error, workers)
	for w := range workers {
		pool := db.NewPool(t)
		holder := fmt.Sprintf("w%d", w)
		cfg := cfg
		cfg.Holder = holder
		c, err := New[int64](pool, jobsTable, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for {
					batch, err := c.ClaimBatch(ctx, 50+10*w)
					if err != nil {
						return err
					}
					if len(batch) == 0 {
						return nil
					}
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						done, lost, err := c.WithTx(tx).FinishBatch(ctx, batch, "DONE")
						if err != nil {
							return err
						}
						keys := make([]int64, len(done))
						fences := make([]int64, len(done))
						for i, d := range done {
							keys[i], fences[i] = d.Key, d.Fence
						}
						if _, err := tx.Exec(ctx, `INSERT INTO effects (job_id, holder, fence) SELECT k, $3, t FROM unnest($1::bigint[], $2::bigint[]) AS u(k, t)`,
							keys, fences, holder); err != nil {
							return err
						}
						mu.Lock()
						claimed += len(batch)
						lostTotal += len(lost)
						mu.Unlock()
						return nil
					})
					if err != nil {
						return err
					}
				}
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if claimed != concRows || lostTotal != 0 {
		t.Errorf("claimed %d, lost %d; want %d, 0", claimed, lostTotal, concRows)
	}
	exactlyOnce(t, db.Pool, concRows)
}

// TestClaimOneContended: 8 goroutines, each with its own pool, try to claim
// every row of the same shuffled key list. Each row is claimed once; every
// other attempt is a skip.
func TestClaimOneContended(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", concRows)
	addAudit(t, db.Pool, "bigint")
	keys := make([]int64, concRows)
	for i := range keys {
		keys[i] = int64(i + 1)
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })

	const workers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed, skipped := 0, 0
	errs := make(chan error, workers)
	for w := range workers {
		pool := db.NewPool(t)
		holder := fmt.Sprintf("w%d", w)
		c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: holder})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for _, k := range keys {
					cl, err := c.Claim(ctx, k)
					if errors.Is(err, ErrNotClaimed) {
						mu.Lock()
						skipped++
						mu.Unlock()
						continue
					}
					if err != nil {
						return err
					}
					mu.Lock()
					claimed++
					mu.Unlock()
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if err := c.WithTx(tx).Finish(ctx, cl, "DONE"); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `INSERT INTO effects (job_id, holder, fence) VALUES ($1, $2, $3)`, cl.Key, holder, cl.Fence)
						return err
					})
					if err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if claimed != concRows {
		t.Errorf("claimed %d, want %d", claimed, concRows)
	}
	if losing := workers*concRows - claimed; skipped != losing {
		t.Errorf("skipped %d, want %d losing attempts", skipped, losing)
	}
	exactlyOnce(t, db.Pool, concRows)
}

// TestEachContended runs the sqlc-first loop: Each with a hand-written
// compare-and-swap, as sqlc would generate it, on 8 instances at once.
func TestEachContended(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	const rows = 2000
	createJobs(t, db.Pool, "bigint", rows)
	addAudit(t, db.Pool, "bigint")
	keys := make([]int64, rows)
	for i := range keys {
		keys[i] = int64(i + 1)
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })

	const workers = 8
	var wg sync.WaitGroup
	stats := make([]Stats, workers)
	errs := make([]error, workers)
	for w := range workers {
		pool := db.NewPool(t)
		holder := fmt.Sprintf("w%d", w)
		// What sqlc generates for
		//   -- name: ResumeFromPaused :execrows
		//   UPDATE jobs SET state = 'PROCESSING', claimed_at = now(), claimed_by = $2
		//   WHERE id = $1 AND state = 'PAUSED';
		cas := func(ctx context.Context, id int64) (int64, error) {
			tag, err := pool.Exec(ctx, `UPDATE jobs SET state = 'PROCESSING', claimed_at = now(), claimed_by = $2, fence = 0 WHERE id = $1 AND state = 'PAUSED'`, id, holder)
			return tag.RowsAffected(), err
		}
		work := func(ctx context.Context, id int64) error {
			if id%100 == 0 {
				return fmt.Errorf("refusing %d", id)
			}
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (job_id, holder, fence) VALUES ($1, $2, 0)`, id, holder); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE jobs SET state = 'DONE' WHERE id = $1 AND state = 'PROCESSING' AND claimed_by = $2`, id, holder)
				return err
			})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[w], errs[w] = Each(ctx, keys, cas, work)
		}()
	}
	wg.Wait()
	var total Stats
	failures := 0
	for w := range workers {
		for _, e := range unwrapJoined(errs[w]) {
			if e != nil {
				failures++
			}
		}
		total.Claimed += stats[w].Claimed
		total.Skipped += stats[w].Skipped
		total.Succeeded += stats[w].Succeeded
		total.Failed += stats[w].Failed
	}
	if total.Claimed != rows || total.Skipped != workers*rows-rows {
		t.Errorf("claimed %d skipped %d; want %d and %d", total.Claimed, total.Skipped, rows, workers*rows-rows)
	}
	if total.Failed != rows/100 || failures != rows/100 || total.Succeeded != rows-rows/100 {
		t.Errorf("stats %+v, %d errors; want %d failed", total, failures, rows/100)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM effects`); got != rows-rows/100 {
		t.Errorf("%d effects", got)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id HAVING count(*) > 1) d`); got != 0 {
		t.Errorf("%d rows with more than one effect", got)
	}
	if got := count(t, db.Pool, `SELECT count(*) FROM audit WHERE old_state = 'PAUSED' AND new_state = 'PROCESSING'`); got != rows {
		t.Errorf("%d claims for %d rows", got, rows)
	}
}

func unwrapJoined(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
