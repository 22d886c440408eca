package schedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// The scheduler's guarantees hold when the database defaults to
// REPEATABLE READ or SERIALIZABLE: two instances, a one-second schedule
// and a trigger, every run once, no serialization failure.
func TestAnyIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDatabase(t)
			effectsTable(t, db.Pool)
			if _, err := db.Pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_isolation = '"+level+"'"); err != nil {
				t.Fatal(err)
			}
			ev := &events{}
			def := Definition{Name: "tick", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll, Overlap: OverlapBufferOne}
			var ins []*instance
			for i := range 2 {
				in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, ev)
				var iso string
				if err := in.pool.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&iso); err != nil || iso != level {
					t.Fatalf("pool isolation %q (%v), want %q", iso, err, level)
				}
				if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
					t.Fatal(err)
				}
				in.start(t)
				ins = append(ins, in)
			}
			if _, _, err := ins[0].s.Trigger(ctx, def.Name); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Second)
			stopped := time.Now()
			for _, in := range ins {
				in.stop()
			}
			rows := runsOf(t, db.Pool, def.Name)
			if len(rows) < 3 {
				t.Fatalf("%d runs", len(rows))
			}
			for _, r := range rows {
				// The last instants before the stop may be still pending, or
				// attempts the stop interrupted and handed back (a loaded
				// machine's runner can be a second or two behind).
				if r.Instant.After(stopped.Add(-2500*time.Millisecond)) && (r.State == stateSucceeded || r.State == statePending ||
					r.State == stateRetrying && r.Reason != nil && strings.Contains(*r.Reason, "interrupted")) {
					continue
				}
				if r.State != stateSucceeded || r.Attempt != 1 {
					t.Errorf("%v %s: state %s attempt %d reason %q", r.Instant, r.Kind, r.State, r.Attempt, deref(r.Reason))
				}
			}
			var dup int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT instant FROM effects GROUP BY 1 HAVING count(*) <> 1) x`).Scan(&dup); err != nil || dup != 0 {
				t.Errorf("%d instants without exactly one effect (%v)", dup, err)
			}
		})
	}
}

// Behind a pooler (the backend pid differs from the announced one) the
// advisory scheduler refuses to run; with LeaseLocks it runs.
func TestPoolerRefusedWithoutLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	pool, err := pgxpool.NewWithConfig(ctx, pgprobe.ProxyConfig(t, db.Pool, true, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := New(pool, Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, Definition{Name: "x", Spec: "* * * * * *", Version: 1}, nop); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.Run(rctx); !errors.Is(err, gate.ErrPooler) {
		t.Fatalf("Run behind a pooler: %v, want ErrPooler", err)
	}
	ls, err := New(pool, Config{Logger: testLogger(t), LeaseLocks: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Register(ctx, Definition{Name: "x", Spec: "* * * * * *", Version: 1}, nop); err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer lcancel()
	if err := ls.Run(lctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lease scheduler: %v", err)
	}
	if n := len(runsOf(t, db.Pool, "x")); n < 1 {
		t.Fatalf("%d runs behind the pooler with leases", n)
	}
}
