package bench

// One side of a herd shape in a fresh database: the effects table, the
// run from start to the last instant, and what is counted of it.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/pgtest"
)

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
