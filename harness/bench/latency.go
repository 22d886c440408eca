package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/pgtest"
)

// The latency scenario: how soon an idle worker starts a row that became
// claimable, and what the idle worker costs meanwhile; pgclaim's
// claim.Worker woken by the table's trigger, by claim.Notify, and by its
// poll alone, beside River's client (herdriver -mode latency) in the same
// run. Then the stampede (many instances × workers woken by one row) and
// what the trigger costs the claims' throughput.

const (
	latPoolConns = 4
	latDDL       = `DROP TABLE IF EXISTS lat_items, lat_effects;
CREATE TABLE lat_items (
    id         bigint PRIMARY KEY,
    status     text NOT NULL,
    claimed_at timestamptz,
    claimed_by text,
    fence      bigint,
    attempts   integer NOT NULL DEFAULT 0
);
CREATE INDEX lat_items_paused ON lat_items (id) WHERE status = 'PAUSED';
CREATE TABLE lat_effects (id bigint NOT NULL, fence bigint NOT NULL);`
	latInsert    = `INSERT INTO lat_items (id, status) VALUES ($1, 'PAUSED')`
	latAttach    = `SELECT pgclaim_notify_on('lat_items'::regclass, 'status', 'PAUSED')`
	latBatchSize = 10
)

var latTable = claim.Table{
	Name: "lat_items", Key: "id", State: "status",
	ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence", Attempts: "attempts",
}

