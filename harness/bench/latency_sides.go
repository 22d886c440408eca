package bench

// The latency scenario's sides: the producers, pgclaim's idle workers and
// River's client, each in a fresh database.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/internal/listen"
	"github.com/pgclaim/pgclaim/pgtest"
)

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
