package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/internal/listen"
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

// latTracer counts the statements a pool sends, and among them the claim
// statements (ClaimBatch's) and those that claimed nothing; and the pings
// the pool sends before handing out a connection (shouldPing).
type latTracer struct{ all, claims, empty, pings atomic.Int64 }

// shouldPing is pgxpool's default (ping a connection idle over a second),
// counted.
func (t *latTracer) shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	if p.IdleDuration > time.Second {
		t.pings.Add(1)
		return true
	}
	return false
}

type latClaimKey struct{}

// isClaimStatement matches ClaimBatch's statement (claim/sql.go).
func isClaimStatement(sql string) bool {
	return strings.Contains(sql, "pgclaim_c AS (") && strings.Contains(sql, "SKIP LOCKED")
}

func (t *latTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.all.Add(1)
	if isClaimStatement(d.SQL) {
		t.claims.Add(1)
		return context.WithValue(ctx, latClaimKey{}, true)
	}
	return ctx
}

func (t *latTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(latClaimKey{}) != nil && d.Err == nil && d.CommandTag.RowsAffected() == 0 {
		t.empty.Add(1)
	}
}

// latLog records when each row was written and when its work started.
type latLog struct {
	mu      sync.Mutex
	sent    map[int64]time.Time
	started map[int64][]time.Time
	arrived chan struct{}
}

func newLatLog() *latLog {
	return &latLog{sent: map[int64]time.Time{}, started: map[int64][]time.Time{}, arrived: make(chan struct{}, 1)}
}

func (l *latLog) send(id int64, t time.Time) {
	l.mu.Lock()
	l.sent[id] = t
	l.mu.Unlock()
}

func (l *latLog) start(id int64, t time.Time) {
	l.mu.Lock()
	l.started[id] = append(l.started[id], t)
	l.mu.Unlock()
	select {
	case l.arrived <- struct{}{}:
	default:
	}
}

// all reports whether every row of ids was started.
func (l *latLog) all(ids []int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if len(l.started[id]) == 0 {
			return false
		}
	}
	return true
}

// wait waits until every row of ids was started, or d has passed.
func (l *latLog) wait(ctx context.Context, d time.Duration, ids []int64) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for !l.all(ids) {
		select {
		case <-l.arrived:
		case <-t.C:
			return l.all(ids)
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// lags are the start lags of ids (the first start of each).
func (l *latLog) lags(ids []int64) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for _, id := range ids {
		if st := l.started[id]; len(st) > 0 {
			out = append(out, st[0].Sub(l.sent[id]))
		}
	}
	return out
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

// latProducer writes one claimable row: a plain INSERT, or the INSERT and
// claim.Notify in one transaction.
type latProducer func(ctx context.Context, id int64) error

func insertProducer(pool *pgxpool.Pool) latProducer {
	return func(ctx context.Context, id int64) error {
		_, err := pool.Exec(ctx, latInsert, id)
		return err
	}
}

func notifyProducer(pool *pgxpool.Pool) latProducer {
	return func(ctx context.Context, id int64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, latInsert, id); err != nil {
				return err
			}
			return claim.Notify(ctx, tx, "lat_items", "PAUSED")
		})
	}
}

// latXacts returns the database's transactions so far (committed and
// rolled back), as pg_stat_database has them; read from the admin
// database, so the reading adds none.
func latXacts(ctx context.Context, admin *pgxpool.Pool, db string) (float64, error) {
	var x float64
	err := admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, db).Scan(&x)
	return x, err
}

// idleWindow measures the database's transactions per second over d,
// with nothing written: the idle workers' own; and, with tr, the
// statements and pings their pools sent per second.
func idleWindow(ctx context.Context, admin *pgxpool.Pool, db string, d time.Duration, tr *latTracer) (xacts, statements, pings float64, err error) {
	x0, err := latXacts(ctx, admin, db)
	if err != nil {
		return 0, 0, 0, err
	}
	var s0, p0 int64
	if tr != nil {
		s0, p0 = tr.all.Load(), tr.pings.Load()
	}
	t0 := time.Now()
	if err := sleepUntil(ctx, t0.Add(d)); err != nil {
		return 0, 0, 0, err
	}
	x1, err := latXacts(ctx, admin, db)
	if err != nil {
		return 0, 0, 0, err
	}
	el := time.Since(t0).Seconds()
	if tr != nil {
		statements, pings = float64(tr.all.Load()-s0)/el, float64(tr.pings.Load()-p0)/el
	}
	return (x1 - x0) / el, statements, pings, nil
}

