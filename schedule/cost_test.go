package schedule

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/pgtest"
)

// counter counts the statements sent on a pool's connections (including
// those taken out of it for locks and notifications).
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func countedPool(t *testing.T, db *pgtest.Database) (*pgxpool.Pool, *counter) {
	c := &counter{}
	return tracedPool(t, db, c), c
}

// tracedPool opens a pool on db whose connections report to tracer.
func tracedPool(t *testing.T, db *pgtest.Database, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The cost of the scheduler, logged (not asserted): statements per second
// of an idle instance with 50 schedules none of which is due, and
// statements per instant with four instances on one-second schedules.
func TestCostLogged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)

	pool, c := countedPool(t, db)
	s, err := New(pool, Config{Holder: "idle", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := s.Register(ctx, Definition{Name: fmt.Sprintf("yearly-%d", i), Spec: "0 0 1 1 *", Version: 1}, nop); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	time.Sleep(2 * time.Second) // start-up: each schedule looked at once
	before := c.n.Load()
	time.Sleep(5 * time.Second)
	idle := float64(c.n.Load()-before) / 5
	cancel()
	<-done
	t.Logf("idle: 50 schedules, none due, poll 1 s: %.1f statements/s (BEGIN and COMMIT counted)", idle)

	var counters []*counter
	for i := range 4 {
		pool, c := countedPool(t, db)
		counters = append(counters, c)
		s, err := New(pool, Config{Holder: fmt.Sprintf("inst-%d", i), Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Register(ctx, Definition{Name: "every-second", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll}, nop); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Run(rctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	time.Sleep(2 * time.Second)
	var start int64
	for _, c := range counters {
		start += c.n.Load()
	}
	n0 := len(runsOf(t, db.Pool, "every-second"))
	time.Sleep(5 * time.Second)
	var end int64
	for _, c := range counters {
		end += c.n.Load()
	}
	n := len(runsOf(t, db.Pool, "every-second")) - n0
	if n > 0 {
		t.Logf("busy: 4 instances, one 1 s schedule: %d instants, %.1f statements per instant across the instances (polls included)", n, float64(end-start)/float64(n))
	}
}
