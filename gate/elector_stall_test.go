package gate_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// stallTracer delays the first statement whose text contains match by
// delay, before it is sent: a saturated pool, a GC or VM pause between two
// statements of a campaign.
type stallTracer struct {
	match   string
	delay   time.Duration
	stalled atomic.Int32
	done    chan struct{} // closed when the stalled statement has returned
}

type stallKey struct{}

func (s *stallTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, s.match) && s.stalled.Add(1) == 1 {
		time.Sleep(s.delay)
		return context.WithValue(ctx, stallKey{}, true)
	}
	return ctx
}

func (s *stallTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(stallKey{}) != nil {
		close(s.done)
	}
}

// The gate sends a statement as a batch (BEGIN, statement, COMMIT) when it
// runs it at read committed: the same stall, for batches.

func (s *stallTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, s.match) && s.stalled.Add(1) == 1 {
			time.Sleep(s.delay)
			return context.WithValue(ctx, stallKey{}, true)
		}
	}
	return ctx
}

func (*stallTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (s *stallTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if ctx.Value(stallKey{}) != nil {
		close(s.done)
	}
}

// openTerms counts the election's open terms.
func openTerms(t testing.TB, pool *pgxpool.Pool, election string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgclaim_terms WHERE election = $1 AND ended_at IS NULL`, election).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A lease candidate stalls between opening its term and stamping its start
// for longer than the TTL, while no standby campaigns, and then gives up
// campaigning. The late stamp must not leave a row that no statement can
// close: a standby that campaigns afterwards leads within TTL +
// RetryInterval of the stalled start (the documented bound, plus room for a
// loaded machine), and no term is left open at the end.
func TestElectorLeaseStalledStampDoesNotBlockElection(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	const (
		ttl   = 300 * time.Millisecond
		retry = 30 * time.Millisecond
	)
	o := gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: ttl, RetryInterval: retry}

	tracer := &stallTracer{match: "StampTermStart", delay: 3 * ttl, done: make(chan struct{})}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	stalledPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalledPool.Close)

	a := newElector(t, stalledPool, "stall", "stalled", o)
	b := newElector(t, db.NewPool(t), "stall", "standby", o)

	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Campaign(actx)
		aDone <- err
	}()
	// Wait until the stalled candidate has opened its term.
	for wait := time.Now(); tracer.stalled.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Since(wait) > 10*time.Second {
			t.Fatal("the candidate never sent StampTermStart")
		}
	}
	start := time.Now()
	<-tracer.done // the stamp ran, past the lease
	acancel()     // the stalled instance stops campaigning
	<-aDone

	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	defer bcancel()
	bStart := time.Now()
	if _, err := b.Campaign(bctx); err != nil {
		t.Fatalf("standby never led after the stalled stamp (%v): %v", time.Since(bStart), err)
	}
	led := time.Now()
	// The documented bound: the stalled term ends TTL after it opened; a
	// standby leads at its first try after that.
	bound := start.Add(ttl)
	if bStart.After(bound) {
		bound = bStart
	}
	bound = bound.Add(retry)
	t.Logf("standby leads %v after it started campaigning, %v after the stalled term opened (bound: %v after)",
		led.Sub(bStart), led.Sub(start), bound.Sub(start))
	if led.After(bound.Add(5 * time.Second)) {
		t.Errorf("standby led %v past the bound", led.Sub(bound))
	}
	if a.IsLeader() {
		t.Error("the stalled candidate and the standby both lead")
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if a.IsLeader() {
		if err := a.Resign(ctx); err != nil {
			t.Fatalf("Resign stalled: %v", err)
		}
	}
	checkTerms(t, db.Pool, "stall")
	if n := openTerms(t, db.Pool, "stall"); n != 0 {
		t.Fatalf("%d terms left open; want 0: %v", n, checkTerms(t, db.Pool, "stall"))
	}
}

// A row left by an earlier release, whose start was stamped after its lease
// ran out, is closed and taken over by the next candidate.
func TestElectorLeaseTakesOverRowStampedAfterLease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO pgclaim_terms (election, term, holder, method, started_at, lease_until)
		VALUES ('stuck', nextval('pgclaim_fence_seq'), 'old', 'lease', now(), now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	e := newElector(t, db.NewPool(t), "stuck", "new", gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: 300 * time.Millisecond})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := e.Campaign(cctx); err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	terms := checkTerms(t, db.Pool, "stuck")
	if len(terms) != 2 || openTerms(t, db.Pool, "stuck") != 0 {
		t.Fatalf("terms: %v", terms)
	}
	if r := terms[0].EndReason; r == nil || *r != "expired" {
		t.Errorf("stuck term closed as %v; want expired", r)
	}
}
