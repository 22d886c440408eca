package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
type stmtCounter struct {
	n     atomic.Int64
	trace *traceFile
	inst  int
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	if c.trace != nil {
		return c.trace.start(ctx, d)
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if c.trace != nil {
		c.trace.end(ctx, c.inst, d)
	}
}

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

// callsWith counts the job's calls for (name, at) with fence.
func (s *schedRuns) callsWith(name string, at time.Time, fence int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.calls[runKey(name, at)] {
		if f == fence {
			n++
		}
	}
	return n
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

// logCount counts the records at warn level and above that reach it, by
// message and the start of their error: the scenario reports them instead
// of printing thousands of lines.
type logCount struct {
	mu *sync.Mutex
	n  map[string]int64
}

func newLogCount() *logCount { return &logCount{mu: &sync.Mutex{}, n: map[string]int64{}} }

func (c *logCount) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (c *logCount) Handle(_ context.Context, r slog.Record) error {
	k := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			k += ": " + firstLine(a.Value.String())
			return false
		}
		return true
	})
	c.mu.Lock()
	c.n[k]++
	c.mu.Unlock()
	return nil
}

func (c *logCount) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCount) WithGroup(string) slog.Handler      { return c }

// rows returns the counted records, most frequent first.
func (c *logCount) rows() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	type kv struct {
		k string
		n int64
	}
	var all []kv
	for k, n := range c.n {
		all = append(all, kv{k, n})
	}
	slices.SortFunc(all, func(a, b kv) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.k, b.k)) })
	out := make([][]string, 0, len(all))
	for _, x := range all {
		out = append(out, []string{fmt.Sprintf("%d", x.n), x.k})
	}
	return out
}

