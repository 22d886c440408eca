package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
)

// The claims table: the field's push requests. The partial index is the one
// pgclaim's docs recommend for batch claims.
const pushDDL = `
CREATE TABLE bench_push (
    id         bigint PRIMARY KEY,
    status     text NOT NULL,
    claimed_at timestamptz,
    claimed_by text,
    fence      bigint,
    attempts   integer NOT NULL DEFAULT 0,
    payload    text NOT NULL
);
CREATE INDEX bench_push_paused ON bench_push (id) WHERE status = 'PAUSED';
-- One row per effect; no unique key, so a duplicate is counted, not refused.
CREATE TABLE bench_effects (
    id     bigint NOT NULL,
    fence  bigint NOT NULL,
    worker integer NOT NULL
);`

var pushTable = claim.Table{
	Name: "bench_push", Key: "id", State: "status",
	ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence", Attempts: "attempts",
}

const insertEffects = `INSERT INTO bench_effects (id, fence, worker)
SELECT k, t, $3 FROM unnest($1::bigint[], $2::bigint[]) AS u(k, t)`

// resetPush empties both tables and inserts n PAUSED rows.
func resetPush(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return execAllArgs(ctx, pool,
		stmt{"TRUNCATE bench_push, bench_effects", nil},
		stmt{`INSERT INTO bench_push (id, status, payload)
SELECT g, 'PAUSED', 'resume push request #' || g FROM generate_series(1, $1::bigint) AS g`, []any{n}},
		stmt{"VACUUM ANALYZE bench_push", nil},
		stmt{"VACUUM ANALYZE bench_effects", nil},
		stmt{"CHECKPOINT", nil},
	)
}

type stmt struct {
	sql  string
	args []any
}

func execAllArgs(ctx context.Context, db execer, stmts ...stmt) error {
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s.sql, s.args...); err != nil {
			if s.sql == "CHECKPOINT" { // needs privileges a URL's role may lack
				continue
			}
			return fmt.Errorf("%s: %w", firstLine(s.sql), err)
		}
	}
	return nil
}

// effectCounts is the state of the push tables after a run.
type effectCounts struct {
	Effects, Distinct, Done, Processing int64
}

func (c effectCounts) duplicates() int64 { return c.Effects - c.Distinct }

