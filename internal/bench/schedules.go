package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
)

// schedPoolConns is the pool size of each scheduler or gate instance.
const schedPoolConns = 4

// stmtCounter counts the statements a pool sends (a pgx tracer): the
// statement count when pg_stat_statements is not available.
type stmtCounter struct{ n atomic.Int64 }

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// schedInstance is one instance of the service: its own pool, and a
// scheduler or a gate on it.
type schedInstance struct {
	pool  *pgxpool.Pool
	count *stmtCounter
}

func openCountedPool(ctx context.Context, url string, n int) (*schedInstance, error) {
	c := &stmtCounter{}
	p, err := openTracedPool(ctx, url, n, c)
	if err != nil {
		return nil, err
	}
	return &schedInstance{pool: p, count: c}, nil
}

// schedRuns records every call of a job: (schedule, instant) → fences.
type schedRuns struct {
	mu    sync.Mutex
	calls map[string][]int64
	n     atomic.Int64
}

func newSchedRuns() *schedRuns { return &schedRuns{calls: map[string][]int64{}} }

func runKey(name string, at time.Time) string { return name + "@" + at.UTC().Format(time.RFC3339Nano) }

func (s *schedRuns) add(name string, at time.Time, fence int64) {
	s.mu.Lock()
	k := runKey(name, at)
	s.calls[k] = append(s.calls[k], fence)
	s.mu.Unlock()
	s.n.Add(1)
}

// dups is the number of job calls beyond the first for one instant.
func (s *schedRuns) dups() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, f := range s.calls {
		n += int64(len(f) - 1)
	}
	return n
}

// schedEvents counts the scheduler's events by kind.
type schedEvents struct {
	mu sync.Mutex
	n  map[schedule.EventKind]int64
}

func (c *schedEvents) Observe(_ context.Context, e schedule.Event) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[schedule.EventKind]int64{}
	}
	c.n[e.Kind]++
	c.mu.Unlock()
}

func (c *schedEvents) get(k schedule.EventKind) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// schedPhase is what one timed phase of the scenario measured.
type schedPhase struct {
	statements int64   // pg_stat_statements calls (or client statements)
	execMs     float64 // server execution time, pg_stat_statements
	wall       time.Duration
	instants   int64 // instants due in the window (runs recorded)
	lag        summary
	peakConns  int64
	prof       Profile
}

