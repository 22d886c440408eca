package bench

// One phase of the schedules scenario, the Scheduler's or gate.Once's for
// reference: the instances started, the window measured, the lags.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
)

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