func countEffects(ctx context.Context, pool *pgxpool.Pool) (effectCounts, error) {
	var c effectCounts
	err := pool.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM bench_effects),
  (SELECT count(DISTINCT id) FROM bench_effects),
  (SELECT count(*) FROM bench_push WHERE status = 'DONE'),
  (SELECT count(*) FROM bench_push WHERE status = 'PROCESSING')`).Scan(&c.Effects, &c.Distinct, &c.Done, &c.Processing)
	return c, err
}

// tally accumulates the invariant counts of many runs into checks.
type tally struct {
	dups, mismatch, processing, lost int64
}

func (t *tally) add(c effectCounts, lost int64) {
	t.dups += c.duplicates()
	if c.Distinct != c.Done {
		t.mismatch += abs64(c.Distinct - c.Done)
	}
	t.processing += c.Processing
	t.lost += lost
}

func (t *tally) checks(r *ScenarioReport, what string) {
	r.check(what+": duplicate effects (a row's effect written twice)", 0, t.dups)
	r.check(what+": DONE rows without exactly one effect", 0, t.mismatch)
	r.check(what+": rows left PROCESSING after the run", 0, t.processing)
	r.check(what+": claims lost before their finish", 0, t.lost)
}

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// runGroup runs fn(i) for i in [0,n) concurrently and returns the first
// error.
func runGroup(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// claimRun is the outcome of draining the push table once.
type claimRun struct {
	rows    int64
	batches int64
	lost    int64
	elapsed time.Duration
	lat     summary
}

// batchLoop is one worker's loop: claim a batch, then finish it and write
// its effects in one transaction, until nothing is claimable or the time
// box ends. claimFn and finishFn are pgclaim's or the hand-written SQL.
type batchOps struct {
	claim  func(ctx context.Context, n int) ([]int64, []int64, error) // keys, fences
	finish func(ctx context.Context, tx pgx.Tx, keys, fences []int64) (done []int64, doneFences []int64, err error)
}

func drainBatches(ctx context.Context, pool *pgxpool.Pool, workers, batch int, deadline time.Time,
	ops func(w int) batchOps, rows *atomic.Int64) (claimRun, error) {
	var lat latencies
	var batches, lost atomic.Int64
	start := time.Now()
	err := runGroup(workers, func(w int) error {
		o := ops(w)
		own := make([]time.Duration, 0, 1024)
		defer func() { lat.addAll(own) }()
		for time.Now().Before(deadline) {
			t0 := time.Now()
			keys, fences, err := o.claim(ctx, batch)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				return nil
			}
			var done int
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				dk, dt, err := o.finish(ctx, tx, keys, fences)
				if err != nil {
					return err
				}
				done = len(dk)
				if len(dk) == 0 {
					return nil
				}
				_, err = tx.Exec(ctx, insertEffects, dk, dt, w)
				return err
			})
			if err != nil {
				return err
			}
			own = append(own, time.Since(t0))
			rows.Add(int64(done))
			batches.Add(1)
			lost.Add(int64(len(keys) - done))
		}
		return nil
	})
	return claimRun{rows: rows.Load(), batches: batches.Load(), lost: lost.Load(), elapsed: time.Since(start), lat: lat.summary()}, err
}

// pgclaimOps uses claim.Claimer: ClaimBatch, then FinishBatch inside the
// transaction that writes the effects.
func pgclaimOps(pool *pgxpool.Pool) (func(w int) batchOps, error) {
	return pgclaimOpsSpread(pool, false)
}

// pgclaimOpsSpread is pgclaimOps with claim.Config.Spread as given.
func pgclaimOpsSpread(pool *pgxpool.Pool, spread bool) (func(w int) batchOps, error) {
	if _, err := claim.New[int64](pool, pushTable, claim.Config{From: "PAUSED", To: "PROCESSING", Spread: spread}); err != nil {
		return nil, err
	}
	return func(w int) batchOps {
		c, _ := claim.New[int64](pool, pushTable, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: fmt.Sprintf("bench-w%d", w), Spread: spread})
		var held []claim.Claim[int64]
		return batchOps{
			claim: func(ctx context.Context, n int) ([]int64, []int64, error) {
				cls, err := c.ClaimBatch(ctx, n)
				if err != nil {
					return nil, nil, err
				}
				held = cls
				keys, fences := make([]int64, len(cls)), make([]int64, len(cls))
				for i, cl := range cls {
					keys[i], fences[i] = cl.Key, cl.Fence
				}
				return keys, fences, nil
			},
			finish: func(ctx context.Context, tx pgx.Tx, _, _ []int64) ([]int64, []int64, error) {
				done, _, err := c.WithTx(tx).FinishBatch(ctx, held, "DONE")
				if err != nil {
					return nil, nil, err
				}
				keys, fences := make([]int64, len(done)), make([]int64, len(done))
				for i, cl := range done {
					keys[i], fences[i] = cl.Key, cl.Fence
				}
				return keys, fences, nil
			},
		}
	}, nil
}

// handOps is the same loop written by hand: the SQL a careful user writes
// without pgclaim (SKIP LOCKED batch claim stamped with a fencing token,
// one fenced finish per batch).
//
// perExec runs the claim as an unnamed statement planned at every
// execution (pgx's QueryExecModeCacheDescribe), as pgclaim's ClaimBatch did
// while its state was a parameter; otherwise it is a prepared statement
// whose plan the server may cache, as ClaimBatch's now is.
func handOps(pool *pgxpool.Pool, perExec bool) func(w int) batchOps {
	return func(w int) batchOps {
		holder := fmt.Sprintf("hand-w%d", w)
		var mode []any
		if perExec {
			mode = []any{pgx.QueryExecModeCacheDescribe}
		}
		return batchOps{
			claim: func(ctx context.Context, n int) ([]int64, []int64, error) {
				rows, err := pool.Query(ctx, `UPDATE bench_push
SET status = 'PROCESSING', claimed_at = now(), claimed_by = $2,
    fence = (SELECT nextval('pgclaim_fence_seq')), attempts = attempts + 1
