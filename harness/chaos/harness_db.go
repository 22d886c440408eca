package chaos

// The harness's own statements: the database's clock, the progress line,
// the rows it produces, the settling wait and the pooler probe.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
)

func (h *harness) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := h.pool.QueryRow(ctx, "SELECT now()").Scan(&t)
	return t, err
}

// dbNowRetry reads database time, retrying while the server restarts.
func (h *harness) dbNowRetry(ctx context.Context) (time.Time, error) {
	var last error
	for i := 0; i < 100; i++ {
		t, err := h.dbNow(ctx)
		if err == nil {
			return t, nil
		}
		last = err
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Time{}, last
}

// progress prints a line a minute while faults are injected.
func (h *harness) progress(ctx context.Context) {
	began := time.Now()
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var rows, open int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = h.pool.QueryRow(qctx, "SELECT count(*), count(*) FILTER (WHERE state IN ('PAUSED', 'PROCESSING')) FROM chaos_rows").Scan(&rows, &open)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.faults.mu.Lock()
		n := 0
		for _, c := range h.faults.n {
			n += c
		}
		h.faults.mu.Unlock()
		h.logf("%s: %d faults injected, %d rows (%d open)", time.Since(began).Round(time.Second), n, rows, open)
	}
}

// produce inserts new PAUSED rows at the configured rate.
func (h *harness) produce(ctx context.Context) {
	const step = 100 * time.Millisecond
	per := float64(h.cfg.RowsPerSecond) * step.Seconds()
	owed := 0.0
	t := time.NewTicker(step)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owed += per
		n := int(owed)
		if n == 0 {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := h.pool.Exec(ictx, "INSERT INTO chaos_rows (state) SELECT 'PAUSED' FROM generate_series(1, $1)", n)
		cancel()
		if err == nil {
			owed -= float64(n)
			if h.pat != nil {
				h.pat.first(time.Now(), func(e *promotion) *time.Time { return &e.firstWrite })
			}
		}
	}
}

// settle waits until every row is finished and every schedule's instants
// up to tStop are recorded and finished, or gives up after a generous
// bound: what is left then is reported by the checker.
func (h *harness) settle(ctx context.Context, tStop time.Time) error {
	w := h.cfg.worker()
	minWait := 4*h.cfg.Period + time.Second
	deadline := time.Now().Add(4*time.Minute + minWait)
	began := time.Now()
	names := h.cfg.scheduleNames()
	for {
		var open, openRuns, recorded int
		err := h.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM chaos_rows WHERE state IN ('PAUSED', 'PROCESSING')),
			(SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule = ANY($1) AND instant <= $2
			   AND state NOT IN ('succeeded', 'failed', 'skipped')),
			(SELECT count(*) FROM pgclaim_schedules s WHERE s.name = ANY($1) AND EXISTS (
			   SELECT 1 FROM pgclaim_schedule_runs r WHERE r.schedule = s.name AND r.instant >= $2))`,
			names, tStop).Scan(&open, &openRuns, &recorded)
		if h.cfg.Broken == BrokenNoLedger {
			openRuns, recorded = 0, len(names)
		}
		if err == nil && open == 0 && openRuns == 0 && recorded == len(names) && time.Since(began) >= minWait {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("chaos: settle: %w", err)
			}
			return fmt.Errorf("chaos: %d rows still PAUSED or PROCESSING, %d schedule runs open, %d of %d schedules recorded up to the end, %s after faults stopped",
				open, openRuns, recorded, len(names), time.Since(began).Round(time.Second))
		}
		if !sleepCtx(ctx, w.SweepEvery/2) {
			return ctx.Err()
		}
	}
}

// probePooler checks that the advisory variants refuse to run behind a
// transaction-pooling PgBouncer, with gate.ErrPooler, and that the lease
// variants work there.
func probePooler(ctx context.Context, url string) Check {
	c := Check{Name: checkPooler}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		c.fail("connect through PgBouncer: %v", err)
		return c
	}
	defer pool.Close()
	g, err := gate.New(pool, gate.Config{Holder: "probe"})
	if err != nil {
		c.fail("gate.New: %v", err)
		return c
	}
	defer g.Close()
	ran := false
	fn := func(context.Context, gate.Run) error { ran = true; return nil }
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	c.Checked++
	if err := g.Once(pctx, "chaos-probe", time.Now(), fn); !errors.Is(err, gate.ErrPooler) {
		c.fail("advisory Gate.Once behind PgBouncer: got %v, want gate.ErrPooler", err)
	}
	c.Checked++
	if err := g.Exclusive(pctx, "chaos-probe", fn); !errors.Is(err, gate.ErrPooler) {
		c.fail("advisory Gate.Exclusive behind PgBouncer: got %v, want gate.ErrPooler", err)
	}
	c.Checked++
	e, err := gate.NewElector(pool, "chaos-probe", gate.ElectorConfig{Holder: "probe", TTL: time.Second})
	if err == nil {
		_, err = e.Campaign(pctx)
	}
	if !errors.Is(err, gate.ErrPooler) {
		c.fail("advisory Elector.Campaign behind PgBouncer: got %v, want gate.ErrPooler", err)
	}
	if ran {
		c.fail("an advisory job ran behind PgBouncer")
	}
	// The lease variants work there.
	c.Checked++
	l, err := gate.NewLease(pool, "chaos-probe", gate.LeaseConfig{Holder: "probe", AtMost: time.Second})
	if err == nil {
		err = l.Do(pctx, func(context.Context, gate.Run) error { return nil })
	}
	if err != nil {
		c.fail("gate.Lease behind PgBouncer: %v", err)
	}
	c.Checked++
	le, err := gate.NewElector(pool, "chaos-probe-lease", gate.ElectorConfig{Holder: "probe", Mechanism: gate.LeaseRow, TTL: time.Second})
	if err == nil {
		if _, err = le.Campaign(pctx); err == nil {
			err = le.Resign(pctx)
		}
	}
	if err != nil {
		c.fail("lease Elector behind PgBouncer: %v", err)
	}
	return c
}
