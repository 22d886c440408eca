package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/robfig"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/bouncer"
	childproc "github.com/pgclaim/pgclaim/harness/child"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// The herd scenario: N instances, each its own pool of herdPoolConns, all
// running the same M jobs due at the same instants, on a server with a
// stock connection limit; side by side with River's periodic jobs (a child
// process: harness/bench/herdriver, a module of its own) and with gate +
// the robfig adapter.

const (
	herdPoolConns = 4
	herdJobSleep  = 200 * time.Millisecond
	// herdRiverWorkers is MaxWorkers of each River client's queue.
	herdRiverWorkers = 20
	// envHerdRiver names a built herdriver binary, instead of building it
	// from harness/bench/herdriver.
	envHerdRiver = "PGCLAIM_BENCH_HERDRIVER"
	// herdCounter is the application_name of the scenario's own connection
	// on a side's database, left out of the backends counted.
	herdCounter = "pgclaim-bench-herd"
)

// herdShape is one shape of the herd: Instances × Schedules due every
// Period, measured over Instants instants.
type herdShape struct {
	Instances, Schedules int
	Period               time.Duration
	Instants             int
	// MaxConnections of the server (0: 100, the stock limit).
	MaxConnections int
	// Processes runs the pgclaim side's instances each in a process of
	// its own (herdproc.go), not as goroutines of this one.
	Processes bool
	// HolderFrom is the number of the first instance (its holder is
	// "herd-<n>").
	HolderFrom int
	// Bouncer puts PgBouncer in transaction mode (harness/bouncer, its
	// server pool 20 connections) between the pgclaim side's instances and
	// the server; the schedulers then hold lease rows (LeaseLocks).
	Bouncer bool
	// MaxConcurrent is the pgclaim side's schedule.Config.MaxConcurrent
	// (0: the default).
	MaxConcurrent int
	// RiverWorkers is MaxWorkers of each River client's queue (0:
	// herdRiverWorkers).
	RiverWorkers int
	// Sides run, in order: "pgclaim" (schedule.Scheduler), "river"
	// (River's periodic jobs), "robfig" (gate + cronx/robfig).
	Sides []string
}

func (s herdShape) label() string {
	l := fmt.Sprintf("%d × %d every %s", s.Instances, s.Schedules, s.Period)
	if s.Processes {
		l = fmt.Sprintf("%d processes × %d every %s", s.Instances, s.Schedules, s.Period)
	}
	if s.Bouncer {
		l += " behind PgBouncer"
	}
	if s.MaxConcurrent > 0 {
		l += fmt.Sprintf(", MaxConcurrent %d", s.MaxConcurrent)
	}
	if s.RiverWorkers > 0 {
		l += fmt.Sprintf(", River's MaxWorkers %d", s.RiverWorkers)
	}
	return l
}

// statsSettle is how long after a side has started the transaction count
// may begin: PostgreSQL reports an idle backend's statistics within 10 s.
const statsSettle = 11 * time.Second

// herdRoomShapes are the herd's shapes at equal room: pgclaim's
// MaxConcurrent and River's MaxWorkers both room, 8 × 500 on a stock
// server and 64 × 100 on one sized to pgclaim's budget.
func herdRoomShapes(room int) []herdShape {
	both := []string{"pgclaim", "river"}
	return []herdShape{
		{Instances: 8, Schedules: 500, Period: 10 * time.Second, Instants: 3, MaxConcurrent: room, RiverWorkers: room, Sides: both},
		{Instances: 64, Schedules: 100, Period: 10 * time.Second, Instants: 3, MaxConnections: 64*(herdPoolConns+schedDedicated) + 10,
			MaxConcurrent: room, RiverWorkers: room, Sides: both},
	}
}

// riverWorkers is MaxWorkers of the shape's River clients.
func (s herdShape) riverWorkers() int {
	if s.RiverWorkers > 0 {
		return s.RiverWorkers
	}
	return herdRiverWorkers
}

func (s herdShape) spec() string {
	if s.Period == time.Second {
		return "* * * * * *"
	}
	return fmt.Sprintf("*/%d * * * * *", int(s.Period/time.Second))
}

