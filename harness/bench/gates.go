package bench

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
	"github.com/pgclaim/pgclaim/harness/shedlock"
)

// gateHistory is the number of finished ticks the ledger holds before the
// gate runs.
const gateHistory = 100_000

// gateOp is one contender's attempt at tick i: nil when it ran the job,
// an error wrapping gate.ErrSkipped when another contender had it.
type gateOp func(ctx context.Context, i int64) error

// gateMech builds one contender of a mechanism.
type gateMech struct {
	group, name string
	ticks       bool // the op is per tick: count each tick's runs
	exclusive   bool // runs of the job never overlap (a lock is held while it runs)
	setup       func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error)
	// together: the contenders fire each tick at once and wait for one
	// another before the next, as instances whose timers fire on the same
	// second do; won/s is then ticks resolved per second. Otherwise each
	// contender walks the ticks on its own, and a tick it reaches while
	// another contender runs an earlier one is skipped as an overlap by
	// all. Only with several contenders.
	together bool
	// alone: walking its ticks, the mechanism runs with one contender
	// only (the floors, which do not handle a lock held by another tick's
	// run: with one contender, or ticks fired together, none is).
	alone bool
}

// gateTogether is the suffix of the mechanisms whose contenders fire each
// tick together.
const gateTogether = ", ticks fired together"

// errHeldBaseline is what baseline ops return when the lock is taken.
var errHeldBaseline = fmt.Errorf("%w: baseline lock held", gate.ErrSkipped)

// quiet is the gates' logger: the baselines log nothing, and a gate's
// default logger (slog.Default) writes a line per finished run, which
// costs the client a write to stderr each cycle.
var quiet = slog.New(slog.DiscardHandler)

func gateMechs() []gateMech {
	const name = "bench-job"
	run := func(job func(i int64), i int64) gate.Func {
		return func(context.Context, gate.Run) error { job(i); return nil }
	}
	once := func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
		g, err := gate.New(pool, gate.Config{Holder: fmt.Sprintf("c%d", c), Logger: quiet})
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, i int64) error { return g.Once(ctx, name, at(i), run(job, i)) }, g.Close, nil
	}
	shed := func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
		holder := fmt.Sprintf("c%d", c)
		return func(ctx context.Context, i int64) error {
			took, err := shedlock.Lock(ctx, pool, name, holder, 30*time.Second)
			if err != nil {
				return err
			}
			if !took {
				return errHeldBaseline
			}
			job(i)
			return shedlock.Unlock(ctx, pool, name, holder, 0)
		}, func() {}, nil
	}
	mechs := []gateMech{
		{group: "pgclaim", name: "gate.Once (ledger + advisory)", ticks: true, exclusive: true, setup: once},
		{group: "pgclaim", name: "gate.Once (ledger + advisory)" + gateTogether, ticks: true, exclusive: true, setup: once, together: true},
		{group: "pgclaim", name: "gate.Once, LedgerOnly", ticks: true, exclusive: false, setup: func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
			g, err := gate.New(pool, gate.Config{Holder: fmt.Sprintf("c%d", c), LedgerOnly: true, Logger: quiet})
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context, i int64) error { return g.Once(ctx, name+"-ledger", at(i), run(job, i)) }, g.Close, nil
		}},
		{group: "pgclaim", name: "gate.Exclusive (advisory)", ticks: false, exclusive: true, setup: func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
			g, err := gate.New(pool, gate.Config{Holder: fmt.Sprintf("c%d", c), Logger: quiet})
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context, i int64) error { return g.Exclusive(ctx, name, run(job, i)) }, g.Close, nil
		}},
		{group: "pgclaim", name: "gate.Lease.Do (lease row)", ticks: false, exclusive: true, setup: func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
			l, err := gate.NewLease(pool, name, gate.LeaseConfig{Holder: fmt.Sprintf("c%d", c), AtMost: 30 * time.Second, Logger: quiet})
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context, i int64) error { return l.Do(ctx, run(job, i)) }, func() {}, nil
		}},
		{group: "baseline", name: "ShedLock-style lock table", exclusive: true, setup: shed},
		// Counted per tick: a contender that arrives after the winner's
		// unlock takes the lock again and runs the tick a second time
		// (lockAtLeastFor = 0), which the report shows and does not fail.
		{group: "baseline", name: "ShedLock-style lock table" + gateTogether, ticks: true, exclusive: true, setup: shed, together: true},
		{group: "baseline", name: "bare advisory lock (dedicated conn)", ticks: false, exclusive: true, setup: func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return nil, nil, err
			}
			class, key := gate.AdvisoryKey(name + "-bare")
			return func(ctx context.Context, i int64) error {
					var ok bool
					if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int4, $2::int4)", class, key).Scan(&ok); err != nil {
						return err
					}
					if !ok {
						return errHeldBaseline
					}
					job(i)
					if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", class, key).Scan(&ok); err != nil {
						return err
					}
					if !ok {
						return errors.New("bare advisory unlock: lock was not held")
					}
					return nil
				}, func() {
					conn.Release()
				}, nil
		}},
	}
	return append(mechs, floorMechs(name)...)
}

