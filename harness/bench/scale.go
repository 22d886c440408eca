package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
)

const scaleDDL = `
CREATE TABLE bench_scale (
    id         bigint PRIMARY KEY,
    status     text NOT NULL,
    claimed_at timestamptz,
    claimed_by text,
    fence      bigint,
    attempts   integer NOT NULL DEFAULT 0,
    payload    text NOT NULL
)`

// The index pgclaim's docs recommend: only claimable rows are in it.
const scaleIndex = `CREATE INDEX bench_scale_paused ON bench_scale (id) WHERE status = 'PAUSED'`

var scaleTable = claim.Table{
	Name: "bench_scale", Key: "id", State: "status",
	ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence", Attempts: "attempts",
}

// runScale grows a table through the sizes of p.ScaleSizes, keeping
// ScaleClaimable rows PAUSED (spread at random) and every other row DONE,
// and measures ClaimBatch latency at each size with and without the
// partial index.
func runScale(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, pool, done, err := e.scratch(ctx, 4)
	if err != nil {
		return err
	}
	defer done()
	if _, err := pool.Exec(ctx, scaleDDL); err != nil {
		return err
	}
	c, err := claim.New[int64](pool, scaleTable, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: "bench-scale"})
	if err != nil {
		return err
	}
	r.setup("table bench_scale grown to %v rows; %d of them PAUSED at random keys, all others DONE", p.ScaleSizes, p.ScaleClaimable)
	r.setup("a sample is one ClaimBatch(%d) (ORDER BY id, FOR UPDATE SKIP LOCKED), timed alone; the claimed rows are put back to PAUSED between samples", p.ScaleBatch)
	r.setup("with index: %s — %d samples per size", scaleIndex, p.ScaleSamples)
	r.setup("without it (only the primary key): %d samples, sizes up to %d", p.ScaleNoIndexSamples, p.ScaleNoIndexMax)

	tbl := Table{Title: fmt.Sprintf("ClaimBatch(%d) latency with %d claimable rows", p.ScaleBatch, p.ScaleClaimable),
		Columns: []string{"table rows", "index", "samples", "p50", "p99", "max", "buffers/claim", "plan"}}
	var have int64
	for _, n := range p.ScaleSizes {
		if _, err := pool.Exec(ctx, "DROP INDEX IF EXISTS bench_scale_paused"); err != nil {
			return err
		}
		e.prog.logf("  scale: growing the table to %d rows", n)
		if err := growScale(ctx, pool, have, n, p.ScaleClaimable); err != nil {
			return err
		}
		have = n
		variants := []struct {
			index   bool
			samples int
		}{{true, p.ScaleSamples}}
		if n <= p.ScaleNoIndexMax && p.ScaleNoIndexSamples > 0 {
			variants = append([]struct {
				index   bool
				samples int
			}{{false, p.ScaleNoIndexSamples}}, variants...)
		}
		for _, v := range variants {
			if v.index {
				if _, err := pool.Exec(ctx, scaleIndex); err != nil {
					return err
				}
				if _, err := pool.Exec(ctx, "ANALYZE bench_scale"); err != nil {
					return err
				}
			}
			label := fmt.Sprintf("%d rows, %s", n, indexLabel(v.index))
			plan, buffers, err := explainClaim(ctx, pool, p.ScaleBatch)
			if err != nil {
				return err
			}
			ph := e.begin(ctx, db.Name)
			s, err := scaleSamples(ctx, e, pool, c, p.ScaleBatch, v.samples, label)
			if err != nil {
				return err
			}
			prof := ph.end(ctx, "scale "+label, 3)
			if st, ok := prof.maxStatement("pgclaim_c"); ok && st.BlocksPerCall > 0 {
				buffers = st.BlocksPerCall
			}
			if n == p.ScaleSizes[len(p.ScaleSizes)-1] {
				r.Profiles = append(r.Profiles, prof)
			}
			res := Result{Group: "pgclaim", Name: "ClaimBatch, " + indexLabel(v.index), Batch: p.ScaleBatch, TableRows: n,
				Ops: int64(s.N), Unit: "claims", P50us: us(s.P50), P99us: us(s.P99), MaxUs: us(s.Max),
				Extra: map[string]float64{"buffers_per_claim": buffers}}
			r.Results = append(r.Results, res)
			tbl.Rows = append(tbl.Rows, []string{fmt.Sprintf("%d", n), indexLabel(v.index), itoa(s.N), fmtUs(res.P50us),
				fmtUs(res.P99us), fmtUs(res.MaxUs), fmt.Sprintf("%.0f", buffers), plan})
		}
	}
	r.Tables = append(r.Tables, tbl)
	left, err := scanInt64(ctx, pool, "SELECT count(*) FROM bench_scale WHERE status = 'PAUSED'")
	if err != nil {
		return err
	}
	r.check("scale: claimable rows restored after the samples", int64(p.ScaleClaimable), left)
	return nil
}