// herdSide is what one side of a shape measured.
type herdSide struct {
	due, ran, dups   int64
	lag              summary
	peakBackends     int64
	xactsPerInstant  float64
	stmtsPerInstant  float64 // client-side count (pgclaim sides); 0: not counted
	errors           int64   // job errors (inserts refused, …)
	startErrors      int64   // Register / NewJob calls that failed
	firstError       string
	warnings         *logCount
	riverVersion     string
	measuredInstants int
	dupDetail        []string // how the first duplicates came about
	events           *schedEvents
}

// herd_effects: holder, attempt and fence are what pgclaim's sides know of
// the run (River's side leaves them NULL); they say how a duplicate came.
const herdDDL = `CREATE TABLE herd_effects (name text NOT NULL, instant timestamptz NOT NULL, started timestamptz NOT NULL,
  holder text, attempt int, fence bigint)`

const herdInsert = `INSERT INTO herd_effects (name, instant, started, holder, attempt, fence) VALUES ($1, $2, clock_timestamp(), $3, $4, $5)`

// herdRunInfo is what a pgclaim side's job knows of its run.
type herdRunInfo struct {
	holder  string
	attempt int
	fence   int64
}

// herdEffect is the job of every side: one row through the pool, then a
// 200 ms sleep.
func herdEffect(ctx context.Context, pool *pgxpool.Pool, name string, at time.Time, run herdRunInfo, errs *herdErrs) error {
	if _, err := pool.Exec(ctx, herdInsert, name, at, run.holder, run.attempt, run.fence); err != nil {
		errs.add(err)
		return err
	}
	select {
	case <-time.After(herdJobSleep):
	case <-ctx.Done():
	}
	return nil
}

type herdErrs struct {
	n     atomic.Int64
	mu    sync.Mutex
	first string
}

func (e *herdErrs) add(err error) {
	if e.n.Add(1) == 1 {
		e.mu.Lock()
		e.first = firstLine(err.Error())
		e.mu.Unlock()
	}
}

// herdServers starts (and reuses) one throwaway server per connection
// limit; on a server named by URL every shape runs on it as it is.
type herdServers struct {
	e       *env
	byLimit map[int]*pgtest.Server
	owned   []*pgtest.Server
}

func (h *herdServers) get(ctx context.Context, limit int) (*pgtest.Server, bool, error) {
	if h.e.cfg.DatabaseURL != "" || os.Getenv(pgtest.EnvURL) != "" {
		return h.e.srv, false, nil
	}
	if s, ok := h.byLimit[limit]; ok {
		return s, true, nil
	}
	h.e.prog.logf("  herd: starting a server with max_connections = %d...", limit)
	s, err := pgtest.Start(ctx, pgtest.Config{NoContainer: true, Settings: []string{fmt.Sprintf("max_connections=%d", limit)},
		Logf: func(f string, a ...any) { h.e.prog.logf("postgres: "+f, a...) }})
	if err != nil {
		return nil, false, err
	}
	h.byLimit[limit] = s
	h.owned = append(h.owned, s)
	return s, true, nil
}

func (h *herdServers) close() {
	for _, s := range h.owned {
		_ = s.Close()
	}
}

