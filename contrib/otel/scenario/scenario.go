package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	pgclaimotel "github.com/pgclaim/pgclaim/contrib/otel"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// Kind is what kind of value a Series reads.
type Kind int

// The kinds of Series.
const (
	Counter Kind = iota // a counter's value
	Gauge               // a gauge's value
	Count               // a histogram's count of observations
)

// Series names one time series: an instrument under its OpenTelemetry
// name and its Prometheus name (as the exporter writes it, with unit and
// _total suffixes; a histogram's name without _count), and attributes (by
// their OpenTelemetry keys) it must carry. A series matches every data
// point that carries those attributes, whatever its others.
type Series struct {
	Name   string
	Prom   string
	Kind   Kind
	Labels map[string]string
}

func (s Series) String() string { return fmt.Sprintf("%s%v", s.Name, s.Labels) }

// Reader returns the sum of the values of s's data points in the
// instance's export (0: the first Observer, 1: the second), and whether
// any data point matched.
type Reader func(t testing.TB, instance int, s Series) (float64, bool)

// Run drives pgclaim on db with obs[0] and obs[1] and checks with read
// what they export. obs[0] receives the claimer's, the gate's, the
// scheduler's and one elector's events and counts the claimed table
// (WatchTables); obs[1] the other elector's.
func Run(t *testing.T, db *pgtest.Database, obs [2]*pgclaimotel.Observer, read Reader) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := checker{t: t, read: read}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Claims, through Multi next to hooks the service already has.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE jobs (id bigint PRIMARY KEY, state text NOT NULL,
		claimed_at timestamptz, claimed_by text, fence bigint, lease_until timestamptz, attempts int, reason text);
		CREATE INDEX ON jobs (id) WHERE state = 'PAUSED';
		INSERT INTO jobs (id, state) SELECT g, 'PAUSED' FROM generate_series(1, 6) g`); err != nil {
		t.Fatal(err)
	}
	tbl := claim.Table{Name: "jobs", Key: "id", State: "state", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by",
		Fence: "fence", LeaseUntil: "lease_until", Attempts: "attempts", Reason: "reason"}
	var seen int
	existing := claim.HooksFunc(func(context.Context, claim.Event) { seen++ })
	c, err := claim.New[int64](db.Pool, tbl, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: "a", Logger: quiet,
		Hooks: pgclaimotel.Multi[claim.Event]{existing, obs[0].ClaimHooks()}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		err := obs[0].WatchTables(ctx, db.Pool, pgclaimotel.TablesConfig{Logger: quiet, Interval: 50 * time.Millisecond,
			Tables: []pgclaimotel.Table{{Table: tbl, InProgress: "PROCESSING"}}})
		if err != nil {
			t.Error(err)
		}
	}()
	cls, err := c.ClaimBatch(ctx, 3)
	if err != nil || len(cls) != 3 {
		t.Fatalf("ClaimBatch: %v, %v", cls, err)
	}
	for _, cl := range cls[:2] {
		if err := c.Finish(ctx, cl, "DONE"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Claim(ctx, cls[0].Key); !errors.Is(err, claim.ErrNotClaimed) {
		t.Fatalf("Claim of a row done: %v, want ErrNotClaimed", err)
	}
	leased, err := claim.New[int64](db.Pool, tbl, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: "b", Logger: quiet,
		Lease: 10 * time.Millisecond, Hooks: obs[0].ClaimHooks()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leased.Claim(ctx, 5); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	sw, err := claim.NewSweeper(c, claim.SweeperConfig[int64]{StaleAfter: time.Millisecond, Failed: "FAILED", BatchSize: 10, SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 2 {
		t.Fatalf("Sweep: %v, %v", got, err)
	}
	if err := c.Finish(ctx, cls[2], "DONE"); !errors.Is(err, claim.ErrLost) {
		t.Fatalf("Finish of a swept claim: %v, want ErrLost", err)
	}
	if _, err := c.Claim(ctx, 4); err != nil { // left in progress
		t.Fatal(err)
	}
	jobs := map[string]string{"pgclaim.table": "jobs"}
	r.want(0, Series{"pgclaim.claim.claims", "pgclaim_claim_claims_total", Counter, with(jobs, "pgclaim.claim.outcome", "claimed", "pgclaim.state", "PROCESSING")}, 5)
	r.want(0, Series{"pgclaim.claim.claims", "pgclaim_claim_claims_total", Counter, with(jobs, "pgclaim.claim.outcome", "finished", "pgclaim.state", "DONE")}, 2)
	r.want(0, Series{"pgclaim.claim.claims", "pgclaim_claim_claims_total", Counter, with(jobs, "pgclaim.claim.outcome", "not_claimed")}, 1)
	r.want(0, Series{"pgclaim.claim.lost", "pgclaim_claim_lost_total", Counter, jobs}, 1)
	r.want(0, Series{"pgclaim.claim.swept", "pgclaim_claim_swept_total", Counter, with(jobs, "pgclaim.state", "FAILED", "pgclaim.sweep.reason", "claimed_too_long")}, 1)
	r.want(0, Series{"pgclaim.claim.swept", "pgclaim_claim_swept_total", Counter, with(jobs, "pgclaim.state", "FAILED", "pgclaim.sweep.reason", "lease_expired")}, 1)
	r.want(0, Series{"pgclaim.claim.statement.duration", "pgclaim_claim_statement_duration_seconds", Count, with(jobs, "pgclaim.claim.operation", "finished")}, 2)
	if seen != 8 {
		t.Errorf("the service's own hooks saw %d events through Multi, want 8", seen)
	}
	r.eventually(0, Series{"pgclaim.claim.table.rows", "pgclaim_claim_table_rows", Gauge, with(jobs, "pgclaim.state", "PAUSED")}, 1)
	r.eventually(0, Series{"pgclaim.claim.table.rows", "pgclaim_claim_table_rows", Gauge, with(jobs, "pgclaim.state", "FAILED")}, 2)
	r.eventually(0, Series{"pgclaim.claim.table.rows", "pgclaim_claim_table_rows", Gauge, with(jobs, "pgclaim.state", "PROCESSING")}, 1)
	age := Series{"pgclaim.claim.table.oldest_claim.age", "pgclaim_claim_table_oldest_claim_age_seconds", Gauge, with(jobs, "pgclaim.state", "PROCESSING")}
	if v, ok := read(t, 0, age); !ok || v < 0 {
		t.Errorf("%v = %v (found %v), want an age", age, v, ok)
	}

	// Gate ticks: one succeeded, one skipped (claimed already), one failed.
	g, err := gate.New(db.Pool, gate.Config{Holder: "a", Logger: quiet, Hooks: obs[0].GateHooks()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var now time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT date_trunc('second', now())`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, gate.Run) error { return nil }
	if err := g.Once(ctx, "report", now, ok); err != nil {
		t.Fatal(err)
	}
	if err := g.Once(ctx, "report", now, ok); !errors.Is(err, gate.ErrSkipped) {
		t.Fatalf("second Once: %v, want ErrSkipped", err)
	}
	if err := g.Once(ctx, "report", now.Add(time.Second), func(context.Context, gate.Run) error { return errors.New("boom") }); err == nil {
		t.Fatal("failing job: no error")
	}
	report := map[string]string{"pgclaim.job": "report"}
	r.want(0, Series{"pgclaim.gate.ticks", "pgclaim_gate_ticks_total", Counter, with(report, "pgclaim.gate.outcome", "succeeded")}, 1)
	r.want(0, Series{"pgclaim.gate.ticks", "pgclaim_gate_ticks_total", Counter, with(report, "pgclaim.gate.outcome", "failed")}, 1)
	r.want(0, Series{"pgclaim.gate.ticks", "pgclaim_gate_ticks_total", Counter, with(report, "pgclaim.gate.outcome", "skipped")}, 1)
	r.want(0, Series{"pgclaim.gate.skips", "pgclaim_gate_skips_total", Counter, with(report, "pgclaim.skip.reason", "claimed")}, 1)
	r.want(0, Series{"pgclaim.gate.run.duration", "pgclaim_gate_run_duration_seconds", Count, report}, 2)

	// A schedule every second whose instants of the last few seconds were
	// missed (every instance down): each is reported missed and, with
	// catch-up none, skipped; the current ones run.
	s, err := schedule.New(db.Pool, schedule.Config{Holder: "a", Logger: quiet, Grace: time.Second, Hooks: obs[0].ScheduleHooks()})
	if err != nil {
		t.Fatal(err)
	}
	def := schedule.Definition{Name: "tick", Spec: "* * * * * *", Version: 1, CatchUp: schedule.CatchUpNone}
	if err := s.Register(ctx, def, func(context.Context, schedule.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET starts_at = now() - interval '5.5 seconds'`); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	tick := map[string]string{"pgclaim.schedule": "tick"}
	succeeded := Series{"pgclaim.schedule.attempts", "pgclaim_schedule_attempts_total", Counter, with(tick, "pgclaim.schedule.outcome", "succeeded", "pgclaim.run.kind", "scheduled")}
	r.atLeast(0, succeeded, 1)
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("scheduler: %v", err)
	}
	missed := Series{"pgclaim.schedule.instants.missed", "pgclaim_schedule_instants_missed_total", Counter, with(tick, "pgclaim.state", "skipped")}
	m := r.atLeast(0, missed, 3)
	r.want(0, Series{"pgclaim.schedule.instants.skipped", "pgclaim_schedule_instants_skipped_total", Counter, with(tick, "pgclaim.skip.reason", "catch_up")}, m)
	n := r.atLeast(0, Series{"pgclaim.schedule.wakeup.lag", "pgclaim_schedule_wakeup_lag_seconds", Count, with(tick, "pgclaim.run.kind", "scheduled")}, 1)
	r.atLeast(0, Series{"pgclaim.schedule.attempt.duration", "pgclaim_schedule_attempt_duration_seconds", Count, tick}, n-1)

	// The leader gauge of two electors flips when the leader's backend is
	// terminated, and turns 0 when the new leader resigns.
	el := map[string]string{"pgclaim.election": "primary"}
	leader := Series{"pgclaim.election.leader", "pgclaim_election_leader", Gauge, el}
	var es [2]*gate.Elector
	for i := range es {
		es[i], err = gate.NewElector(db.NewPool(t), "primary", gate.ElectorConfig{Holder: fmt.Sprint("instance-", i), Logger: quiet, TTL: time.Second,
			Hooks: obs[i].ElectorHooks("primary")})
		if err != nil {
			t.Fatal(err)
		}
	}
	r.want(0, leader, 0)
	r.want(1, leader, 0)
	if _, err := es[0].Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	r.want(0, leader, 1)
	campaigned := make(chan error, 1)
	go func() { _, err := es[1].Campaign(ctx); campaigned <- err }()
	r.want(1, leader, 0)
	terminate(t, db.Pool, "primary")
	if err := <-campaigned; err != nil {
		t.Fatal(err)
	}
	r.eventually(0, leader, 0)
	r.want(1, leader, 1)
	if err := es[1].Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r.want(1, leader, 0)
}

// terminate ends the backend holding the advisory lock of election name.
func terminate(t testing.TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	class, key := gate.ElectionKey(name)
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 2`,
		int64(uint32(class)), int64(uint32(key))).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminate the leader of %q: %d backends, %v", name, n, err)
	}
}