// schedPhase is what one timed phase of the scenario measured.
type schedPhase struct {
	statements int64   // pg_stat_statements calls (or client statements)
	execMs     float64 // server execution time, pg_stat_statements
	wall       time.Duration
	instants   int64 // instants of the window that ran (their first attempt started)
	due        int64 // instants due in the window: schedules × whole seconds
	recorded   int64 // instants of the window with a ledger row
	lag        summary
	peakConns  int64
	settle     time.Duration // start-up until the statement rate settled (idle)
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
	r.setup("%d instances, each a goroutine with its own pool (%d connections) and its own schedule.Scheduler (advisory locks, poll 1 s, LISTEN, default definitions: catch-up latest, overlap skip); the job records its call and returns", n, schedPoolConns)
	r.setup("idle: each instance registers the same %d yearly schedules (`0 0 1 1 *`, none due during the run); after at least %s of start-up, and once the instances' statements per second have settled (at most %s), statements counted for %s", k, p.SchedWarmup, p.SchedSettle, p.SchedIdle)
	r.setup("due every second: each instance registers the same %v other schedules (`* * * * * *`), one size after the other; after %s of start-up, measured for %s: due = schedules × whole seconds in the window; ran = those whose run started; no row = due instants the ledger lacks after the phase; statements per run = all instances' statements in the window / runs", p.SchedBusySchedules, p.SchedWarmup, p.SchedBusy)
	r.setup("gate.Once reference (same run, same instances, as many jobs): in each instance a timer wakes at every whole second and calls gate.Once(job, that second) for each job, one goroutine per job, as a cron adapter does; one instance wins each tick, a tick no instance reached in time is simply not run")
	r.setup("statements from %s, BEGIN and COMMIT counted; wake-up lag = the run's started_at − its instant (pgclaim_schedule_runs; pgclaim_ticks for gate.Once), database time", source)

	tbl := Table{Title: fmt.Sprintf("Schedules: %d instances; statements from %s", n, source),
		Columns: []string{"phase", "schedules", "due", "ran", "no row", "statements/s", "statements/run", "server exec/run", "lag p50", "lag p99", "lag max", "peak conns"}}
	evt := Table{Title: "Scheduler events and ledger rows per phase (all instances)",
		Columns: []string{"phase", "schedules", "started", "finished", "skipped", "missed", "taken over", "lost", "skipped rows", "failed rows"}}
	row := func(label string, k int, ph schedPhase) []string {
		per := func(v float64) float64 {
			if ph.instants == 0 {
				return 0
			}
			return v / float64(ph.instants)
		}
		return []string{label, fmt.Sprintf("%d", k), fmt.Sprintf("%d", ph.due), fmt.Sprintf("%d", ph.instants), fmt.Sprintf("%d", max(0, ph.due-ph.recorded)), fmt.Sprintf("%.0f", perSec(ph.statements, ph.wall)),
			fmt.Sprintf("%.1f", per(float64(ph.statements))), fmtMs(per(ph.execMs)), fmtUs(us(ph.lag.P50)), fmtUs(us(ph.lag.P99)), fmtUs(us(ph.lag.Max)), fmt.Sprintf("%d", ph.peakConns)}
	}
	events := func(label string, k int, o *schedObs, ld ledger) {
		g := o.events.get
		evt.Rows = append(evt.Rows, []string{label, fmt.Sprintf("%d", k),
			fmt.Sprintf("%d", g(schedule.EventStarted)), fmt.Sprintf("%d", g(schedule.EventFinished)), fmt.Sprintf("%d", g(schedule.EventSkipped)),
			fmt.Sprintf("%d", g(schedule.EventMissed)), fmt.Sprintf("%d", g(schedule.EventTakenOver)), fmt.Sprintf("%d", g(schedule.EventLost)),
			fmt.Sprintf("%d", ld.skipped), fmt.Sprintf("%d", ld.failed)})
		if rows := o.logs.rows(); len(rows) > 0 {
			if len(rows) > 6 {
				rows = rows[:6]
			}
			r.Tables = append(r.Tables, Table{Title: fmt.Sprintf("Scheduler warnings and errors, %s, %d schedules (all instances; most frequent first)", label, k),
				Columns: []string{"records", "level, message: error"}, Rows: rows})
		}
	}

	obs := newSchedObs()
	idle, err := schedPhaseRun(ctx, e, db.URL, db.Name, p, k, "yearly", "0 0 1 1 *", p.SchedIdle, obs)
	if err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	tbl.Rows = append(tbl.Rows, []string{"scheduler, idle (none due)", fmt.Sprintf("%d", k), "0", "-", "-", fmt.Sprintf("%.1f", perSec(idle.statements, idle.wall)), "-", "-", "-", "-", "-", fmt.Sprintf("%d", idle.peakConns)})
	events("scheduler, idle", k, obs, ledger{})
	r.Results = append(r.Results, Result{Group: "pgclaim", Name: "schedule.Scheduler, idle", Workers: n, Ops: idle.statements, Unit: "statements/s",
		Seconds: idle.wall.Seconds(), PerSecond: perSec(idle.statements, idle.wall),
		Extra: map[string]float64{"schedules": float64(k), "peak_connections": float64(idle.peakConns), "settle_seconds": idle.settle.Seconds()}})
	r.Profiles = append(r.Profiles, idle.prof)
	if idle.settle > 0 {
		r.note("idle, %d schedules: the instances' start-up (each schedule looked at once by every instance) took %.1f s to settle before the count began", k, idle.settle.Seconds())
	}

	var dups, badFence, failed, onceDups int64
	for _, bk := range p.SchedBusySchedules {
		prefix := fmt.Sprintf("every-second-k%d", bk)
		obs := newSchedObs()
		busy, err := schedPhaseRun(ctx, e, db.URL, db.Name, p, bk, prefix, "* * * * * *", p.SchedBusy, obs)
		if err != nil {
			return fmt.Errorf("due every second, %d schedules: %w", bk, err)
		}
		ld, err := checkLedger(ctx, db.URL, prefix, obs.runs)
		if err != nil {
			return err
		}
		onceRuns := newSchedRuns()
		once, err := oncePhaseRun(ctx, e, db.URL, db.Name, p, bk, onceRuns)
		if err != nil {
			return fmt.Errorf("gate.Once, %d jobs: %w", bk, err)
		}
		tbl.Rows = append(tbl.Rows, row("scheduler, all due every second", bk, busy), row("gate.Once on a timer, every second", bk, once))
		events("scheduler, due every second", bk, obs, ld)
		r.Results = append(r.Results, schedResult("schedule.Scheduler, due every second", n, bk, busy), schedResult("gate.Once on a timer, every second", n, bk, once))
		r.Profiles = append(r.Profiles, busy.prof, once.prof)
		dups += obs.runs.dups()
		badFence += ld.badFence
		failed += ld.failed
		onceDups += onceRuns.dups()
		if busy.instants == 0 || once.instants == 0 {
			return fmt.Errorf("%d schedules: no instants measured (scheduler %d, gate.Once %d)", bk, busy.instants, once.instants)
		}
	}
	cu, err := catchUpTable(ctx, db.URL, p.SchedBacklogs, r)
	if err != nil {
		return err
	}
	r.Tables = append([]Table{tbl, evt, cu}, r.Tables...)
	// No instance dies here: a job called twice for one instant is an
	// effect that happened twice.
	r.check("schedules: instants whose job ran more than once (no instance died)", 0, dups)
	r.check("schedules: succeeded runs without exactly one job call with their fence", 0, badFence)
	r.check("schedules: runs recorded failed", 0, failed)
	r.check("gate.Once: ticks run more than once", 0, onceDups)
	r.note("the scheduler's idle cost is its poll: one READ COMMITTED transaction (BEGIN, the poll statement, COMMIT) per instance per second for all its schedules; gate.Once on a timer sends nothing while no tick is due")
	r.note("statements per run count every instance's statements: the runner's (record, claim, finish) and the try-locks of the instances that find the lock held; when instants are recorded skipped (overtaken by the next one) their statements count too")
	r.note("no row: gate.Once leaves no trace of a tick no instance reached in time; the scheduler records every due instant, run or skipped with its reason")
	return nil
}