func runHerd(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	servers := &herdServers{e: e, byLimit: map[int]*pgtest.Server{}}
	defer servers.close()
	r.setup("N instances, each a goroutine with its own pgxpool (MaxConns %d) (or, in the shapes marked processes, each a process of its own: this executable re-run), all running the same M jobs due at the same instants; each job inserts one row through its pool (started = clock_timestamp()) and sleeps %s", herdPoolConns, herdJobSleep)
	r.setup("pgclaim: one schedule.Scheduler per instance (default Config) registering the M schedules (`*/10 * * * * *`, or `* * * * * *` every second)")
	r.setup("River: river.NewPeriodicJob with a PeriodicSchedule due at every multiple of the period, riverpgxv5, one client per instance on the same pool size, MaxWorkers %d unless the shape says, River's migrations (rivermigrate); a child process built from harness/bench/herdriver, a Go module of its own", herdRiverWorkers)
	r.setup("robfig: gate.Gate + cronx/robfig per instance, M robfig/cron jobs on the same spec, each through robfig.NewJob (gate.Once per instant)")
	r.setup("each side in a fresh database on a server started with max_connections as given (100: the stock limit); the first measured instant is the first at least 2 s after every instance is ready and at least 11 s plus half a period after it started (an idle backend's statistics come in up to 10 s late); due = M × measured instants; ran = distinct (job, instant) rows; start lag = started − instant (database time); backends = client backends of the side's database in pg_stat_activity, sampled every 100 ms from before the first instance starts, peak; transactions per instant = xact_commit of the database (pg_stat_database) over the measured instants, idle polls and maintenance included")
	tbl := Table{Title: "Herd: M jobs due at one instant on N instances",
		Columns: []string{"shape", "max_connections", "side", "succeeded / due", "duplicates", "lag p50", "lag p99", "lag max", "backends (peak)", "budget", "transactions/instant", "statements/instant", "job errors"}}
	var dups int64
	riverBin, riverWhy := "", ""
	for _, sh := range p.HerdShapes {
		limit := sh.MaxConnections
		if limit == 0 {
			limit = 100
		}
		srv, owned, err := servers.get(ctx, limit)
		if err != nil {
			return err
		}
		shown := fmt.Sprint(limit)
		if !owned {
			shown = "(the server's)"
		}
		res := map[string]herdSide{}
		for _, side := range sh.Sides {
			if side == "river" && riverBin == "" && riverWhy == "" {
				riverBin, riverWhy = buildHerdRiver(ctx, e)
				if riverWhy != "" {
					r.note("River side not run: %s", riverWhy)
				}
			}
			if side == "river" && riverWhy != "" {
				continue
			}
			label := sh.label() + ", " + side
			e.prog.logf("  herd: %s...", label)
			hs, err := herdRun(ctx, srv, sh, side, riverBin)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			res[side] = hs
			dups += hs.dups
			budget := "-"
			switch side {
			case "pgclaim":
				budget = fmt.Sprint(sh.Instances * (herdPoolConns + schedDedicated))
				if sh.Bouncer {
					budget = "20 (PgBouncer's pool)"
				}
			case "robfig":
				budget = fmt.Sprint(sh.Instances * (herdPoolConns + gateDedicated))
			case "river":
				budget = fmt.Sprint(sh.Instances * (herdPoolConns + riverDedicated))
			}
			stmts := "-"
			if hs.stmtsPerInstant > 0 {
				stmts = fmt.Sprintf("%.0f", hs.stmtsPerInstant)
			}
			name := side
			if side == "river" && hs.riverVersion != "" {
				name = "River " + hs.riverVersion
			}
			jobErrs := fmt.Sprint(hs.errors)
			if hs.startErrors > 0 {
				jobErrs += fmt.Sprintf(" (+%d start-up calls failed)", hs.startErrors)
			}
			tbl.Rows = append(tbl.Rows, []string{sh.label(), shown, name, fmt.Sprintf("%d / %d", hs.ran, hs.due), fmt.Sprint(hs.dups),
				fmtSec(hs.lag.P50), fmtSec(hs.lag.P99), fmtSec(hs.lag.Max), fmt.Sprint(hs.peakBackends), budget,
				fmt.Sprintf("%.0f", hs.xactsPerInstant), stmts, jobErrs})
			group := "pgclaim"
			if side == "river" {
				group = "baseline"
			}
			r.Results = append(r.Results, Result{Group: group, Name: "herd " + label, Workers: sh.Instances, Ops: hs.ran, Unit: "runs",
				P50us: us(hs.lag.P50), P99us: us(hs.lag.P99), MaxUs: us(hs.lag.Max),
				Extra: map[string]float64{"schedules": float64(sh.Schedules), "period_seconds": sh.Period.Seconds(), "due": float64(hs.due),
					"duplicates": float64(hs.dups), "backends_peak": float64(hs.peakBackends), "transactions_per_instant": hs.xactsPerInstant,
					"statements_per_instant": hs.stmtsPerInstant, "job_errors": float64(hs.errors), "max_connections": float64(limit)}})
			if hs.firstError != "" {
				r.note("%s: first error: %s", label, hs.firstError)
			}
			if ev := hs.events; ev != nil {
				r.note("%s: scheduler events: %d started, %d finished, %d skipped, %d missed, %d taken over, %d lost", label,
					ev.get(schedule.EventStarted), ev.get(schedule.EventFinished), ev.get(schedule.EventSkipped),
					ev.get(schedule.EventMissed), ev.get(schedule.EventTakenOver), ev.get(schedule.EventLost))
			}
			for _, d := range hs.dupDetail {
				r.note("%s: duplicate: %s", label, d)
			}
			if hs.warnings != nil {
				if rows := hs.warnings.rows(); len(rows) > 0 {
					if len(rows) > 4 {
						rows = rows[:4]
					}
					r.Tables = append(r.Tables, Table{Title: "Herd warnings and errors logged, " + label + " (most frequent first)",
						Columns: []string{"records", "level, message: error"}, Rows: rows})
				}
			}
		}
		if pg, ok := res["pgclaim"]; ok {
			if rv, ok := res["river"]; ok && rv.lag.P99 > 0 {
				r.note("%s: pgclaim's p99 start lag %s, River's %s (%.2f× River's); backends %d vs %d; transactions per instant %.0f vs %.0f",
					sh.label(), fmtSec(pg.lag.P99), fmtSec(rv.lag.P99), float64(pg.lag.P99)/float64(rv.lag.P99), pg.peakBackends, rv.peakBackends,
					pg.xactsPerInstant, rv.xactsPerInstant)
			}
		}
	}
	r.Tables = append([]Table{tbl}, r.Tables...)
	r.note("budget: pgclaim = N × (MaxConns + schedule's dedicated sessions, %d); robfig = N × (MaxConns + gate's, %d); River = N × (MaxConns + its LISTEN connection, %d, which riverpgxv5 hijacks from the pool)", schedDedicated, gateDedicated, riverDedicated)
	r.check("herd: (job, instant) rows beyond the first", 0, dups)
	return nil
}

