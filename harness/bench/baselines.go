package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
)

// runBaselines measures, on the same server and table shape as the claims
// scenario: the single bulk UPDATE (the ceiling for moving rows), the
// field's SELECT-then-CAS loop, hand-written SKIP LOCKED SQL next to
// pgclaim at the same settings, and pgclaim's worker loop.
func runBaselines(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, err := e.database(ctx)
	if err != nil {
		return err
	}
	defer db.Drop(context.WithoutCancel(ctx))
	maxW := 8
	for _, c := range p.Compare {
		maxW = max(maxW, c.Workers)
	}
	for _, k := range p.FieldInstances {
		maxW = max(maxW, k)
	}
	pool, err := e.pool(ctx, db, maxW*2+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, pushDDL); err != nil {
		return err
	}
	r.setup("same table as the claims scenario: %d PAUSED rows, fresh for each run", p.ClaimRows)
	r.setup("bulk UPDATE: one statement moves every PAUSED row; median of %d runs", p.BulkRepeats)
	r.setup("field loop: K instances (own pools) each SELECT every PAUSED id, then per id: CAS UPDATE … WHERE id = $1 AND status = 'PAUSED' (autocommit); when won, BEGIN; INSERT effect; UPDATE … SET status = 'DONE'; COMMIT")
	r.setup("hand-written SQL: UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT batch) RETURNING, then one fenced finish + effects per batch: the loop of the claims scenario without pgclaim")
	r.setup("a second hand-written variant runs its claim as an unnamed statement planned at every execution (pgx QueryExecModeCacheDescribe), as ClaimBatch did before its states were written into its text; ClaimBatch is now a prepared statement like the first")
	r.setup("hand-written SQL (both variants) and pgclaim take turns, %d runs each at %v (workers, batch); the median run is shown with the range", max(1, p.CompareRepeats), p.Compare)
	r.setup("claim.Worker: Drain with BatchSize = batch and Concurrency = workers; every row's work (the effect) and finish in its own transaction; %d rows", p.WorkerRows)
	r.setup("time box per run: %s", p.ClaimTimeBox)

	tbl := Table{Title: "Baselines beside pgclaim (same server, same run)",
		Columns: []string{"approach", "workers", "batch", "rows", "s", "rows/s", "range of runs", "p50", "p99", "dup"}}
	row := func(res Result) {
		spread := "-"
		if res.Extra["runs"] > 1 {
			spread = fmt.Sprintf("%.0f–%.0f (%d runs)", res.Extra["min_per_second"], res.Extra["max_per_second"], int(res.Extra["runs"]))
		}
		tbl.Rows = append(tbl.Rows, []string{res.Name, itoa(res.Workers), itoa(res.Batch), fmt.Sprintf("%d", res.Ops),
			fmt.Sprintf("%.2f", res.Seconds), fmt.Sprintf("%.0f", res.PerSecond), spread, fmtUs(res.P50us), fmtUs(res.P99us),
			fmt.Sprintf("%.0f", res.Extra["duplicates"])})
		r.Results = append(r.Results, res)
	}
	var t tally

	// 1. bulk UPDATE, plain and with the effects written by the same statement.
	for _, v := range []struct{ name, sql string }{
		{"bulk UPDATE (ceiling)", `UPDATE bench_push SET status = 'DONE', claimed_at = now(), claimed_by = 'bulk',
  fence = (SELECT nextval('pgclaim_fence_seq')), attempts = attempts + 1 WHERE status = 'PAUSED'`},
		{"bulk UPDATE + effects (ceiling)", `WITH moved AS (
  UPDATE bench_push SET status = 'DONE', claimed_at = now(), claimed_by = 'bulk',
    fence = (SELECT nextval('pgclaim_fence_seq')), attempts = attempts + 1 WHERE status = 'PAUSED'
  RETURNING id, fence)
INSERT INTO bench_effects (id, fence, worker) SELECT id, fence, 0 FROM moved`},
	} {
		var ds []time.Duration
		var prof Profile
		var n int64
		for range max(1, p.BulkRepeats) {
			if err := resetPush(ctx, pool, p.ClaimRows); err != nil {
				return err
			}
			e.prog.logf("  baselines: %s over %d rows", v.name, p.ClaimRows)
			ph := e.begin(ctx, db.Name)
			t0 := time.Now()
			tag, err := pool.Exec(ctx, v.sql)
			if err != nil {
				return err
			}
			ds = append(ds, time.Since(t0))
			prof = ph.end(ctx, v.name, 3)
			n = tag.RowsAffected()
		}
		d := median(ds)
		res := Result{Group: "baseline", Name: v.name, Workers: 1, Ops: n, Unit: "rows/s",
			Seconds: d.Seconds(), PerSecond: perSec(n, d), Extra: map[string]float64{"duplicates": 0}}
		if prof.WALBytes > 0 && n > 0 {
			res.Extra["wal_bytes_per_row"] = float64(prof.WALBytes) / float64(n)
		}
		row(res)
		r.Profiles = append(r.Profiles, prof)
	}

	// 2. the field loop.
	for _, k := range p.FieldInstances {
		if err := resetPush(ctx, pool, p.ClaimRows); err != nil {
			return err
		}
		var rows, skipped atomic.Int64
		end := e.prog.task(fmt.Sprintf("  baselines: field loop, %d instances", k), "rows", int64(p.ClaimRows), rows.Load)
		ph := e.begin(ctx, db.Name)
		cr, err := fieldLoop(ctx, e, db.URL, k, time.Now().Add(p.ClaimTimeBox), &rows, &skipped)
		prof := ph.end(ctx, fmt.Sprintf("field loop %d instances", k), 5)
		end()
		if err != nil {
			return err
		}
		c, err := countEffects(ctx, pool)
		if err != nil {
			return err
		}
		t.add(c, 0)
		res := claimResult("baseline", "field loop (SELECT all, CAS each)", k, 1, cr, prof, c)
		res.Extra["lost_cas"] = float64(skipped.Load())
		row(res)
		r.Profiles = append(r.Profiles, prof)
	}

	// 3. hand-written SQL and pgclaim at the same settings, alternating,
	// p.CompareRepeats runs each; the median run is reported.
	pg, err := pgclaimOps(pool)
	if err != nil {
		return err
	}
	type measured struct {
		res  Result
		prof Profile
	}
	for _, cp := range p.Compare {
		variants := []struct {
			group, name string
			ops         func(w int) batchOps
		}{
			{"baseline", "hand-written SKIP LOCKED SQL", handOps(pool, false)},
			{"baseline", "hand-written SQL, claim planned per execution", handOps(pool, true)},
			{"pgclaim", "pgclaim ClaimBatch + FinishBatch", pg},
		}
		runs := make([][]measured, len(variants))
		for rep := range max(1, p.CompareRepeats) {
			for j := range variants {
				vi := (j + rep) % len(variants) // rotate which goes first
				v := variants[vi]
				if err := resetPush(ctx, pool, p.ClaimRows); err != nil {
					return err
				}
				var rows atomic.Int64
				end := e.prog.task(fmt.Sprintf("  baselines: %s workers=%d batch=%d (run %d)", v.name, cp.Workers, cp.Batch, rep+1), "rows", int64(p.ClaimRows), rows.Load)
				ph := e.begin(ctx, db.Name)
				cr, err := drainBatches(ctx, pool, cp.Workers, cp.Batch, time.Now().Add(p.ClaimTimeBox), v.ops, &rows)
				prof := ph.end(ctx, fmt.Sprintf("%s workers=%d batch=%d", v.name, cp.Workers, cp.Batch), 5)
				end()
				if err != nil {
					return err
				}
				c, err := countEffects(ctx, pool)
				if err != nil {
					return err
				}
				t.add(c, cr.lost)
				runs[vi] = append(runs[vi], measured{claimResult(v.group, v.name, cp.Workers, cp.Batch, cr, prof, c), prof})
			}
		}
		for _, ms := range runs {
			slices.SortFunc(ms, func(a, b measured) int { return cmp.Compare(a.res.PerSecond, b.res.PerSecond) })
			m := ms[len(ms)/2]
			m.res.Extra["runs"] = float64(len(ms))
			m.res.Extra["min_per_second"] = ms[0].res.PerSecond
			m.res.Extra["max_per_second"] = ms[len(ms)-1].res.PerSecond
			row(m.res)
			r.Profiles = append(r.Profiles, m.prof)
		}
	}

	// 4. pgclaim's worker loop.
	for _, cp := range p.Compare {
		if err := resetPush(ctx, pool, p.WorkerRows); err != nil {
			return err
		}
		wpool, err := e.pool(ctx, db, cp.Workers+2)
		if err != nil {
			return err
		}
		var rows atomic.Int64
		end := e.prog.task(fmt.Sprintf("  baselines: claim.Worker concurrency=%d batch=%d", cp.Workers, cp.Batch), "rows", int64(p.WorkerRows), rows.Load)
		ph := e.begin(ctx, db.Name)
		cr, err := workerDrain(ctx, wpool, cp.Workers, cp.Batch, p.ClaimTimeBox, &rows)
		prof := ph.end(ctx, fmt.Sprintf("claim.Worker concurrency=%d batch=%d", cp.Workers, cp.Batch), 5)
		end()
		wpool.Close()
		if err != nil {
			return err
		}
		c, err := countEffects(ctx, pool)
		if err != nil {
			return err
		}
		t.add(c, cr.lost)
		row(claimResult("pgclaim", "pgclaim claim.Worker (tx per row)", cp.Workers, cp.Batch, cr, prof, c))
		r.Profiles = append(r.Profiles, prof)
	}
	r.Tables = append(r.Tables, tbl)
	t.checks(r, "baselines")
	return nil
}