// catchUpTable measures how fast one instance works off a backlog of
// pending runs of each size (backfilled instants of a yearly schedule, as a
// long outage leaves a catch-up), with session locks and with lease locks,
// and the ratio of the largest backlog's rate to the smallest's: a runner
// whose cost per run grows with the backlog falls behind further the more
// it has to catch up.
func catchUpTable(ctx context.Context, url string, sizes []int, r *ScenarioReport) (Table, error) {
	r.setup("catch-up: one instance, one yearly schedule with a backlog of %v pending runs (backfilled, so none is due meanwhile); runs/s = backlog / time from Run until the job has been called for every one; the job records its call and returns", sizes)
	t := Table{Title: "Catch-up: one instance working off a backlog of pending runs",
		Columns: []string{"locks", "backlog", "seconds", "runs/s", "statements/run", "vs smallest backlog"}}
	for _, lease := range []bool{false, true} {
		locks := "session advisory"
		if lease {
			locks = "lease (Config.LeaseLocks)"
		}
		var first float64
		for i, n := range sizes {
			name := fmt.Sprintf("catch-up-%d-lease-%v", n, lease)
			d, stmts, err := catchUpRun(ctx, url, name, n, lease)
			if err != nil {
				return t, fmt.Errorf("catch-up, %s locks, backlog %d: %w", locks, n, err)
			}
			rate := float64(n) / d.Seconds()
			if i == 0 {
				first = rate
			}
			t.Rows = append(t.Rows, []string{locks, fmt.Sprintf("%d", n), fmt.Sprintf("%.2f", d.Seconds()), fmt.Sprintf("%.0f", rate),
				fmt.Sprintf("%.1f", float64(stmts)/float64(n)), fmt.Sprintf("%.2f×", rate/first)})
			r.Results = append(r.Results, Result{Group: "pgclaim", Name: "schedule.Scheduler, catch-up, " + locks, Workers: 1, Ops: int64(n), Unit: "runs/s",
				Seconds: d.Seconds(), PerSecond: rate, Extra: map[string]float64{"backlog": float64(n)}})
		}
	}
	return t, nil
}