// latOutcome is what one row of the latency table measured.
type latOutcome struct {
	lag            summary
	idleXacts      float64 // server transactions per second of the idle worker
	idleStmts      float64 // statements per second its pool sent (tracer)
	idlePings      float64 // pings per second its pool sent before handing out a connection
	samples        int64
	worked         int64 // distinct sample rows whose work started
	lost, dups     int64
	claimsPerRow   float64
	emptyPerRow    float64
	version        string
	idleMeasured   bool
	statementsSeen bool
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func runLatency(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	servers := &herdServers{e: e, byLimit: map[int]*pgtest.Server{}}
	defer servers.close()
	srv, owned, err := servers.get(ctx, 100)
	if err != nil {
		return err
	}
	admin, err := srv.Admin(ctx)
	if err != nil {
		return err
	}
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		return err
	}
	defer db.Drop(context.WithoutCancel(ctx))
	logs := newLogCount() // the workers' warnings and errors
	limit := "100"
	if !owned {
		limit = "the server's"
	}
	r.setup("one server (max_connections %s); one idle worker with a pool of its own (MaxConns %d); a row inserted in the From state every %s by a plain INSERT on another pool; lag = time.Now() at the start of Work minus time.Now() just before the INSERT (the BEGIN, for claim.Notify); %d samples after one warm-up row", limit, latPoolConns, p.LatencyInterval, p.LatencySamples)
	r.setup("pgclaim: claim.Worker (BatchSize %d, every other setting its default: Concurrency 1, PollInterval 1 s) on table lat_items (partial index WHERE status = 'PAUSED'); the work writes one effect row in its transaction", latBatchSize)
	r.setup("idle transactions/s: xact_commit + xact_rollback of the worker's database (pg_stat_database, read from another database, so the readings add none) over %s with nothing written, %s after the worker listens (statistics reach the view up to 10 s late); every other session on the database is idle then. Idle statements/s: what the worker's pool sent, counted by a pgx tracer; idle pool pings/s: the pings pgxpool sends before handing out a connection idle over 1 s (its default ShouldPing, counted), each a transaction of the server's count; the listening session's own ping (every 10 s quiet) is in neither", p.LatencyIdle, p.LatencySettle)

	tbl := Table{Title: "Pickup latency: one idle worker, one row every " + p.LatencyInterval.String(),
		Columns: []string{"worker", "samples worked", "p50", "p99", "max", "idle transactions/s", "idle statements/s", "idle pool pings/s", "claim statements/row"}}
	var lost, dups int64
	type row struct {
		name, key         string
		produce           func(*pgxpool.Pool) latProducer
		trigger, pollOnly bool
	}
	got := map[string]latOutcome{}
	add := func(name, key, group string, o latOutcome) {
		got[key] = o
		lost += o.lost
		dups += o.dups
		stmts, pings, perRow := "-", "-", "-"
		if o.statementsSeen {
			stmts, pings = fmt.Sprintf("%.2f", o.idleStmts), fmt.Sprintf("%.2f", o.idlePings)
			perRow = fmt.Sprintf("%.2f", o.claimsPerRow)
		}
		tbl.Rows = append(tbl.Rows, []string{name, fmt.Sprintf("%d / %d", o.worked, o.samples), fmtDur(o.lag.P50), fmtDur(o.lag.P99), fmtDur(o.lag.Max),
			fmt.Sprintf("%.2f", o.idleXacts), stmts, pings, perRow})
		r.Results = append(r.Results, Result{Group: group, Name: "latency " + name, Workers: 1, Ops: o.worked, Unit: "rows",
			P50us: us(o.lag.P50), P99us: us(o.lag.P99), MaxUs: us(o.lag.Max),
			Extra: map[string]float64{"idle_transactions_per_second": o.idleXacts, "idle_statements_per_second": o.idleStmts, "idle_pool_pings_per_second": o.idlePings,
				"claim_statements_per_row": o.claimsPerRow, "lost": float64(o.lost), "duplicates": float64(o.dups)}})
	}
	for _, x := range []row{
		{"pgclaim claim.Worker, defaults, trigger attached", "trigger", insertProducer, true, false},
		{"pgclaim claim.Worker, defaults, claim.Notify in the INSERT's transaction", "notify", notifyProducer, false, false},
		{"pgclaim claim.Worker, PollOnly (PollInterval 1 s)", "poll", insertProducer, false, true},
	} {
		e.prog.logf("  latency: %s...", x.name)
		o, err := latPgclaim(ctx, p, admin, db, logs, x.produce, x.trigger, x.pollOnly, 1, 1, p.LatencySamples, true)
		if err != nil {
			return fmt.Errorf("%s: %w%s", x.name, err, logs.first())
		}
		add(x.name, x.key, "pgclaim", o)
	}
	if p.LatencyRiver {
		bin, why := buildHerdRiver(ctx, e)
		if why != "" {
			r.note("River not run: %s", why)
		} else {
			r.setup("River: one river.Client (riverpgxv5, its own pool of %d, MaxWorkers 1 on the default queue) in a fresh database of the same server, jobs inserted by an insert-only client on another pool (client.Insert, which notifies), both with the FetchCooldown given; lag measured in that process as above; a child process built from harness/bench/herdriver (-mode latency), a Go module of its own", latPoolConns)
			for _, c := range []struct {
				key      string
				cooldown time.Duration
			}{{"river", 0}, {"river1ms", time.Millisecond}} {
				label := "River client, default FetchCooldown (100 ms)"
				if c.cooldown > 0 {
					label = "River client, FetchCooldown " + c.cooldown.String()
				}
				e.prog.logf("  latency: %s...", label)
				o, err := latRiver(ctx, p, srv, admin, bin, c.cooldown)
				if err != nil {
					return fmt.Errorf("%s: %w", label, err)
				}
				if o.version != "" {
					label = strings.Replace(label, "River", "River "+o.version, 1)
				}
				add(label, c.key, "baseline", o)
			}
		}
	} else {
		r.note("River not run (--quick: its side needs a build of its own module)")
	}
	r.Tables = append(r.Tables, tbl)

	// The stampede: one row wakes instances × workers.
	st := p.LatencyStampede
	e.prog.logf("  latency: stampede, %d instances × %d workers...", st.Instances, st.Workers)
	so, err := latPgclaim(ctx, p, admin, db, logs, insertProducer, true, false, st.Instances, st.Workers, p.LatencyStampedeSamples, false)
	if err != nil {
		return fmt.Errorf("stampede: %w%s", err, logs.first())
	}
	lost += so.lost
	dups += so.dups
	r.setup("stampede: %d instances × %d claim.Workers (each instance its own pool of %d, the workers of an instance sharing its listening session), trigger attached, %d single rows inserted one at a time every %s; claim statements counted by a pgx tracer on the instances' pools (ClaimBatch's statement), from the first row's INSERT until every row's work started, polls included", st.Instances, st.Workers, latPoolConns, p.LatencyStampedeSamples, p.LatencyInterval)
	r.Tables = append(r.Tables, Table{Title: "Stampede: one row at a time, many idle workers",
		Columns: []string{"shape", "samples worked", "claim statements/row", "of which claimed nothing", "p50", "p99", "max"},
		Rows: [][]string{{fmt.Sprintf("%d instances × %d workers, trigger", st.Instances, st.Workers), fmt.Sprintf("%d / %d", so.worked, so.samples),
			fmt.Sprintf("%.2f", so.claimsPerRow), fmt.Sprintf("%.2f", so.emptyPerRow), fmtDur(so.lag.P50), fmtDur(so.lag.P99), fmtDur(so.lag.Max)}}})
	r.Results = append(r.Results, Result{Group: "pgclaim", Name: fmt.Sprintf("latency stampede %d × %d, trigger attached", st.Instances, st.Workers),
		Workers: st.Instances * st.Workers, Ops: so.worked, Unit: "rows", P50us: us(so.lag.P50), P99us: us(so.lag.P99), MaxUs: us(so.lag.Max),
		Extra: map[string]float64{"claim_statements_per_row": so.claimsPerRow, "empty_claims_per_row": so.emptyPerRow}})

	// What the trigger costs the claims.
	if err := latThroughput(ctx, e, p, r); err != nil {
		return fmt.Errorf("throughput: %w", err)
	}

	if t, ok := got["trigger"]; ok {
		for _, k := range []string{"river", "river1ms"} {
			if rv, ok := got[k]; ok && rv.lag.P50 > 0 && rv.lag.P99 > 0 {
				r.note("pgclaim (trigger) / %s: p50 %.2f×, p99 %.2f× (%s / %s, %s / %s); idle transactions/s %.2f vs %.2f", k,
					float64(t.lag.P50)/float64(rv.lag.P50), float64(t.lag.P99)/float64(rv.lag.P99),
					fmtDur(t.lag.P50), fmtDur(rv.lag.P50), fmtDur(t.lag.P99), fmtDur(rv.lag.P99), t.idleXacts, rv.idleXacts)
			}
		}
		if pl, ok := got["poll"]; ok && t.lag.P50 > 0 {
			r.note("trigger vs PollOnly: p50 %s vs %s (%.0f× sooner)", fmtDur(t.lag.P50), fmtDur(pl.lag.P50), float64(pl.lag.P50)/float64(t.lag.P50))
		}
	}
	if rows := logs.rows(); len(rows) > 0 {
		r.Tables = append(r.Tables, Table{Title: "Latency: the workers' warnings and errors (most frequent first)",
			Columns: []string{"records", "level, message: error"}, Rows: rows[:min(len(rows), 4)]})
	}
	r.check("latency: sample rows not worked (lost)", 0, lost)
	r.check("latency: duplicate effects (a row's effect written twice)", 0, dups)
	return nil
}