WHERE id IN (SELECT id FROM bench_push WHERE status = 'PAUSED' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, fence`, append(mode, n, holder)...)
				if err != nil {
					return nil, nil, err
				}
				var keys, fences []int64
				var k, t int64
				_, err = pgx.ForEachRow(rows, []any{&k, &t}, func() error {
					keys, fences = append(keys, k), append(fences, t)
					return nil
				})
				return keys, fences, err
			},
			finish: func(ctx context.Context, tx pgx.Tx, keys, fences []int64) ([]int64, []int64, error) {
				rows, err := tx.Query(ctx, `UPDATE bench_push AS b SET status = 'DONE'
FROM unnest($1::bigint[], $2::bigint[]) AS u(k, t)
WHERE b.id = u.k AND b.status = 'PROCESSING' AND b.fence = u.t
RETURNING b.id, b.fence`, keys, fences)
				if err != nil {
					return nil, nil, err
				}
				var dk, dt []int64
				var k, t int64
				_, err = pgx.ForEachRow(rows, []any{&k, &t}, func() error {
					dk, dt = append(dk, k), append(dt, t)
					return nil
				})
				return dk, dt, err
			},
		}
	}
}

// runClaims measures pgclaim's claim path over the grid of workers and
// batch sizes.
func runClaims(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, err := e.database(ctx)
	if err != nil {
		return err
	}
	defer db.Drop(context.WithoutCancel(ctx))
	maxW := 0
	for _, w := range p.ClaimWorkers {
		maxW = max(maxW, w)
	}
	pool, err := e.pool(ctx, db, maxW*2+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, pushDDL); err != nil {
		return err
	}
	ops, err := pgclaimOps(pool)
	if err != nil {
		return err
	}
	r.setup("table bench_push: %d rows in PAUSED, fresh for each combination; partial index on (id) WHERE status = 'PAUSED'", p.ClaimRows)
	r.setup("each worker loops: ClaimBatch(batch) → BEGIN; FinishBatch(claims, DONE); INSERT the effects; COMMIT — 5 round trips per batch")
	r.setup("workers %v × batch sizes %v, one pool of %d connections; a combination stops claiming after %s if rows remain", p.ClaimWorkers, p.ClaimBatches, maxW*2+2, p.ClaimTimeBox)
	r.setup("duplicates: effects table has no unique key; count(*) − count(DISTINCT id) must be 0")

	tbl := Table{Title: "pgclaim claim + finish (effect written in the finishing transaction)",
		Columns: []string{"workers", "batch", "rows", "s", "rows/s", "batch p50", "batch p99", "WAL/row", "dup"}}
	var t tally
	for _, b := range p.ClaimBatches {
		for _, w := range p.ClaimWorkers {
			if err := resetPush(ctx, pool, p.ClaimRows); err != nil {
				return err
			}
			var rows atomic.Int64
			end := e.prog.task(fmt.Sprintf("  claims: workers=%d batch=%d", w, b), "rows", int64(p.ClaimRows), rows.Load)
			ph := e.begin(ctx, db.Name)
			cr, err := drainBatches(ctx, pool, w, b, time.Now().Add(p.ClaimTimeBox), ops, &rows)
			prof := ph.end(ctx, fmt.Sprintf("claims workers=%d batch=%d", w, b), 5)
			end()
			if err != nil {
				return err
			}
			c, err := countEffects(ctx, pool)
			if err != nil {
				return err
			}
			t.add(c, cr.lost)
			res := claimResult("pgclaim", "pgclaim ClaimBatch + FinishBatch", w, b, cr, prof, c)
			r.Results = append(r.Results, res)
			tbl.Rows = append(tbl.Rows, claimRow(res))
			if w == profiledWorkers(p.ClaimWorkers) {
				r.Profiles = append(r.Profiles, prof)
			}
		}
	}
	r.Tables = append(r.Tables, tbl)
	t.checks(r, "claims")
	return nil
}

// profiledWorkers is the worker count whose profiles are kept: 8, or the
// largest below it.
func profiledWorkers(ws []int) int {
	best := 0
	for _, w := range ws {
		if w <= 8 && w > best {
			best = w
		}
	}
	return best
}

func claimResult(group, name string, w, b int, cr claimRun, prof Profile, c effectCounts) Result {
	res := Result{
		Group: group, Name: name, Workers: w, Batch: b, Ops: cr.rows, Unit: "rows/s",
		Seconds: cr.elapsed.Seconds(), PerSecond: perSec(cr.rows, cr.elapsed),
		P50us: us(cr.lat.P50), P99us: us(cr.lat.P99), MaxUs: us(cr.lat.Max),
		Extra: map[string]float64{"duplicates": float64(c.duplicates()), "lost": float64(cr.lost)},
	}
	if cr.rows > 0 && prof.WALBytes > 0 {
		res.Extra["wal_bytes_per_row"] = float64(prof.WALBytes) / float64(cr.rows)
	}
	if prof.MachineCPU > 0 {
		res.Extra["client_cpu_share"] = prof.ClientCPU / prof.MachineCPU
	}
	if prof.ExecSeconds > 0 {
		res.Extra["server_exec_seconds"] = prof.ExecSeconds
	}
	return res
}

func claimRow(res Result) []string {
	wal := "-"
	if v, ok := res.Extra["wal_bytes_per_row"]; ok {
		wal = fmt.Sprintf("%.0f B", v)
	}
	return []string{
		itoa(res.Workers), itoa(res.Batch), fmt.Sprintf("%d", res.Ops), fmt.Sprintf("%.1f", res.Seconds),
		fmt.Sprintf("%.0f", res.PerSecond), fmtUs(res.P50us), fmtUs(res.P99us), wal,
		fmt.Sprintf("%.0f", res.Extra["duplicates"]),
	}
}