// runSchedules measures the scheduler: its idle cost, its cost per instant
// while every schedule is due each second, and its wake-up lag, with
// gate.Once driven by a timer in every instance as the same-run reference.
func runSchedules(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, err := e.database(ctx)
	if err != nil {
		return err
	}
	defer db.Drop(context.WithoutCancel(ctx))
	n, k := p.SchedInstances, p.SchedSchedules
	source := "pg_stat_statements"
	if !e.pgss {
		source = "the instances' pools (client-side count; pg_stat_statements unavailable)"
	}
	r.setup("%d instances, each a goroutine with its own pool (%d connections) and its own schedule.Scheduler (advisory locks, poll 1 s, LISTEN); each registers the same %d schedules; the job records its call and returns", n, schedPoolConns, k)
	r.setup("idle: the %d schedules are yearly (\"0 0 1 1 *\", none due during the run); after %s of start-up, statements counted for %s", k, p.SchedWarmup, p.SchedIdle)
	r.setup("due: %d other schedules, each due every second (\"* * * * * *\"); after %s of start-up, measured for %s: statements per instant = statements in the window / instants due in it", k, p.SchedWarmup, p.SchedBusy)
	r.setup("gate.Once reference (same run, same %d instances × %d jobs): in each instance a timer wakes at every whole second and calls gate.Once(job, that second) for each job, one goroutine per job (what a cron adapter does); one instance wins each tick", n, k)
	r.setup("statements from %s, BEGIN and COMMIT counted; wake-up lag = the run's started_at − its instant (pgclaim_schedule_runs; pgclaim_ticks for gate.Once), database time", source)

	idle, err := schedPhaseRun(ctx, e, db.URL, db.Name, p, "yearly", "0 0 1 1 *", p.SchedIdle, nil)
	if err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	ev := &schedEvents{}
	runs := newSchedRuns()
	busy, err := schedPhaseRun(ctx, e, db.URL, db.Name, p, "every-second", "* * * * * *", p.SchedBusy, &schedBusy{runs: runs, events: ev})
	if err != nil {
		return fmt.Errorf("due every second: %w", err)
	}
	onceRuns := newSchedRuns()
	once, err := oncePhaseRun(ctx, e, db.URL, db.Name, p, onceRuns)
	if err != nil {
		return fmt.Errorf("gate.Once: %w", err)
	}
	// The ledger: every succeeded run's fence is the one its job was called
	// with, exactly once; nothing failed.
	var badFence, failed, skipped int64
	dbp, err := openPool(ctx, db.URL, 2)
	if err != nil {
		return err
	}
	defer dbp.Close()
	rs, err := dbp.Query(ctx, `SELECT schedule, instant, state, coalesce(fence, 0) FROM pgclaim_schedule_runs WHERE schedule LIKE 'every-second-%'`)
	if err != nil {
		return err
	}
	for rs.Next() {
		var name, state string
		var at time.Time
		var fence int64
		if err := rs.Scan(&name, &at, &state, &fence); err != nil {
			rs.Close()
			return err
		}
		switch state {
		case "succeeded":
			runs.mu.Lock()
			f := runs.calls[runKey(name, at)]
			runs.mu.Unlock()
			calls := 0
			for _, x := range f {
				if x == fence {
					calls++
				}
			}
			if calls != 1 {
				badFence++
			}
		case "failed":
			failed++
		case "skipped":
			skipped++
		}
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return err
	}

	per := func(ph schedPhase, v float64) float64 {
		if ph.instants == 0 {
			return 0
		}
		return v / float64(ph.instants)
	}
	tbl := Table{Title: fmt.Sprintf("Schedules: %d instances × %d schedules; statements from %s", n, k, source),
		Columns: []string{"phase", "instants", "statements/s", "statements/instant", "server exec/instant", "lag p50", "lag p99", "lag max", "peak conns"}}
	tbl.Rows = append(tbl.Rows,
		[]string{"scheduler, idle (none due)", "-", fmt.Sprintf("%.1f", perSec(idle.statements, idle.wall)), "-", "-", "-", "-", "-", fmt.Sprintf("%d", idle.peakConns)},
		[]string{"scheduler, all due every second", fmt.Sprintf("%d", busy.instants), fmt.Sprintf("%.0f", perSec(busy.statements, busy.wall)),
			fmt.Sprintf("%.1f", per(busy, float64(busy.statements))), fmtMs(per(busy, busy.execMs)), fmtUs(us(busy.lag.P50)), fmtUs(us(busy.lag.P99)), fmtUs(us(busy.lag.Max)), fmt.Sprintf("%d", busy.peakConns)},
		[]string{"gate.Once on a timer, every second", fmt.Sprintf("%d", once.instants), fmt.Sprintf("%.0f", perSec(once.statements, once.wall)),
			fmt.Sprintf("%.1f", per(once, float64(once.statements))), fmtMs(per(once, once.execMs)), fmtUs(us(once.lag.P50)), fmtUs(us(once.lag.P99)), fmtUs(us(once.lag.Max)), fmt.Sprintf("%d", once.peakConns)},
	)
	r.Tables = append(r.Tables, tbl)
	r.Tables = append(r.Tables, Table{Title: "Scheduler events while due every second (all instances)",
		Columns: []string{"started", "finished", "skipped", "missed", "taken over", "lost", "skipped rows", "failed rows"},
		Rows: [][]string{{
			fmt.Sprintf("%d", ev.get(schedule.EventStarted)), fmt.Sprintf("%d", ev.get(schedule.EventFinished)),
			fmt.Sprintf("%d", ev.get(schedule.EventSkipped)), fmt.Sprintf("%d", ev.get(schedule.EventMissed)),
			fmt.Sprintf("%d", ev.get(schedule.EventTakenOver)), fmt.Sprintf("%d", ev.get(schedule.EventLost)),
			fmt.Sprintf("%d", skipped), fmt.Sprintf("%d", failed),
		}}})

	r.Results = append(r.Results,
		Result{Group: "pgclaim", Name: "schedule.Scheduler, idle", Workers: n, Ops: idle.statements, Unit: "statements/s",
			Seconds: idle.wall.Seconds(), PerSecond: perSec(idle.statements, idle.wall),
			Extra: map[string]float64{"schedules": float64(k), "peak_connections": float64(idle.peakConns)}},
		schedResult("schedule.Scheduler, due every second", n, k, busy),
		schedResult("gate.Once on a timer, every second", n, k, once),
	)
	for _, ph := range []schedPhase{idle, busy, once} {
		if ph.prof.Label != "" {
			r.Profiles = append(r.Profiles, ph.prof)
		}
	}
	r.check("schedules: instants run more than once", 0, runs.dups())
	r.check("schedules: succeeded runs without exactly one job call with their fence", 0, badFence)
	r.check("schedules: runs recorded failed", 0, failed)
	r.check("gate.Once: ticks run more than once", 0, onceRuns.dups())
	if busy.instants == 0 || once.instants == 0 {
		return fmt.Errorf("no instants measured (scheduler %d, gate.Once %d)", busy.instants, once.instants)
	}
	r.note("the scheduler's idle cost is its poll: one READ COMMITTED transaction (BEGIN, the poll statement, COMMIT) per instance per second for all its schedules; gate.Once on a timer sends nothing while no tick is due")
	r.note("statements per instant count every instance's statements for the instant: the runner's (record, claim, finish) and the try-locks of the instances that find the lock held")
	return nil
}