func fmtSec(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f s", d.Seconds())
}

// herdRun runs one side of a shape in a fresh database of srv.
func herdRun(ctx context.Context, srv *pgtest.Server, sh herdShape, side, riverBin string) (herdSide, error) {
	var hs herdSide
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		return hs, err
	}
	defer db.Drop(context.WithoutCancel(ctx))
	if _, err := db.Pool.Exec(ctx, herdDDL); err != nil {
		return hs, err
	}
	// Only the sampler's and the counts' connections stay on the server
	// side: pgtest's own pool on the database is closed.
	db.Pool.Close()
	admin, err := srv.Admin(ctx)
	if err != nil {
		return hs, err
	}
	// Sample the database's client backends from the admin database.
	sctx, stopSampling := context.WithCancel(ctx)
	var peak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			var n int64
			if err := admin.QueryRow(sctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend' AND application_name <> $2`, db.Name, herdCounter).Scan(&n); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-sctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	// Connected before the side starts: a side may fill the server.
	// The counts' own connection is left out of the backends sampled.
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return hs, err
	}
	pc.MaxConns, pc.MinConns = 1, 1
	pc.ConnConfig.RuntimeParams["application_name"] = herdCounter
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return hs, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return hs, err
	}
	defer pool.Close()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stop func() error
	var stmts func() int64
	errs := &herdErrs{}
	sideURL := db.URL
	if sh.Bouncer && side == "pgclaim" {
		b, err := bouncer.Start(ctx, srv.URL(), db.Name)
		if err != nil {
			return hs, err
		}
		defer b.Stop()
		sideURL = b.URL(db.Name, "herd")
	}
	switch side {
	case "pgclaim":
		hs.events = &schedEvents{}
		stop, stmts, hs.startErrors, hs.warnings, err = herdSchedulersFor(rctx, sideURL, sh, errs, hs.events)
	case "robfig":
		stop, stmts, hs.startErrors, hs.warnings, err = herdRobfig(rctx, db.URL, sh, errs)
	case "river":
		stop, err = herdRiver(rctx, riverBin, db.URL, sh, &hs)
	default:
		err = fmt.Errorf("unknown side %q", side)
	}
	if err != nil {
		return hs, err
	}
	settled := time.Now().Add(statsSettle)
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	// Warm-up: the side has run its first instant (River elects a leader
	// first; a scheduler looks at its schedules once), then the first
	// measured instant is the first at least a second later.
	warm := time.Now().Add(2*sh.Period + 15*time.Second)
	for {
		n, err := scanInt64(ctx, pool, `SELECT count(*) FROM (SELECT FROM herd_effects LIMIT 1) x`)
		if err != nil {
			return hs, err
		}
		if n > 0 || time.Now().After(warm) {
			break
		}
		if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
			return hs, err
		}
	}
	// The transaction count starts once the statistics of the start-up
	// (a scheduler's registrations and first looks) are in: a backend
	// left idle reports its own up to 10 s late (PostgreSQL 15+), which
	// would count thousands of them as the measured instants'.
	from := time.Now().Add(time.Second)
	if s := settled.Add(sh.Period / 2); s.After(from) {
		from = s
	}
	first := from.Truncate(sh.Period).Add(sh.Period)
	last := first.Add(time.Duration(sh.Instants-1) * sh.Period)
	hs.due = int64(sh.Schedules * sh.Instants)
	xacts := func() float64 {
		var x float64
		_ = admin.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, db.Name).Scan(&x)
		return x
	}
	// The counts start half a period before the first measured instant.
	if err := sleepUntil(ctx, first.Add(-sh.Period/2)); err != nil {
		return hs, err
	}
	x0 := xacts()
	var s0 int64
	if stmts != nil {
		s0 = stmts()
	}
	t0 := time.Now()
	if err := sleepUntil(ctx, last); err != nil {
		return hs, err
	}
	// Wait until every measured instant's rows are in (or up to 10 s).
	deadline := last.Add(10 * time.Second)
	for {
		n, err := scanInt64(ctx, pool, `SELECT count(DISTINCT (name, instant)) FROM herd_effects WHERE instant BETWEEN $1 AND $2`, first, last)
		if err != nil {
			return hs, err
		}
		if n >= hs.due || time.Now().After(deadline) {
			break
		}
		if err := sleepUntil(ctx, time.Now().Add(200*time.Millisecond)); err != nil {
			return hs, err
		}
	}
	// The counts end half a period after the last instant, or at once
	// when the runs took longer.
	if err := sleepUntil(ctx, last.Add(sh.Period/2)); err != nil {
		return hs, err
	}
	wall := time.Since(t0)
	var s1 int64
	if stmts != nil {
		s1 = stmts()
	}
	stopped = true
	if err := stop(); err != nil {
		return hs, err
	}
	stopSampling()
	<-sampled
	hs.peakBackends = peak.Load()
	// The stopped instances' backends report their statistics as they
	// exit: wait for them to be gone before the last count.
	for i := 0; i < 50; i++ {
		n, err := scanInt64(ctx, admin, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`, db.Name)
		if err != nil || n <= 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	periods := wall.Seconds() / sh.Period.Seconds()
	x1 := xacts()
	if periods > 0 {
		hs.xactsPerInstant = (x1 - x0) / periods
		if stmts != nil {
			hs.stmtsPerInstant = float64(s1-s0) / periods
		}
	}
	hs.measuredInstants = sh.Instants
	if hs.ran, err = scanInt64(ctx, pool, `SELECT count(DISTINCT (name, instant)) FROM herd_effects WHERE instant BETWEEN $1 AND $2`, first, last); err != nil {
		return hs, err
	}
	if hs.dups, err = scanInt64(ctx, pool, `SELECT count(*) - count(DISTINCT (name, instant)) FROM herd_effects`); err != nil {
		return hs, err
	}
	if hs.dups > 0 {
		hs.dupDetail = herdDupDetail(ctx, pool, side)
	}
	rows, err := pool.Query(ctx, `SELECT (extract(epoch FROM started - instant) * 1e9)::bigint FROM herd_effects WHERE instant BETWEEN $1 AND $2`, first, last)
	if err != nil {
		return hs, err
	}
	var lags []time.Duration
	for rows.Next() {
		var ns int64
		if err := rows.Scan(&ns); err != nil {
			rows.Close()
			return hs, err
		}
		lags = append(lags, time.Duration(ns))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return hs, err
	}
	hs.lag = summarize(lags)
	hs.errors += errs.n.Load()
	if hs.firstError == "" {
		errs.mu.Lock()
		hs.firstError = errs.first
		errs.mu.Unlock()
	}
	return hs, nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// herdSchedulers starts sh.Instances schedulers, each registering the
// shape's schedules, and returns once every one runs.
func herdSchedulers(ctx context.Context, url string, sh herdShape, errs *herdErrs, events *schedEvents) (stop func() error, stmts func() int64, startErrs int64, logs *logCount, err error) {
	logs = newLogCount()
	log := slog.New(logs)
	type inst struct {
		in     *schedInstance
		s      *schedule.Scheduler
		cancel context.CancelFunc
		done   chan error
	}
	insts := make([]*inst, sh.Instances)
	closeAll := func() {
		for _, it := range insts {
			if it != nil && it.in != nil {
				it.in.pool.Close()
			}
		}
	}
	var failed atomic.Int64
	// Registration is bounded as a whole: on a full server every Register
	// may wait out its retries, and the phase must still end.
	regCtx, regCancel := context.WithTimeout(ctx, time.Minute+time.Duration(sh.Schedules)*20*time.Millisecond)
	defer regCancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range sh.Instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, err := herdPool(ctx, url)
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			in.count.trace, in.count.inst = herdTrace, i
			it := &inst{in: in, done: make(chan error, 1)}
			insts[i] = it
			s, err := schedule.New(in.pool, schedule.Config{Holder: fmt.Sprintf("herd-%d", sh.HolderFrom+i), Logger: log, Hooks: events, LeaseLocks: sh.Bouncer, MaxConcurrent: sh.MaxConcurrent})
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			it.s = s
			for k := range sh.Schedules {
				name := fmt.Sprintf("herd-%d", k)
				job := func(ctx context.Context, run schedule.Run) error {
					return herdEffect(ctx, in.pool, run.Schedule, run.Instant, herdRunInfo{run.Holder, run.Attempt, run.Fence}, errs)
				}
				err := s.Register(regCtx, schedule.Definition{Name: name, Spec: sh.spec(), Version: 1}, job)
				if err != nil {
					if failed.Add(1) == 1 {
						errs.mu.Lock()
						if errs.first == "" {
							errs.first = "Register: " + firstLine(err.Error())
						}
						errs.mu.Unlock()
					}
				}
			}
			runCtx, cancel := context.WithCancel(ctx)
			it.cancel = cancel
			go func() { it.done <- s.Run(runCtx) }()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		closeAll()
		return nil, nil, 0, nil, firstErr
	}
	stop = func() error {
		defer herdTrace.flush()
		var err error
		for _, it := range insts {
			if it.cancel != nil {
				it.cancel()
			}
		}
		deadline := time.After(30 * time.Second)
		for _, it := range insts {
			if it.cancel == nil {
				continue
			}
			select {
			case e := <-it.done:
				if e != nil && !errors.Is(e, context.Canceled) {
					err = cmpErr(err, e)
				}
			case <-deadline:
				err = cmpErr(err, errors.New("the schedulers did not stop within 30 s"))
				closeAll()
				return err
			}
		}
		closeAll()
		return err
	}
	stmts = func() int64 {
		var n int64
		for _, it := range insts {
			n += it.in.count.n.Load()
		}
		return n
	}
	return stop, stmts, failed.Load(), logs, nil
}

// herdRobfig starts sh.Instances crons, each with a gate and the shape's
// jobs through cronx/robfig.
func herdRobfig(ctx context.Context, url string, sh herdShape, errs *herdErrs) (stop func() error, stmts func() int64, startErrs int64, logs *logCount, err error) {
	logs = newLogCount()
	log := slog.New(logs)
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse(sh.spec())
	if err != nil {
		return nil, nil, 0, nil, err
	}
	var ins []*schedInstance
	var gates []*gate.Gate
	var crons []*cron.Cron
	// Cancelled first at stop: the runs in progress (a job waiting for a
	// connection of a full server) end, and the crons' Stop returns.
	ctx, cancel := context.WithCancel(ctx)
	closeAll := func() {
		cancel()
		for _, c := range crons {
			select {
			case <-c.Stop().Done():
			case <-time.After(30 * time.Second):
			}
		}
		for _, g := range gates {
			g.Close()
		}
		for _, in := range ins {
			in.pool.Close()
		}
	}
	for i := range sh.Instances {
		in, err := herdPool(ctx, url)
		if err != nil {
			closeAll()
			return nil, nil, 0, nil, err
		}
		ins = append(ins, in)
		g, err := gate.New(in.pool, gate.Config{Holder: fmt.Sprintf("herd-%d", i), Logger: log})
		if err != nil {
			closeAll()
			return nil, nil, 0, nil, err
		}
		gates = append(gates, g)
		c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
		for k := range sh.Schedules {
			name := fmt.Sprintf("herd-%d", k)
			fn := func(ctx context.Context, run gate.Run) error {
				return herdEffect(ctx, in.pool, name, run.FireAt, herdRunInfo{holder: run.Holder, fence: run.Fence}, errs)
			}
			j, err := robfig.NewJob(g, name, sched, fn, robfig.Config{Context: ctx, Location: time.UTC, Logger: log})
			if err != nil {
				startErrs++
				continue
			}
			c.Schedule(sched, j)
		}
		crons = append(crons, c)
	}
	for _, c := range crons {
		c.Start()
	}
	stop = func() error { closeAll(); return nil }
	stmts = func() int64 {
		var n int64
		for _, in := range ins {
			n += in.count.n.Load()
		}
		return n
	}
	return stop, stmts, startErrs, logs, nil
}

// riverLine is one JSON line of River's side (harness/bench/herdriver):
// the fields of every mode's events.
type riverLine struct {
	Event      string  `json:"event"`
	Error      string  `json:"error"`
	Worked     int64   `json:"worked"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error"`
	Version    string  `json:"version"`
	LagsNs     []int64 `json:"lags_ns"`
	Inserted   int64   `json:"inserted"`
	Duplicates int64   `json:"duplicates"`
}

// startRiverSide starts River's side, bin with args, and returns it with
// a function that waits for its next line of an event kind (an "error"
// line ends the wait with its error).
func startRiverSide(bin string, args []string) (*childproc.Process, func(kind string, timeout time.Duration) (riverLine, error), error) {
	lines := make(chan riverLine, 16)
	proc, err := childproc.Start(childproc.Config{Exe: bin, Args: args,
		Stdout: func(b []byte) {
			var l riverLine
			if json.Unmarshal(b, &l) == nil {
				lines <- l
			}
		},
		StderrTo: os.Stderr,
	})
	if err != nil {
		return nil, nil, err
	}
	// match reports whether l is the event awaited, or the child's error.
	match := func(l riverLine, kind string) (bool, error) {
		if l.Event == "error" {
			return true, fmt.Errorf("river's side: %s", l.Error)
		}
		return l.Event == kind, nil
	}
	await := func(kind string, timeout time.Duration) (riverLine, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case l := <-lines:
				if ok, err := match(l, kind); ok {
					return l, err
				}
			case <-proc.Done():
				// Its output was all read before Done closed.
				for len(lines) > 0 {
					if l := <-lines; l.Event == kind || l.Event == "error" {
						_, err := match(l, kind)
						return l, err
					}
				}
				return riverLine{}, fmt.Errorf("river's side exited before %q: %v", kind, proc.Err())
			case <-t.C:
				return riverLine{}, fmt.Errorf("river's side: no %q within %s", kind, timeout)
			}
		}
	}
	return proc, await, nil
}