// latThroughput runs the claims scenario's loop (8 workers) without and
// with the trigger attached, in turns, and reports the ratio.
func latThroughput(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	_, pool, done, err := e.scratch(ctx, p.LatencyClaimWorkers*2+2)
	if err != nil {
		return err
	}
	defer done()
	if _, err := pool.Exec(ctx, pushDDL); err != nil {
		return err
	}
	ops, err := pgclaimOps(pool)
	if err != nil {
		return err
	}
	r.setup("throughput: the claims scenario's loop (ClaimBatch → BEGIN; FinishBatch; INSERT the effects; COMMIT) with %d workers on %d PAUSED rows of bench_push, without and with pgclaim_notify_on('bench_push', 'status', 'PAUSED'), in turns (%d runs each, median; a run stops claiming after %s), on the bench's main server", p.LatencyClaimWorkers, p.LatencyClaimRows, p.LatencyClaimRepeats, p.ClaimTimeBox)
	tbl := Table{Title: "What the trigger costs the claims (claims scenario loop)",
		Columns: []string{"workers", "batch", "without trigger rows/s", "with trigger rows/s", "with / without"}}
	var t tally
	for _, b := range p.LatencyClaimBatches {
		rates := map[bool][]float64{}
		for i := range 2 * p.LatencyClaimRepeats {
			// off, on, on, off, …: drift favours neither.
			on := i%4 == 1 || i%4 == 2
			q := "SELECT pgclaim_notify_off('bench_push'::regclass, 'status', 'PAUSED')"
			if on {
				q = "SELECT pgclaim_notify_on('bench_push'::regclass, 'status', 'PAUSED')"
			}
			if _, err := pool.Exec(ctx, q); err != nil {
				return err
			}
			cr, err := drainOnce(ctx, e, pool, fmt.Sprintf("  latency: claims workers=%d batch=%d trigger=%v", p.LatencyClaimWorkers, b, on),
				p.LatencyClaimRows, p.LatencyClaimWorkers, b, p.ClaimTimeBox, ops, &t)
			if err != nil {
				return err
			}
			rates[on] = append(rates[on], perSec(cr.rows, cr.elapsed))
		}
		off, on := medianF(rates[false]), medianF(rates[true])
		ratio := 0.0
		if off > 0 {
			ratio = on / off
		}
		tbl.Rows = append(tbl.Rows, []string{itoa(p.LatencyClaimWorkers), itoa(b), fmt.Sprintf("%.0f", off), fmt.Sprintf("%.0f", on), fmt.Sprintf("%.3f", ratio)})
		for _, x := range []struct {
			name string
			v    float64
		}{{"latency throughput, no trigger", off}, {"latency throughput, trigger attached", on}} {
			r.Results = append(r.Results, Result{Group: "pgclaim", Name: x.name, Workers: p.LatencyClaimWorkers, Batch: b, Unit: "rows/s", PerSecond: x.v,
				Extra: map[string]float64{"with_over_without": ratio}})
		}
		r.note("trigger attached / not, %d workers, batch %d: %.3f× the claims' throughput (same run)", p.LatencyClaimWorkers, b, ratio)
	}
	r.Tables = append(r.Tables, tbl)
	t.checks(r, "latency throughput")
	return nil
}

// drainOnce drains a fresh push table of rows once, workers × batch, and
// adds its invariant counts to t.
func drainOnce(ctx context.Context, e *env, pool *pgxpool.Pool, label string, rows, workers, batch int, box time.Duration, ops func(int) batchOps, t *tally) (claimRun, error) {
	if err := resetPush(ctx, pool, rows); err != nil {
		return claimRun{}, err
	}
	var n atomic.Int64
	end := e.prog.task(label, "rows", int64(rows), n.Load)
	cr, err := drainBatches(ctx, pool, workers, batch, time.Now().Add(box), ops, &n)
	end()
	if err != nil {
		return cr, err
	}
	c, err := countEffects(ctx, pool)
	if err != nil {
		return cr, err
	}
	t.add(c, cr.lost)
	return cr, nil
}

// medianF is the median of v (the mean of the two middles of an even
// count).
func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	return (s[(n-1)/2] + s[n/2]) / 2
}

// fmtDur prints a lag: µs below a millisecond, ms below a second.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmtUs(us(d))
}