func schedResult(name string, n, k int, ph schedPhase) Result {
	var perInstant, execPer float64
	if ph.instants > 0 {
		perInstant = float64(ph.statements) / float64(ph.instants)
		execPer = ph.execMs / float64(ph.instants)
	}
	return Result{Group: "pgclaim", Name: name, Workers: n, Ops: ph.instants, Unit: "instants/s",
		Seconds: ph.wall.Seconds(), PerSecond: perSec(ph.instants, ph.wall),
		P50us: us(ph.lag.P50), P99us: us(ph.lag.P99), MaxUs: us(ph.lag.Max),
		Extra: map[string]float64{
			"schedules":              float64(k),
			"statements":             float64(ph.statements),
			"statements_per_second":  perSec(ph.statements, ph.wall),
			"statements_per_instant": perInstant,
			"exec_ms_per_instant":    execPer,
			"peak_connections":       float64(ph.peakConns),
		}}
}

// schedBusy is what a phase whose schedules come due records.
type schedBusy struct {
	runs   *schedRuns
	events *schedEvents
}

// schedPhaseRun starts p.SchedInstances schedulers, each registering
// p.SchedSchedules schedules named prefix-i with spec, lets them start up,
// and measures d.
func schedPhaseRun(ctx context.Context, e *env, url, dbName string, p *params, prefix, spec string, d time.Duration, busy *schedBusy) (schedPhase, error) {
	n, k := p.SchedInstances, p.SchedSchedules
	insts := make([]*schedInstance, n)
	defer func() {
		for _, in := range insts {
			if in != nil {
				in.pool.Close()
			}
		}
	}()
	quiet := slog.New(slog.DiscardHandler)
	job := func(context.Context, schedule.Run) error { return nil }
	var hooks schedule.Hooks
	if busy != nil {
		job = func(_ context.Context, run schedule.Run) error {
			busy.runs.add(run.Schedule, run.Instant, run.Fence)
			return nil
		}
		hooks = busy.events
	}
	scheds := make([]*schedule.Scheduler, n)
	err := runGroup(n, func(i int) error {
		in, err := openCountedPool(ctx, url, schedPoolConns)
		if err != nil {
			return err
		}
		insts[i] = in
		s, err := schedule.New(in.pool, schedule.Config{Holder: fmt.Sprintf("i%d", i), Logger: quiet, Hooks: hooks})
		if err != nil {
			return err
		}
		for j := range k {
			if err := s.Register(ctx, schedule.Definition{Name: fmt.Sprintf("%s-%03d", prefix, j), Spec: spec, Version: 1}, job); err != nil {
				return err
			}
		}
		scheds[i] = s
		return nil
	})
	if err != nil {
		return schedPhase{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, s := range scheds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Run(rctx); err != nil && !errors.Is(err, context.Canceled) {
				errs[i] = err
			}
		}()
	}
	stop := func() error {
		cancel()
		wg.Wait()
		return errors.Join(errs...)
	}
	label := fmt.Sprintf("scheduler, %d × %d schedules %s", n, k, map[bool]string{true: "due every second", false: "idle (none due)"}[busy != nil])
	var calls func() int64
	if busy != nil {
		calls = busy.runs.n.Load
	} else {
		calls = func() int64 { return 0 }
	}
	endTask := e.prog.task("  schedules: "+label, "runs", 0, calls)
	ph, err := measureWindow(ctx, e, dbName, insts, p.SchedWarmup, d, label)
	endTask()
	if serr := stop(); serr != nil && err == nil {
		err = serr
	}
	if err != nil || busy == nil {
		return ph.schedPhase, err
	}
	// Instants in the window and their lag, from the ledger.
	dbp, err := openPool(ctx, url, 1)
	if err != nil {
		return ph.schedPhase, err
	}
	defer dbp.Close()
	ph.instants, ph.lag, err = lagOf(ctx, dbp, `SELECT extract(epoch FROM started_at - instant) * 1e6
FROM pgclaim_schedule_runs
WHERE schedule LIKE $1 AND instant > $2 AND instant <= $3 AND kind = 'scheduled' AND started_at IS NOT NULL`,
		prefix+"-%", ph.from, ph.to)
	if n, err2 := scanInt64(ctx, dbp, `SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule LIKE $1 AND instant > $2 AND instant <= $3`, prefix+"-%", ph.from, ph.to); err2 == nil {
		ph.instants = n
	}
	return ph.schedPhase, err
}