// fieldLoop runs the field article's job on k instances at once: each
// selects every PAUSED id, then moves them one by one with a CAS.
func fieldLoop(ctx context.Context, e *env, url string, k int, deadline time.Time, rows, skipped *atomic.Int64) (claimRun, error) {
	pools := make([]*pgxpool.Pool, k)
	defer func() {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}()
	for i := range pools {
		p, err := openPool(ctx, url, 2)
		if err != nil {
			return claimRun{}, err
		}
		pools[i] = p
	}
	var lat latencies
	start := time.Now()
	err := runGroup(k, func(i int) error {
		pool := pools[i]
		holder := fmt.Sprintf("field-%d", i)
		r, err := pool.Query(ctx, "SELECT id FROM bench_push WHERE status = 'PAUSED' ORDER BY id")
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(r, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		own := make([]time.Duration, 0, len(ids))
		defer func() { lat.addAll(own) }()
		for _, id := range ids {
			if !time.Now().Before(deadline) {
				return nil
			}
			t0 := time.Now()
			tag, err := pool.Exec(ctx, "UPDATE bench_push SET status = 'PROCESSING', claimed_at = now(), claimed_by = $2 WHERE id = $1 AND status = 'PAUSED'", id, holder)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				skipped.Add(1) // another instance won it
				continue
			}
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO bench_effects (id, fence, worker) VALUES ($1, 0, $2)", id, i); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "UPDATE bench_push SET status = 'DONE' WHERE id = $1 AND status = 'PROCESSING'", id)
				return err
			})
			if err != nil {
				return err
			}
			own = append(own, time.Since(t0))
			rows.Add(1)
		}
		return nil
	})
	return claimRun{rows: rows.Load(), elapsed: time.Since(start), lat: lat.summary()}, err
}