// with returns a copy of base with the pairs kv added.
func with(base map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(base)+len(kv)/2)
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

type checker struct {
	t    *testing.T
	read Reader
}

// want checks that s reads v in instance's export now.
func (c checker) want(instance int, s Series, v float64) {
	c.t.Helper()
	got, ok := c.read(c.t, instance, s)
	if !ok || got != v {
		c.t.Errorf("instance %d: %v = %v (found %v), want %v", instance, s, got, ok, v)
	}
}

// poll waits up to 30 s for cond to hold of s's value, and returns the
// value last read.
func (c checker) poll(instance int, s Series, what string, cond func(float64) bool) float64 {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, ok := c.read(c.t, instance, s)
		if ok && cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("instance %d: %v = %v (found %v) after 30 s, want %s", instance, s, got, ok, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// eventually waits for s to read v.
func (c checker) eventually(instance int, s Series, v float64) {
	c.t.Helper()
	c.poll(instance, s, fmt.Sprint(v), func(got float64) bool { return got == v })
}

// atLeast waits for s to read at least v, and returns what it read.
func (c checker) atLeast(instance int, s Series, v float64) float64 {
	c.t.Helper()
	return c.poll(instance, s, fmt.Sprint("at least ", v), func(got float64) bool { return got >= v })
}