// window is a measured phase with its bounds in database time.
type window struct {
	schedPhase
	from, to time.Time
}

// measureWindow waits warmup, then counts statements on dbName for d
// (pg_stat_statements, or the instances' client counters), sampling the
// database's connections.
func measureWindow(ctx context.Context, e *env, dbName string, insts []*schedInstance, warmup, d time.Duration, label string) (window, error) {
	select {
	case <-ctx.Done():
		return window{}, ctx.Err()
	case <-time.After(warmup):
	}
	client := func() int64 {
		var s int64
		for _, in := range insts {
			s += in.count.n.Load()
		}
		return s
	}
	var w window
	ph := e.begin(ctx, dbName)
	c0 := client()
	if err := e.admin.QueryRow(ctx, "SELECT now()").Scan(&w.from); err != nil {
		return w, err
	}
	t0 := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for time.Since(t0) < d {
		select {
		case <-ctx.Done():
			return w, ctx.Err()
		case <-tick.C:
		}
		if c, err := scanInt64(ctx, e.admin, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", dbName); err == nil && c > w.peakConns {
			w.peakConns = c
		}
	}
	if err := e.admin.QueryRow(ctx, "SELECT now()").Scan(&w.to); err != nil {
		return w, err
	}
	w.wall = time.Since(t0)
	w.statements = client() - c0
	w.prof = ph.end(ctx, label, 6)
	if e.pgss {
		var calls int64
		for _, s := range w.prof.Statements {
			calls += s.Calls
		}
		// The profile keeps the top statements only: count all of them.
		if n, err := scanInt64(ctx, e.admin, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)`, dbName); err == nil {
			calls = n
		}
		w.statements = calls
		w.execMs = w.prof.ExecSeconds * 1000
	}
	return w, nil
}

// lagOf runs q (one column: lag in µs) and summarizes it.
func lagOf(ctx context.Context, db *pgxpool.Pool, q string, args ...any) (int64, summary, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return 0, summary{}, err
	}
	defer rows.Close()
	var ds []time.Duration
	for rows.Next() {
		var v float64
		if err := rows.Scan(&v); err != nil {
			return 0, summary{}, err
		}
		ds = append(ds, time.Duration(v*float64(time.Microsecond)))
	}
	return int64(len(ds)), summarize(ds), rows.Err()
}

// oncePhaseRun is the reference: the same instances and jobs, each
// instance calling gate.Once for every job at every whole second.
func oncePhaseRun(ctx context.Context, e *env, url, dbName string, p *params, runs *schedRuns) (schedPhase, error) {
	n, k := p.SchedInstances, p.SchedSchedules
	insts := make([]*schedInstance, n)
	gates := make([]*gate.Gate, n)
	defer func() {
		for i, in := range insts {
			if gates[i] != nil {
				gates[i].Close()
			}
			if in != nil {
				in.pool.Close()
			}
		}
	}()
	err := runGroup(n, func(i int) error {
		in, err := openCountedPool(ctx, url, schedPoolConns)
		if err != nil {
			return err
		}
		insts[i] = in
		g, err := gate.New(in.pool, gate.Config{Holder: fmt.Sprintf("i%d", i), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		gates[i] = g
		return nil
	})
	if err != nil {
		return schedPhase{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var failures atomic.Int64
	var firstErr atomic.Value
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				at := time.Now().Truncate(time.Second).Add(time.Second)
				select {
				case <-rctx.Done():
					return
				case <-time.After(time.Until(at)):
				}
				var jobs sync.WaitGroup
				for j := range k {
					jobs.Add(1)
					go func() {
						defer jobs.Done()
						name := fmt.Sprintf("once-%03d", j)
						err := gates[i].Once(rctx, name, at, func(_ context.Context, run gate.Run) error {
							runs.add(name, at, 0)
							return nil
						})
						if err != nil && !errors.Is(err, gate.ErrSkipped) && !errors.Is(err, gate.ErrHeld) && rctx.Err() == nil {
							failures.Add(1)
							firstErr.CompareAndSwap(nil, err)
						}
					}()
				}
				jobs.Wait()
			}
		}()
	}
	label := fmt.Sprintf("gate.Once on a timer, %d × %d jobs every second", n, k)
	endTask := e.prog.task("  schedules: "+label, "runs", 0, runs.n.Load)
	w, err := measureWindow(ctx, e, dbName, insts, p.SchedWarmup, p.SchedBusy, label)
	endTask()
	cancel()
	wg.Wait()
	if err != nil {
		return w.schedPhase, err
	}
	if f := failures.Load(); f > 0 {
		return w.schedPhase, fmt.Errorf("%d gate.Once calls failed, first: %v", f, firstErr.Load())
	}
	dbp, err := openPool(ctx, url, 1)
	if err != nil {
		return w.schedPhase, err
	}
	defer dbp.Close()
	w.instants, w.lag, err = lagOf(ctx, dbp, `SELECT extract(epoch FROM started_at - fire_at) * 1e6
FROM pgclaim_ticks WHERE job LIKE 'once-%' AND fire_at > $1 AND fire_at <= $2`, w.from, w.to)
	return w.schedPhase, err
}