// runGates measures acquire+release cycles of every gate mechanism and of
// the baselines, with one contender and with several on one name.
func runGates(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, admin, done, err := e.scratch(ctx, 2)
	if err != nil {
		return err
	}
	defer done()
	if _, err := admin.Exec(ctx, shedlock.DDL); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, floorDDL); err != nil {
		return err
	}
	// A ledger in steady state: history of other jobs, and statistics. On a
	// fresh, never-analyzed ledger the plan cached for finishing a tick is a
	// sequential scan, and each finish reads the whole ledger until
	// autovacuum analyzes it.
	if err := execAllArgs(ctx, admin,
		stmt{`INSERT INTO pgclaim_ticks (job, fire_at, holder, fence, started_at, finished_at, outcome)
SELECT 'history-' || (g % 100), date_trunc('minute', now()) - (g / 100) * interval '1 minute', 'seed', nextval('pgclaim_fence_seq'),
       now() - (g / 100) * interval '1 minute', now() - (g / 100) * interval '1 minute' + interval '1 second', 'succeeded'
FROM generate_series(1, $1::int) AS g`, []any{gateHistory}},
		// The floor ledger holds the same history.
		stmt{"INSERT INTO floor_ticks (job, fire_at, outcome) SELECT job, fire_at, outcome FROM pgclaim_ticks", nil},
		stmt{"ANALYZE floor_ticks", nil},
		stmt{"ANALYZE pgclaim_ticks", nil},
		stmt{"ANALYZE pgclaim_locks", nil},
		stmt{"ANALYZE shedlock", nil},
	); err != nil {
		return err
	}
	r.setup("each contender is an instance with its own pool (and own gate/lease object); the job does nothing")
	r.setup("the ledger starts in steady state: %d finished ticks of 100 other jobs, analyzed", gateHistory)
	r.setup("a cycle is acquire + run + release; contenders %v loop for %s in all on one name, in %d rounds that take turns with the other mechanisms", p.GateContenders, p.GateDuration, max(1, p.GateRounds))
	r.setup("ledger mechanisms fire consecutive ticks (1 µs apart); every contender tries every tick, on its own: with 8 contenders most attempts find the tick claimed, or the job's lock held by the run of another tick, which skips that tick for everyone (an overlap a real schedule, ticks seconds apart, does not have)")
	r.setup("%q rows: the contenders fire each tick at once and the next when all have returned, as instances whose timers fire on the same second do; won/s is ticks resolved per second, each by one run, and every tick must run (for the ShedLock-style table too, whose duplicates are shown, not failed)", gateTogether[2:])
	r.setup("ShedLock-style: INSERT … ON CONFLICT (name) DO UPDATE … WHERE lock_until <= now(), then UPDATE lock_until = max(now(), locked_at + at_least) (at_least = 0): ShedLock's own SQL with usingDbTime()")
	r.setup("floor rows: what a mechanism cannot do with less. \"ledger floor\": a row per tick in a table with its primary key alone, inserted with the advisory lock taken in the same statement and updated with the unlock, on a dedicated connection (no fencing token, no index for dead holders or retention, no library); \"ledger floor with a fencing token\": the same row stamped with pgclaim_fence(); \"gate.Once's statements, sent by hand\", \"gate.Exclusive's statements, sent by hand\" and \"gate.Lease's statements, sent by hand\": pgclaim's own SQL from package store without the gate around it (watcher, validity clock, events), so the gap between a mechanism and its statements is the library's client cost, and the gap between its statements and the baseline is what the guarantee costs the server (a durable fencing token, a row per tick)")
	r.setup("checks: a tick runs at most once; two runs under one lock never overlap (LedgerOnly takes no lock: different ticks may overlap there, by design)")

	tbl := Table{Title: "Gate cycles (acquire + release); p50/p99 of won cycles, then of skipped attempts",
		Columns: []string{"mechanism", "contenders", "won", "won/s", "attempts/s", "p50", "p99", "skip p50", "dup/overlap"}}
	// Rounds: every (mechanism, contenders) runs for a slice of the
	// duration in each round, in rotating order, so a disturbance of the
	// machine (other processes) hits every mechanism alike.
	mechs := gateMechs()
	type cell struct{ m, c int }
	var cells []cell
	for mi, m := range mechs {
		for ci, c := range p.GateContenders {
			if (!m.together || c > 1) && (!m.alone || c == 1 || m.together) {
				cells = append(cells, cell{mi, ci})
			}
		}
	}
	acc := make([]gateRaw, len(cells))
	rounds := max(1, p.GateRounds)
	slice := p.GateDuration / time.Duration(rounds)
	for round := range rounds {
		for k := range cells {
			i := (k + round*len(p.GateContenders)) % len(cells)
			m, c := mechs[cells[i].m], p.GateContenders[cells[i].c]
			ph := e.begin(ctx, db.Name)
			raw, err := gateRun(ctx, e, admin, db.URL, m, c, slice, fmt.Sprintf("round %d/%d", round+1, rounds))
			prof := ph.end(ctx, fmt.Sprintf("%s, %d contender(s)", m.name, c), 4)
			if err != nil {
				return fmt.Errorf("%s, %d contenders: %w", m.name, c, err)
			}
			if round == 0 && (cells[i].c == 0 || m.together) {
				r.Profiles = append(r.Profiles, prof)
			}
			acc[i].merge(raw)
		}
	}
	var dupTicks, overlaps, missed int64
	for i, cl := range cells {
		m, c, raw := mechs[cl.m], p.GateContenders[cl.c], acc[i]
		res := raw.result(m, c)
		if m.group == "baseline" && raw.dups > 0 {
			r.note("%s, %d contenders: %d of %d ticks run twice or more (a contender arriving after the winner's unlock takes the lock again: lockAtLeastFor 0)", m.name, c, raw.dups, raw.won)
		} else {
			dupTicks += raw.dups
		}
		overlaps += raw.overlaps
		missed += raw.missed
		r.Results = append(r.Results, res)
		tbl.Rows = append(tbl.Rows, []string{m.name, itoa(c), fmt.Sprintf("%d", res.Ops), fmt.Sprintf("%.0f", res.PerSecond),
			fmt.Sprintf("%.0f", res.Extra["attempts_per_second"]), fmtUs(res.P50us), fmtUs(res.P99us),
			fmtUs(res.Extra["skip_p50_us"]), fmt.Sprintf("%d", raw.dups+raw.overlaps)})
	}
	r.Tables = append(r.Tables, tbl)
	r.check("gates: ticks run more than once", 0, dupTicks)
	r.check("gates: jobs overlapping under one lock", 0, overlaps)
	r.check("gates: ticks fired together that no contender ran", 0, missed)
	ticks, err := scanInt64(ctx, admin, "SELECT count(*) FROM pgclaim_ticks WHERE outcome <> 'succeeded'")
	if err != nil {
		return err
	}
	r.check("gates: ledger rows not recorded as succeeded", 0, ticks)
	r.note("on a fresh, never-analyzed ledger the finish statement's cached plan is a sequential scan until autovacuum analyzes pgclaim_ticks (measured while building this benchmark: a gate.Once cycle went from 0.4 ms to 1.7 ms over the first 16,000 ticks, and back to 0.35 ms after ANALYZE)")
	return nil
}