// catchUpRun backfills n instants of a new yearly schedule name and times
// one scheduler working them off; it returns the time and the statements
// sent.
func catchUpRun(ctx context.Context, url, name string, n int, lease bool) (time.Duration, int64, error) {
	in, err := openCountedPool(ctx, url, schedPoolConns)
	if err != nil {
		return 0, 0, err
	}
	defer in.pool.Close()
	s, err := schedule.New(in.pool, schedule.Config{Holder: "catch-up", LeaseLocks: lease, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, 0, err
	}
	var ran atomic.Int64
	all := make(chan struct{})
	job := func(context.Context, schedule.Run) error {
		if ran.Add(1) == int64(n) {
			close(all)
		}
		return nil
	}
	if err := s.Register(ctx, schedule.Definition{Name: name, Spec: "0 0 1 1 *", Version: 1}, job); err != nil {
		return 0, 0, err
	}
	var now time.Time
	if err := in.pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return 0, 0, err
	}
	res, err := s.Backfill(ctx, name, schedule.BackfillOptions{From: now.AddDate(-n-1, 0, 0), To: now, Max: n})
	if err != nil {
		return 0, 0, err
	}
	if len(res.Instants) != n {
		return 0, 0, fmt.Errorf("backfilled %d instants, want %d", len(res.Instants), n)
	}
	if _, err := in.pool.Exec(ctx, "ANALYZE pgclaim_schedule_runs"); err != nil {
		return 0, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	base := in.count.n.Load()
	start := time.Now()
	go func() { done <- s.Run(rctx) }()
	var d time.Duration
	select {
	case <-all:
		d = time.Since(start)
	case <-time.After(10 * time.Minute):
		err = fmt.Errorf("%d of %d runs after 10 min", ran.Load(), n)
	case err = <-done:
		err = fmt.Errorf("scheduler stopped after %d of %d runs: %w", ran.Load(), n, err)
	}
	stmts := in.count.n.Load() - base
	cancel()
	if rerr := <-done; err == nil && rerr != nil && !errors.Is(rerr, context.Canceled) {
		err = rerr
	}
	return d, stmts, err
}

// ledger is what the runs of a phase's schedules say.
type ledger struct{ badFence, failed, skipped int64 }

// checkLedger reads the runs of the schedules named prefix-*: every
// succeeded run's fence must be one its job was called with, exactly once.
func checkLedger(ctx context.Context, url, prefix string, runs *schedRuns) (ledger, error) {
	var ld ledger
	dbp, err := openPool(ctx, url, 1)
	if err != nil {
		return ld, err
	}
	defer dbp.Close()
	rs, err := dbp.Query(ctx, `SELECT schedule, instant, state, coalesce(fence, 0) FROM pgclaim_schedule_runs WHERE schedule LIKE $1`, prefix+"-%")
	if err != nil {
		return ld, err
	}
	defer rs.Close()
	for rs.Next() {
		var name, state string
		var at time.Time
		var fence int64
		if err := rs.Scan(&name, &at, &state, &fence); err != nil {
			return ld, err
		}
		switch state {
		case "succeeded":
			if runs.callsWith(name, at, fence) != 1 {
				ld.badFence++
			}
		case "failed":
			ld.failed++
		case "skipped":
			ld.skipped++
		}
	}
	return ld, rs.Err()
}

func schedResult(name string, n, k int, ph schedPhase) Result {
	var perInstant, execPer float64
	if ph.instants > 0 {
		perInstant = float64(ph.statements) / float64(ph.instants)
		execPer = ph.execMs / float64(ph.instants)
	}
	return Result{Group: "pgclaim", Name: name, Workers: n, Ops: ph.instants, Unit: "runs/s",
		Seconds: ph.wall.Seconds(), PerSecond: perSec(ph.instants, ph.wall),
		P50us: us(ph.lag.P50), P99us: us(ph.lag.P99), MaxUs: us(ph.lag.Max),
		Extra: map[string]float64{
			"schedules":             float64(k),
			"due":                   float64(ph.due),
			"no_row":                float64(max(0, ph.due-ph.recorded)),
			"statements":            float64(ph.statements),
			"statements_per_second": perSec(ph.statements, ph.wall),
			"statements_per_run":    perInstant,
			"exec_ms_per_run":       execPer,
			"peak_connections":      float64(ph.peakConns),
		}}
}

// schedObs observes a phase's schedulers: the job's calls, the events and
// the log records.
type schedObs struct {
	runs   *schedRuns
	events *schedEvents
	logs   *logCount
}

func newSchedObs() *schedObs {
	return &schedObs{runs: newSchedRuns(), events: &schedEvents{}, logs: newLogCount()}
}

// schedPhaseRun starts p.SchedInstances schedulers, each registering k
// schedules named prefix-i with spec, lets them start up, and measures d.
func schedPhaseRun(ctx context.Context, e *env, url, dbName string, p *params, k int, prefix, spec string, d time.Duration, obs *schedObs) (schedPhase, error) {
	n := p.SchedInstances
	due := spec == "* * * * * *"
	insts := make([]*schedInstance, n)
	defer func() {
		for _, in := range insts {
			if in != nil {
				in.pool.Close()
			}
		}
	}()
	logger := slog.New(obs.logs)
	job := func(_ context.Context, run schedule.Run) error {
		obs.runs.add(run.Schedule, run.Instant, run.Fence)
		return nil
	}
	scheds := make([]*schedule.Scheduler, n)
	err := runGroup(n, func(i int) error {
		in, err := openCountedPool(ctx, url, schedPoolConns)
		if err != nil {
			return err
		}
		insts[i] = in
		s, err := schedule.New(in.pool, schedule.Config{Holder: fmt.Sprintf("i%d", i), Logger: logger, Hooks: obs.events})
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
	label := fmt.Sprintf("scheduler, %d × %d schedules %s", n, k, map[bool]string{true: "due every second", false: "idle (none due)"}[due])
	endTask := e.prog.task("  schedules: "+label, "runs", 0, obs.runs.n.Load)
	settle := time.Duration(0)
	if !due {
		settle = p.SchedSettle
	}
	ph, err := measureWindow(ctx, e, dbName, insts, p.SchedWarmup, settle, d, label)
	endTask()
	if serr := stop(); serr != nil && err == nil {
		err = serr
	}
	if err != nil || !due {
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
	if err != nil {
		return ph.schedPhase, err
	}
	ph.due = int64(k) * wholeSeconds(ph.from, ph.to)
	ph.recorded, err = scanInt64(ctx, dbp, `SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule LIKE $1 AND instant > $2 AND instant <= $3`, prefix+"-%", ph.from, ph.to)
	return ph.schedPhase, err
}

// window is a measured phase with its bounds in database time.
type window struct {
	schedPhase
	from, to time.Time
}

// measureWindow waits warmup, and up to settle more until the instances
// send at most 5 statements per second each, then counts statements on
// dbName for d (pg_stat_statements, or the instances' client counters),
// sampling the database's connections.
func measureWindow(ctx context.Context, e *env, dbName string, insts []*schedInstance, warmup, settle, d time.Duration, label string) (window, error) {
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(warmup); err != nil {
		return window{}, err
	}
	client := func() int64 {
		var s int64
		for _, in := range insts {
			s += in.count.n.Load()
		}
		return s
	}
	var w window
	for t0 := time.Now(); time.Since(t0) < settle; {
		c0 := client()
		if err := sleep(time.Second); err != nil {
			return w, err
		}
		if client()-c0 <= 5*int64(len(insts)) {
			break
		}
		w.settle = time.Since(t0)
	}
	if w.settle > 0 {
		w.settle += warmup
	}
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
	w.prof = ph.end(ctx, label, 10)
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
func oncePhaseRun(ctx context.Context, e *env, url, dbName string, p *params, k int, runs *schedRuns) (schedPhase, error) {
	n := p.SchedInstances
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
						name := fmt.Sprintf("once-k%d-%03d", k, j)
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
	w, err := measureWindow(ctx, e, dbName, insts, p.SchedWarmup, 0, p.SchedBusy, label)
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
FROM pgclaim_ticks WHERE job LIKE $1 AND fire_at > $2 AND fire_at <= $3`, fmt.Sprintf("once-k%d-%%", k), w.from, w.to)
	w.due, w.recorded = int64(k)*wholeSeconds(w.from, w.to), w.instants
	return w.schedPhase, err
}

// wholeSeconds counts the whole seconds s with from < s ≤ to.
func wholeSeconds(from, to time.Time) int64 {
	return to.Truncate(time.Second).Unix() - from.Truncate(time.Second).Unix()
}