// awaitListeners waits until n listening sessions of pgclaim are on db
// (they name themselves "pgclaim listener …", the pools here naming none).
func awaitListeners(ctx context.Context, admin *pgxpool.Pool, db string, n int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		got, err := scanInt64(ctx, admin, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE $2 || '%'`, db, listen.ApplicationName)
		if err != nil {
			return err
		}
		if got >= int64(n) {
			// The session names itself just before its LISTEN.
			return sleepUntil(ctx, time.Now().Add(100*time.Millisecond))
		}
		if time.Now().After(deadline) {
			var seen string
			_ = admin.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s: %s', application_name, left(query, 40)), '; '), 'none')
  FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db).Scan(&seen)
			return fmt.Errorf("%d of %d listening sessions after %s (sessions on the database: %s)", got, n, d, seen)
		}
		if err := sleepUntil(ctx, time.Now().Add(20*time.Millisecond)); err != nil {
			return err
		}
	}
}

// latWorkers runs instances × perInstance claim.Workers on lat_items, each
// instance its own pool of latPoolConns with tr as its tracer; stop ends
// them and returns their first error.
func latWorkers(ctx context.Context, url string, instances, perInstance int, pollOnly bool, tr *latTracer, log *latLog, logger *slog.Logger) (stop func() error, err error) {
	rctx, cancel := context.WithCancel(ctx)
	var pools []*pgxpool.Pool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var runErr error
	stop = func() error {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			runErr = cmpErr(runErr, errors.New("the workers did not stop within 30 s"))
		}
		for _, p := range pools {
			p.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		return runErr
	}
	work := func(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error {
		log.start(c.Key, time.Now())
		_, err := tx.Exec(ctx, `INSERT INTO lat_effects (id, fence) VALUES ($1, $2)`, c.Key, c.Fence)
		return err
	}
	for i := range instances {
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			_ = stop()
			return nil, err
		}
		pc.MaxConns = latPoolConns
		pc.ConnConfig.Tracer = tr
		pc.ShouldPing = tr.shouldPing
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			_ = stop()
			return nil, err
		}
		pools = append(pools, pool)
		for j := range perInstance {
			c, err := claim.New[int64](pool, latTable, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: fmt.Sprintf("lat-%d-%d", i, j), Logger: logger})
			if err != nil {
				_ = stop()
				return nil, err
			}
			w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", BatchSize: latBatchSize, PollOnly: pollOnly})
			if err != nil {
				_ = stop()
				return nil, err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := w.Run(rctx); err != nil {
					mu.Lock()
					runErr = cmpErr(runErr, err)
					mu.Unlock()
				}
			}()
		}
	}
	return stop, nil
}

// latSampleRows writes ids one at a time, one every interval, each stamped
// just before it is written.
func latSampleRows(ctx context.Context, produce latProducer, log *latLog, ids []int64, interval time.Duration) error {
	t0 := time.Now()
	for i, id := range ids {
		if err := sleepUntil(ctx, t0.Add(time.Duration(i)*interval)); err != nil {
			return err
		}
		log.send(id, time.Now())
		if err := produce(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// latCounts reads the invariants: sample rows not DONE, effects beyond the
// first of a row.
func latCounts(ctx context.Context, pool *pgxpool.Pool, rows int64) (lost, dups int64, err error) {
	var done int64
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM lat_items WHERE status = 'DONE'),
  (SELECT count(*) - count(DISTINCT id) FROM lat_effects)`).Scan(&done, &dups)
	return rows - done, dups, err
}