// gateRaw is what runs of one (mechanism, contenders) measured.
type gateRaw struct {
	won, tries, dups, overlaps int64
	missed                     int64 // ticks fired together that no contender ran
	elapsed                    time.Duration
	wonLat, skipLat            []time.Duration
}

func (g *gateRaw) merge(o gateRaw) {
	g.won += o.won
	g.tries += o.tries
	g.dups += o.dups
	g.overlaps += o.overlaps
	g.missed += o.missed
	g.elapsed += o.elapsed
	g.wonLat = append(g.wonLat, o.wonLat...)
	g.skipLat = append(g.skipLat, o.skipLat...)
}

func (g gateRaw) result(m gateMech, c int) Result {
	ws, ss := summarize(g.wonLat), summarize(g.skipLat)
	return Result{
		Group: m.group, Name: m.name, Workers: c, Ops: g.won, Unit: "cycles/s",
		Seconds: g.elapsed.Seconds(), PerSecond: perSec(g.won, g.elapsed),
		P50us: us(ws.P50), P99us: us(ws.P99), MaxUs: us(ws.Max),
		Extra: map[string]float64{
			"attempts":            float64(g.tries),
			"attempts_per_second": perSec(g.tries, g.elapsed),
			"skip_p50_us":         us(ss.P50),
			"skip_p99_us":         us(ss.P99),
			"duplicates":          float64(g.dups),
			"overlaps":            float64(g.overlaps),
			"missed":              float64(g.missed),
		},
	}
}