// herdRiver starts the River child on url and returns once its clients
// run; stop ends it and reads its report into hs.
func herdRiver(ctx context.Context, bin, url string, sh herdShape, hs *herdSide) (stop func() error, err error) {
	proc, await, err := startRiverSide(bin, []string{"-url", url, "-instances", fmt.Sprint(sh.Instances), "-schedules", fmt.Sprint(sh.Schedules),
		"-period", sh.Period.String(), "-pool", fmt.Sprint(herdPoolConns), "-workers", fmt.Sprint(sh.riverWorkers()),
		"-sleep", herdJobSleep.String(), "-prefix", "herd", "-table", "herd_effects"})
	if err != nil {
		return nil, err
	}
	kill := func() {
		_ = proc.Kill()
		<-proc.Done()
	}
	if _, err := await("ready", 2*time.Minute); err != nil {
		kill()
		return nil, err
	}
	return func() error {
		_ = proc.Stdin.Close()
		l, err := await("done", 30*time.Second)
		if err != nil {
			kill()
			return err
		}
		<-proc.Done()
		hs.errors += l.Errors
		hs.firstError = l.FirstError
		hs.riverVersion = l.Version
		return nil
	}, nil
}

// buildHerdRiver builds River's side (harness/bench/herdriver) once, or
// takes the binary named by PGCLAIM_BENCH_HERDRIVER. On failure it returns
// why, and the scenario runs without River.
func buildHerdRiver(ctx context.Context, e *env) (bin, why string) {
	if b := os.Getenv(envHerdRiver); b != "" {
		return b, ""
	}
	dir := findHerdRiver()
	if dir == "" {
		return "", "harness/bench/herdriver not found (run from the repository, or set " + envHerdRiver + " to a built herdriver)"
	}
	tmp, err := os.MkdirTemp("", "pgclaim-herdriver-")
	if err != nil {
		return "", err.Error()
	}
	bin = filepath.Join(tmp, "herdriver")
	e.prog.logf("  herd: building River's side (%s)...", dir)
	bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Sprintf("go build in %s: %v: %s", dir, err, firstLine(string(out)))
	}
	return bin, ""
}