// latPgclaim measures one pgclaim row: instances × perInstance workers, the
// trigger attached or not, rows written by produce.
func latPgclaim(ctx context.Context, p *params, admin *pgxpool.Pool, db *pgtest.Database, logs *logCount, produce func(*pgxpool.Pool) latProducer,
	trigger, pollOnly bool, instances, perInstance, samples int, idle bool) (latOutcome, error) {
	var o latOutcome
	if _, err := db.Pool.Exec(ctx, latDDL); err != nil {
		return o, err
	}
	if trigger {
		if _, err := db.Pool.Exec(ctx, latAttach); err != nil {
			return o, err
		}
	}
	prod, err := openPool(ctx, db.URL, 2)
	if err != nil {
		return o, err
	}
	defer prod.Close()
	tr := &latTracer{}
	log := newLatLog()
	stop, err := latWorkers(ctx, db.URL, instances, perInstance, pollOnly, tr, log, slog.New(logs))
	if err != nil {
		return o, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	if !pollOnly {
		if err := awaitListeners(ctx, admin, db.Name, instances, 15*time.Second); err != nil {
			return o, err
		}
	}
	if idle {
		// Statistics of a backend reach pg_stat_database when it goes
		// idle, at most once a second, or up to 10 s later: the start-up's
		// are in before the window opens.
		if err := sleepUntil(ctx, time.Now().Add(p.LatencySettle)); err != nil {
			return o, err
		}
		if o.idleXacts, o.idleStmts, o.idlePings, err = idleWindow(ctx, admin, db.Name, p.LatencyIdle, tr); err != nil {
			return o, err
		}
		o.idleMeasured, o.statementsSeen = true, true
	}
	// A warm-up row (not sampled), then the samples.
	produceRow := produce(prod)
	warm := []int64{0}
	if err := latSampleRows(ctx, produceRow, log, warm, 0); err != nil {
		return o, err
	}
	if !log.wait(ctx, 10*time.Second, warm) {
		return o, errors.New("the warm-up row was not worked within 10 s")
	}
	if err := sleepUntil(ctx, time.Now().Add(200*time.Millisecond)); err != nil {
		return o, err
	}
	ids := make([]int64, samples)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	c0, e0 := tr.claims.Load(), tr.empty.Load()
	if err := latSampleRows(ctx, produceRow, log, ids, p.LatencyInterval); err != nil {
		return o, err
	}
	log.wait(ctx, 5*time.Second, ids) // the poll (1 s) finds what was not announced
	c1, e1 := tr.claims.Load(), tr.empty.Load()
	stopped = true
	if err := stop(); err != nil {
		return o, err
	}
	o.samples = int64(samples)
	lags := log.lags(ids)
	o.worked = int64(len(lags))
	o.lag = summarize(lags)
	o.claimsPerRow = float64(c1-c0) / float64(samples)
	o.emptyPerRow = float64(e1-e0) / float64(samples)
	o.lost, o.dups, err = latCounts(ctx, db.Pool, int64(samples+1))
	return o, err
}

// latRiver measures River's client in a fresh database of srv: the child
// (herdriver -mode latency) reports the lags; the idle transactions are
// counted here.
func latRiver(ctx context.Context, p *params, srv *pgtest.Server, admin *pgxpool.Pool, bin string, cooldown time.Duration) (latOutcome, error) {
	var o latOutcome
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		return o, err
	}
	defer db.Drop(context.WithoutCancel(ctx))
	db.Pool.Close() // only River's sessions on the database
	proc, await, err := startRiverSide(bin, []string{"-mode", "latency", "-url", db.URL, "-samples", fmt.Sprint(p.LatencySamples),
		"-interval", p.LatencyInterval.String(), "-cooldown", cooldown.String(), "-pool", fmt.Sprint(latPoolConns)})
	if err != nil {
		return o, err
	}
	defer func() {
		_ = proc.Kill()
		<-proc.Done()
	}()
	if _, err := await("ready", 2*time.Minute); err != nil {
		return o, err
	}
	if err := sleepUntil(ctx, time.Now().Add(p.LatencySettle)); err != nil {
		return o, err
	}
	if o.idleXacts, _, _, err = idleWindow(ctx, admin, db.Name, p.LatencyIdle, nil); err != nil {
		return o, err
	}
	o.idleMeasured = true
	if _, err := io.WriteString(proc.Stdin, "run\n"); err != nil {
		return o, err
	}
	s, err := await("samples", time.Duration(p.LatencySamples)*p.LatencyInterval+time.Minute)
	if err != nil {
		return o, err
	}
	_ = proc.Stdin.Close()
	d, err := await("done", 30*time.Second)
	if err != nil {
		return o, err
	}
	lags := make([]time.Duration, len(s.LagsNs))
	for i, n := range s.LagsNs {
		lags[i] = time.Duration(n)
	}
	o.lag = summarize(lags)
	o.samples, o.worked = s.Inserted, s.Worked
	o.lost, o.dups = s.Inserted-s.Worked, s.Duplicates
	o.version = cmpStr(s.Version, d.Version)
	return o, nil
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

// first is the most frequent record counted, as "; logged: …" ("" for
// none).
func (c *logCount) first() string {
	if rows := c.rows(); len(rows) > 0 {
		return "; logged: " + strings.Join(rows[0], " × ")
	}
	return ""
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