func indexLabel(on bool) string {
	if on {
		return "partial index"
	}
	return "no partial index"
}

// growScale adds DONE rows (from+1 .. to) and re-spreads the claimable rows
// at random over the whole table.
func growScale(ctx context.Context, pool *pgxpool.Pool, from, to int64, claimable int) error {
	return execAllArgs(ctx, pool,
		stmt{`INSERT INTO bench_scale (id, status, claimed_at, claimed_by, fence, attempts, payload)
SELECT g, 'DONE', now() - interval '1 day', 'seed', g, 1, 'p' FROM generate_series($1::bigint + 1, $2::bigint) AS g`, []any{from, to}},
		stmt{"UPDATE bench_scale SET status = 'DONE' WHERE status <> 'DONE'", nil},
		stmt{`UPDATE bench_scale SET status = 'PAUSED' WHERE id IN (
  SELECT DISTINCT 1 + floor(random() * $1::bigint)::bigint FROM generate_series(1, $2::int * 2) LIMIT $2::int)`, []any{to, claimable}},
		stmt{"VACUUM ANALYZE bench_scale", nil},
		stmt{"CHECKPOINT", nil},
	)
}

// scaleSamples times n ClaimBatch calls (after a few unrecorded ones),
// putting the claimed rows back to PAUSED after each.
func scaleSamples(ctx context.Context, e *env, pool *pgxpool.Pool, c *claim.Claimer[int64], batch, n int, label string) (summary, error) {
	var ds []time.Duration
	done := 0
	end := e.prog.task("  scale: "+label, "claims", int64(n), func() int64 { return int64(done) })
	defer end()
	for i := -3; i < n; i++ {
		t0 := time.Now()
		cls, err := c.ClaimBatch(ctx, batch)
		d := time.Since(t0)
		if err != nil {
			return summary{}, err
		}
		if len(cls) == 0 {
			return summary{}, fmt.Errorf("nothing claimable")
		}
		keys := make([]int64, len(cls))
		for j, cl := range cls {
			keys[j] = cl.Key
		}
		if _, err := pool.Exec(ctx, "UPDATE bench_scale SET status = 'PAUSED' WHERE id = ANY($1)", keys); err != nil {
			return summary{}, err
		}
		if i >= 0 {
			ds = append(ds, d)
			done++
		}
	}
	return summarize(ds), nil
}

// explainClaim runs EXPLAIN ANALYZE of the selection part of a batch claim
// (the same SELECT … FOR UPDATE SKIP LOCKED ClaimBatch runs) in a
// transaction rolled back, and returns the scan used and the buffers it
// touched.
func explainClaim(ctx context.Context, pool *pgxpool.Pool, batch int) (string, float64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var raw []byte
	err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM bench_scale WHERE status = 'PAUSED' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, batch).Scan(&raw)
	if err != nil {
		return "", 0, err
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) == 0 {
		return "", 0, fmt.Errorf("explain: %v", err)
	}
	top := plans[0].Plan
	scan := top.scan()
	return scan, float64(top.SharedHit + top.SharedRead), nil
}

type planNode struct {
	NodeType   string     `json:"Node Type"`
	IndexName  string     `json:"Index Name"`
	SharedHit  int64      `json:"Shared Hit Blocks"`
	SharedRead int64      `json:"Shared Read Blocks"`
	Plans      []planNode `json:"Plans"`
}

// scan names the innermost scan of the plan.
func (n planNode) scan() string {
	for _, c := range n.Plans {
		if s := c.scan(); s != "" {
			return s
		}
	}
	switch n.NodeType {
	case "Index Scan", "Index Only Scan", "Bitmap Index Scan":
		return n.NodeType + " on " + n.IndexName
	case "Seq Scan":
		return "Seq Scan"
	}
	return ""
}