// gateRun runs c contenders of m for d and returns what they measured,
// with the number of ticks run twice and of overlapping jobs.
func gateRun(ctx context.Context, e *env, admin *pgxpool.Pool, url string, m gateMech, c int, d time.Duration, label string) (gateRaw, error) {
	// Each run fires its own ticks: from database time now, 1 µs apart.
	var base time.Time
	if err := admin.QueryRow(ctx, "SELECT now()").Scan(&base); err != nil {
		return gateRaw{}, err
	}
	base = base.Truncate(time.Microsecond)
	at := func(i int64) time.Time { return base.Add(time.Duration(i) * time.Microsecond) }
	var (
		mu      sync.Mutex
		runs    = map[int64]int{}
		inside  atomic.Int64
		overlap atomic.Int64
		won     atomic.Int64
		tries   atomic.Int64
	)
	job := func(i int64) {
		// Without a lock (LedgerOnly), different ticks may run at once.
		if inside.Add(1) != 1 && m.exclusive {
			overlap.Add(1)
		}
		if m.ticks {
			mu.Lock()
			runs[i]++
			mu.Unlock()
		}
		inside.Add(-1)
	}
	pools := make([]*pgxpool.Pool, c)
	ops := make([]gateOp, c)
	var closers []func()
	defer func() {
		for _, f := range closers {
			f()
		}
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}()
	for i := range c {
		p, err := openPool(ctx, url, 4)
		if err != nil {
			return gateRaw{}, err
		}
		pools[i] = p
		op, closeFn, err := m.setup(ctx, i, p, at, job)
		if err != nil {
			return gateRaw{}, err
		}
		ops[i] = op
		closers = append(closers, closeFn)
		// warm the pool and the server's plan cache
		_ = op(ctx, -1-int64(i))
	}
	if m.ticks {
		mu.Lock()
		clear(runs)
		mu.Unlock()
	}
	var wonLat, skipLat latencies
	end := e.prog.task(fmt.Sprintf("  gates: %s, %d contenders, %s", m.name, c, label), "cycles", 0, won.Load)
	ownWon, ownSkip := make([][]time.Duration, c), make([][]time.Duration, c)
	// try is contender ci's attempt at tick i.
	try := func(ci int, i int64) error {
		t0 := time.Now()
		err := ops[ci](ctx, i)
		dt := time.Since(t0)
		tries.Add(1)
		switch {
		case err == nil:
			won.Add(1)
			ownWon[ci] = append(ownWon[ci], dt)
		case errors.Is(err, gate.ErrSkipped):
			ownSkip[ci] = append(ownSkip[ci], dt)
		default:
			return err
		}
		return nil
	}
	start := time.Now()
	deadline := start.Add(d)
	var err error
	var fired int64
	if m.together {
		// Every contender fires tick i at once; the next tick when all
		// have returned.
		for ; err == nil && time.Now().Before(deadline); fired++ {
			err = runGroup(c, func(ci int) error { return try(ci, fired) })
		}
	} else {
		err = runGroup(c, func(ci int) error {
			for i := int64(0); time.Now().Before(deadline); i++ {
				if err := try(ci, i); err != nil {
					return err
				}
			}
			return nil
		})
	}
	el := time.Since(start)
	end()
	if err != nil {
		return gateRaw{}, err
	}
	for ci := range c {
		wonLat.addAll(ownWon[ci])
		skipLat.addAll(ownSkip[ci])
	}
	var dups, missed int64
	for _, n := range runs {
		if n > 1 {
			dups += int64(n - 1)
		}
	}
	if m.together {
		missed = fired - int64(len(runs))
	}
	return gateRaw{
		won: won.Load(), tries: tries.Load(), dups: dups, missed: missed, overlaps: overlap.Load(), elapsed: el,
		wonLat: wonLat.d, skipLat: skipLat.d,
	}, nil
}
