package schedule

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/pgtest"
)

// openRunsTracer watches the runner's reads of a schedule's open runs
// (store.OpenRuns): how many rows each returned, and, for the first read of
// each schedule, how many rows the server examined to answer it (EXPLAIN
// ANALYZE of the same statement, run on another pool just before it).
type openRunsTracer struct {
	explain *pgxpool.Pool
	mu      sync.Mutex
	maxRows map[string]int64 // schedule → most rows one read returned
	scanned map[string]int64 // schedule → rows the server examined in its first read
	err     error
}

type openRunsKey struct{}

func (o *openRunsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.HasPrefix(d.SQL, "-- name: OpenRuns ") || len(d.Args) == 0 {
		return ctx
	}
	name, _ := d.Args[0].(string)
	o.mu.Lock()
	_, seen := o.scanned[name]
	o.mu.Unlock()
	if !seen {
		n, err := o.examined(ctx, d.SQL, d.Args)
		o.mu.Lock()
		o.scanned[name] = n
		if err != nil && o.err == nil {
			o.err = err
		}
		o.mu.Unlock()
	}
	return context.WithValue(ctx, openRunsKey{}, name)
}

func (o *openRunsTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	name, ok := ctx.Value(openRunsKey{}).(string)
	if !ok || d.Err != nil {
		return
	}
	o.mu.Lock()
	o.maxRows[name] = max(o.maxRows[name], d.CommandTag.RowsAffected())
	o.mu.Unlock()
}

// examined runs EXPLAIN ANALYZE of sql and sums, over its plan's scans, the
// rows each returned and the rows its filter removed.
func (o *openRunsTracer) examined(ctx context.Context, sql string, args []any) (int64, error) {
	var out []byte
	if err := o.explain.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		return 0, err
	}
	var plans []struct{ Plan map[string]any }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		return 0, fmt.Errorf("EXPLAIN output %s: %v", out, err)
	}
	var walk func(n map[string]any) int64
	walk = func(n map[string]any) int64 {
		num := func(k string) float64 { f, _ := n[k].(float64); return f }
		var sum int64
		if typ, _ := n["Node Type"].(string); strings.HasSuffix(typ, "Scan") {
			sum = int64(num("Actual Rows")*max(num("Actual Loops"), 1) + num("Rows Removed by Filter"))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				sum += walk(m)
			}
		}
		return sum
	}
	return walk(plans[0].Plan), nil
}

// A backlog of pending runs (here backfilled; a long catch-up is the same)
// is worked off at a cost per run that does not grow with it: each pass of
// the runner reads a few of the oldest pending runs, not all of them, and
// the server finds the schedule's running and retrying runs without
// stepping over its pending ones. Each of the 2,000 runs still runs once,
// oldest first. Before, every pass read the whole backlog: working off n
// instants cost time quadratic in n (measured: 214 runs/s at 1,600 against
// 476 at 50).
func TestBacklogReadInPieces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	tr := &openRunsTracer{explain: db.Pool, maxRows: map[string]int64{}, scanned: map[string]int64{}}
	pool := tracedPool(t, db, tr)

	for _, lease := range []bool{false, true} {
		s, err := New(pool, Config{Holder: fmt.Sprintf("lease=%v", lease), LeaseLocks: lease, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		sizes := map[string]int{}
		var mu sync.Mutex
		var order []time.Time
		ran := map[string]int{}
		for _, n := range []int{40, 2000} {
			name := fmt.Sprintf("backlog-%d-lease-%v", n, lease)
			sizes[name] = n
			job := func(_ context.Context, r Run) error {
				mu.Lock()
				defer mu.Unlock()
				ran[r.Schedule]++
				if r.Schedule == name && n == 2000 {
					order = append(order, r.Instant)
				}
				return nil
			}
			if err := s.Register(ctx, Definition{Name: name, Spec: "0 0 1 1 *", Version: 1}, job); err != nil {
				t.Fatal(err)
			}
			now := dbNow(t, db.Pool)
			res, err := s.Backfill(ctx, name, BackfillOptions{From: now.AddDate(-n-1, 0, 0), To: now, Max: n})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Instants) != n {
				t.Fatalf("%s: backfilled %d instants, want %d", name, len(res.Instants), n)
			}
		}
		if _, err := db.Pool.Exec(ctx, "ANALYZE pgclaim_schedule_runs"); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Run(rctx) }()
		waitFor(t, 2*time.Minute, "every backfilled run to run", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for name, n := range sizes {
				if ran[name] < n {
					return false
				}
			}
			return true
		})
		cancel()
		<-done

		tr.mu.Lock()
		if tr.err != nil {
			t.Fatal(tr.err)
		}
		for name, n := range sizes {
			if ran[name] != n {
				t.Errorf("%s: %d runs, want %d (each backfilled instant once)", name, ran[name], n)
			}
			if got := tr.maxRows[name]; got > pendingRead+2 {
				t.Errorf("%s: a pass read %d open runs of a backlog of %d; want at most %d", name, got, n, pendingRead+2)
			}
			if got := tr.scanned[name]; got > 3*pendingRead {
				t.Errorf("%s: the server examined %d rows to read the open runs of a backlog of %d; want at most %d", name, got, n, 3*pendingRead)
			}
		}
		tr.mu.Unlock()
		for i := 1; i < len(order); i++ {
			if !order[i].After(order[i-1]) {
				t.Fatalf("lease=%v: run %d of %s started before run %d of %s: the backlog must run oldest first", lease, i, order[i], i-1, order[i-1])
			}
		}
		for name := range sizes {
			for _, r := range runsOf(t, db.Pool, name) {
				if r.State != stateSucceeded || r.Attempt != 1 {
					t.Fatalf("%s %s: state %s attempt %d, want succeeded at attempt 1", name, r.Instant, r.State, r.Attempt)
				}
			}
		}
	}
}

// A pending run further back than the runner reads, but the oldest that can
// start (the ones before it wait for their jittered start), still starts
// first, at once.
func TestBacklogOldestReadyBeyondTheRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "a", Config{}, nil)
	first := make(chan time.Time, 1)
	if err := in.s.Register(ctx, Definition{Name: "deep", Spec: "0 0 1 1 *", Version: 1}, func(_ context.Context, r Run) error {
		select {
		case first <- r.Instant:
		default:
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, db.Pool)
	n := 3 * pendingRead
	res, err := in.s.Backfill(ctx, "deep", BackfillOptions{From: now.AddDate(-n-1, 0, 0), To: now, Max: n})
	if err != nil {
		t.Fatal(err)
	}
	// The oldest 2·pendingRead wait an hour; the next can start now.
	wait := res.Instants[2*pendingRead-1]
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedule_runs SET start_after = now() + interval '1 hour'
		WHERE schedule = 'deep' AND instant <= $1`, wait); err != nil {
		t.Fatal(err)
	}
	in.start(t)
	select {
	case got := <-first:
		if want := res.Instants[2*pendingRead]; !got.Equal(want) {
			t.Fatalf("first run: %s, want %s (the oldest that can start)", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no run started within 30s")
	}
}
