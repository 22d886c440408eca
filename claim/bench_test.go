package claim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const benchWorkers = 8

func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	db := newDB(b)
	cfg := db.Pool.Config().Copy()
	cfg.MaxConns = benchWorkers + 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// resetJobs recreates jobs with n PAUSED rows and the recommended indexes.
func resetJobs(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	mustExec(b, pool, `DROP TABLE IF EXISTS jobs, effects`)
	createJobs(b, pool, "bigint", n)
	mustExec(b, pool, `VACUUM ANALYZE jobs`)
}

// drain runs benchWorkers goroutines calling step until it reports no rows,
// and reports rows/s.
func drain(b *testing.B, rows int, step func(ctx context.Context) (int, error)) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	var moved atomic.Int64
	start := time.Now()
	b.ResetTimer()
	for range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, err := step(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if n == 0 {
					return
				}
				moved.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if int(moved.Load()) != rows {
		b.Fatalf("moved %d rows, want %d", moved.Load(), rows)
	}
	b.ReportMetric(float64(rows)/time.Since(start).Seconds(), "rows/s")
}

// BenchmarkBatchClaimFinish: 8 workers claim batches and finish each batch
// with one fenced statement. One op is one row. The hand-written variant is
// the same work in plain SQL, for comparison.
func BenchmarkBatchClaimFinish(b *testing.B) {
	pool := benchPool(b)
	for _, batch := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pgclaim/batch=%d", batch), func(b *testing.B) {
			resetJobs(b, pool, b.N)
			c, err := New[int64](pool, jobsTable, pausedOpts)
			if err != nil {
				b.Fatal(err)
			}
			drain(b, b.N, func(ctx context.Context) (int, error) {
				cls, err := c.ClaimBatch(ctx, batch)
				if err != nil || len(cls) == 0 {
					return 0, err
				}
				_, lost, err := c.FinishBatch(ctx, cls, "DONE")
				if err == nil && len(lost) > 0 {
					err = fmt.Errorf("%d lost", len(lost))
				}
				return len(cls), err
			})
		})
	}
	// The same work in plain SQL, as a careful hand would write it: states
	// as parameters, the finish fenced by (key, token) pairs. With pgx's
	// default statement cache the server may plan the claim generically,
	// unable to use the partial index; "planned" runs the claim as an
	// unnamed statement, planned at every execution (pgclaim writes its
	// states into the text instead, so its cached plan uses the index).
	for _, planned := range []bool{false, true} {
		name := "handwritten/batch=100/cached"
		var mode []any
		if planned {
			name = "handwritten/batch=100/planned"
			mode = []any{pgx.QueryExecModeCacheDescribe}
		}
		b.Run(name, func(b *testing.B) {
			resetJobs(b, pool, b.N)
			drain(b, b.N, func(ctx context.Context) (int, error) {
				rows, err := pool.Query(ctx, `WITH c AS (
  SELECT id FROM jobs WHERE state = $1 ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE jobs j SET state = $2, claimed_at = now(), claimed_by = 'test',
  fence = nextval('pgclaim_fence_seq'), attempts = j.attempts + 1
FROM c WHERE j.id = c.id RETURNING j.id, j.fence`, append(mode, "PAUSED", "PROCESSING")...)
				if err != nil {
					return 0, err
				}
				var ids, fences []int64
				for rows.Next() {
					var id, fence int64
					if err := rows.Scan(&id, &fence); err != nil {
						return 0, err
					}
					ids, fences = append(ids, id), append(fences, fence)
				}
				if err := rows.Err(); err != nil || len(ids) == 0 {
					return 0, err
				}
				tag, err := pool.Exec(ctx, `UPDATE jobs j SET state = $3
FROM unnest($1::bigint[], $2::bigint[]) AS u(id, fence)
WHERE j.id = u.id AND j.state = $4 AND j.fence = u.fence`, ids, fences, "DONE", "PROCESSING")
				if err == nil && int(tag.RowsAffected()) != len(ids) {
					err = fmt.Errorf("finished %d of %d", tag.RowsAffected(), len(ids))
				}
				return len(ids), err
			})
		})
	}
}

// BenchmarkBatchClaimFinishTx is the exactly-once path: each batch is
// finished in a transaction that also writes one effect per row.
func BenchmarkBatchClaimFinishTx(b *testing.B) {
	pool := benchPool(b)
	for _, batch := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			resetJobs(b, pool, b.N)
			c, err := New[int64](pool, jobsTable, pausedOpts)
			if err != nil {
				b.Fatal(err)
			}
			drain(b, b.N, func(ctx context.Context) (int, error) {
				cls, err := c.ClaimBatch(ctx, batch)
				if err != nil || len(cls) == 0 {
					return 0, err
				}
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					done, _, err := c.WithTx(tx).FinishBatch(ctx, cls, "DONE")
					if err != nil {
						return err
					}
					keys := make([]int64, len(done))
					for i, d := range done {
						keys[i] = d.Key
					}
					_, err = tx.Exec(ctx, `INSERT INTO effects (job_id) SELECT unnest($1::bigint[])`, keys)
					return err
				})
				return len(cls), err
			})
		})
	}
}

// BenchmarkClaimOne: 8 workers claim single rows by key (no contention:
// each key is tried once) and finish each with one statement. One op is one
// row.
func BenchmarkClaimOne(b *testing.B) {
	pool := benchPool(b)
	resetJobs(b, pool, b.N)
	c, err := New[int64](pool, jobsTable, pausedOpts)
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	drain(b, b.N, func(ctx context.Context) (int, error) {
		k := next.Add(1)
		if k > int64(b.N) {
			return 0, nil
		}
		cl, err := c.Claim(ctx, k)
		if err != nil {
			return 0, err
		}
		return 1, c.Finish(ctx, cl, "DONE")
	})
}

// BenchmarkWorker: the worker loop with 8-way concurrency, one transaction
// per row writing an effect. One op is one row.
func BenchmarkWorker(b *testing.B) {
	pool := benchPool(b)
	resetJobs(b, pool, b.N)
	c, err := New[int64](pool, jobsTable, pausedOpts)
	if err != nil {
		b.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Work: effectWork("w"), Done: "DONE", Failed: "FAILED",
		BatchSize: 100, Concurrency: benchWorkers, PollInterval: 10 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	b.ResetTimer()
	st, err := w.Drain(context.Background())
	b.StopTimer()
	if err != nil || st.Succeeded != b.N {
		b.Fatalf("stats %+v err %v", st, err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
}