// findHerdRiver finds harness/bench/herdriver from the working directory
// upwards, else beside this source file.
func findHerdRiver() string {
	const rel = "harness/bench/herdriver"
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, rel, "go.mod")); err == nil {
				return filepath.Join(d, rel)
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		d := filepath.Join(filepath.Dir(file), "herdriver")
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return ""
}

func cmpErr(have, err error) error {
	if have != nil {
		return have
	}
	return err
}

// The dedicated sessions an instance holds besides its pool, by the
// packages' documented budgets.
const (
	schedDedicated = schedule.DedicatedSessions
	gateDedicated  = gate.DedicatedSessions
	riverDedicated = 1 // a River client's listener (riverpgxv5 hijacks it from the pool)
)

// herdPool is an instance's pool with a statement counter. It does not
// connect: on a full server the instance starts anyway, and what it then
// cannot do is what the scenario reports.
func herdPool(ctx context.Context, url string) (*schedInstance, error) {
	c := &stmtCounter{}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = herdPoolConns
	pc.ConnConfig.Tracer = c
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	return &schedInstance{pool: p, count: c}, nil
}

// herdDupDetail describes the first few duplicated (job, instant) pairs:
// each effect's holder, attempt and fence, and the run's record.
func herdDupDetail(ctx context.Context, pool *pgxpool.Pool, side string) []string {
	q := `SELECT e.name, e.instant, string_agg(format('%s attempt %s fence %s at %s', e.holder, e.attempt, e.fence, e.started::time), '; ' ORDER BY e.started),
  coalesce((SELECT format('%s, attempt %s, holder %s, fence %s', r.state, r.attempt, r.holder, r.fence) FROM pgclaim_schedule_runs r WHERE r.schedule = e.name AND r.instant = e.instant), '-')
FROM herd_effects e GROUP BY e.name, e.instant HAVING count(*) > 1 ORDER BY e.instant, e.name LIMIT 5`
	if side == "river" {
		q = `SELECT name, instant, string_agg(started::time::text, '; ' ORDER BY started), '-' FROM herd_effects GROUP BY name, instant HAVING count(*) > 1 ORDER BY instant, name LIMIT 5`
	}
	rows, err := pool.Query(ctx, q)
	if err != nil {
		return []string{"could not read the duplicates: " + firstLine(err.Error())}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name, effects, run string
		var at time.Time
		if err := rows.Scan(&name, &at, &effects, &run); err != nil {
			return append(out, firstLine(err.Error()))
		}
		out = append(out, fmt.Sprintf("%s @ %s: effects by %s; run record: %s", name, at.UTC().Format("15:04:05"), effects, run))
	}
	return out
}