// workerDrain drains the push table with claim.Worker, writing each row's
// effect in the transaction that finishes it. It stops after timeBox.
func workerDrain(ctx context.Context, pool *pgxpool.Pool, conc, batch int, timeBox time.Duration, rows *atomic.Int64) (claimRun, error) {
	c, err := claim.New[int64](pool, pushTable, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: "bench-worker"})
	if err != nil {
		return claimRun{}, err
	}
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{
		Work: func(ctx context.Context, tx pgx.Tx, cl claim.Claim[int64]) error {
			_, err := tx.Exec(ctx, "INSERT INTO bench_effects (id, fence, worker) VALUES ($1, $2, 0)", cl.Key, cl.Fence)
			if err == nil {
				rows.Add(1)
			}
			return err
		},
		Done: "DONE", Failed: "FAILED", BatchSize: batch, Concurrency: conc,
		PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		return claimRun{}, err
	}
	dctx, cancel := context.WithTimeout(ctx, timeBox)
	defer cancel()
	start := time.Now()
	st, err := w.Drain(dctx)
	el := time.Since(start)
	if err != nil && dctx.Err() == nil {
		return claimRun{}, err
	}
	return claimRun{rows: int64(st.Succeeded), lost: int64(st.Lost + st.Failed), elapsed: el}, nil
}
