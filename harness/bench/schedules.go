package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

// schedPoolConns is the pool size of each scheduler or gate instance.
const schedPoolConns = 4

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

// wholeSeconds counts the whole seconds s with from < s ≤ to.
func wholeSeconds(from, to time.Time) int64 {
	return to.Truncate(time.Second).Unix() - from.Truncate(time.Second).Unix()
}
