package claim

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
)

// stmtTracer records when each statement on a pool started and ended.
type stmtTracer struct {
	mu       sync.Mutex
	next     int
	inflight map[int]tracedStmt
	ended    []tracedStmt
}

type tracedStmt struct {
	sql        string
	start, end time.Time
}

type stmtKey struct{}

func (s *stmtTracer) begin(ctx context.Context, sql string) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight == nil {
		s.inflight = map[int]tracedStmt{}
	}
	s.next++
	s.inflight[s.next] = tracedStmt{sql: strings.Join(strings.Fields(sql), " "), start: time.Now()}
	return context.WithValue(ctx, stmtKey{}, s.next)
}

func (s *stmtTracer) finish(ctx context.Context) {
	id, ok := ctx.Value(stmtKey{}).(int)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.inflight[id]
	delete(s.inflight, id)
	st.end = time.Now()
	s.ended = append(s.ended, st)
}

func (s *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return s.begin(ctx, d.SQL)
}
func (s *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	s.finish(ctx)
}
func (s *stmtTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var sql []string
	for _, q := range d.Batch.QueuedQueries {
		sql = append(sql, q.SQL)
	}
	return s.begin(ctx, "batch: "+strings.Join(sql, "; "))
}
func (*stmtTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *stmtTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	s.finish(ctx)
}

// hanging lists the statements started before since that had not ended at
// at, with how long they ran.
func (s *stmtTracer) hanging(since, at time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, st := range s.inflight {
		if st.start.Before(since) {
			out = append(out, fmt.Sprintf("%.60s (running %v)", st.sql, at.Sub(st.start).Round(time.Millisecond)))
		}
	}
	for _, st := range s.ended {
		if st.start.Before(since) && st.end.After(at) {
			out = append(out, fmt.Sprintf("%.60s (ran %v)", st.sql, st.end.Sub(st.start).Round(time.Millisecond)))
		}
	}
	sort.Strings(out)
	return out
}

// longestSince returns the longest a statement in flight at or started
// after since took (or has taken, by now).
func (s *stmtTracer) longestSince(since time.Time) (time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	var what string
	see := func(st tracedStmt, end time.Time) {
		if end.After(since) && end.Sub(st.start) > d {
			d, what = end.Sub(st.start), st.sql
		}
	}
	for _, st := range s.ended {
		see(st, st.end)
	}
	now := time.Now()
	for _, st := range s.inflight {
		see(st, now)
	}
	return d, what
}

// TestSilentNetworkWorker: the network between a Worker and the server goes
// silent while it works on two claims: row 1's work runs until its context
// ends, row 2's work returns just after the silence, so its in-transaction
// finish meets it. Another worker, connected directly, claims the rows as
// soon as their leases let it. The silent worker must have stopped
// processing each row (row 1's work cancelled, row 2's finish returned)
// before the other claims it, and every statement it had sent must have
// returned by then; once stopped, its Run returns.
func TestSilentNetworkWorker(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 2)
	cfg, bh := pgprobe.BlackholeConfig(t, db.Pool)
	tr := &stmtTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(bh.Cut) // first: what still waits on the silent network fails

	const lease = 2 * time.Second
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "silent", Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	silenced := make(chan struct{})
	started := make(chan int64, 2)
	var mu sync.Mutex
	stopped := map[int64]time.Time{} // row 1: work cancelled; row 2: work returned (its finish follows)
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 2, Concurrency: 2,
		PollInterval: 50 * time.Millisecond, SkipVerify: true,
		Work: func(ctx context.Context, _ pgx.Tx, cl Claim[int64]) error {
			started <- cl.Key
			if cl.Key == 1 {
				<-ctx.Done()
				mu.Lock()
				stopped[1] = time.Now()
				mu.Unlock()
				return ctx.Err()
			}
			select {
			case <-silenced:
			case <-ctx.Done():
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	type result struct {
		st  Stats
		err error
		at  time.Time
	}
	ran := make(chan result, 1)
	go func() {
		st, err := w.Run(runCtx)
		ran <- result{st, err, time.Now()}
	}()
	for range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the worker did not start both claims")
		}
	}
	time.Sleep(lease/3 + lease/10) // just after a heartbeat
	silentAt := time.Now()
	bh.Silence()
	close(silenced)

	// The other instance sweeps expired leases back and claims what it
	// can, every 10 ms.
	other, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "direct", Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	sweeper, err := NewSweeper(other, SweeperConfig[int64]{Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 10}, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	claimedAt := map[int64]time.Time{}
	limit := time.Now().Add(20 * time.Second)
	for len(claimedAt) < 2 {
		if _, err := sweeper.Sweep(context.Background()); err != nil {
			t.Fatalf("direct sweep: %v", err)
		}
		cls, err := other.ClaimBatch(context.Background(), 2)
		if err != nil {
			t.Fatalf("direct claim: %v", err)
		}
		for _, cl := range cls {
			claimedAt[cl.Key] = time.Now()
		}
		if time.Now().After(limit) {
			t.Fatalf("the direct worker claimed only %v within 20 s", claimedAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
	first := claimedAt[1]
	if claimedAt[2].Before(first) {
		first = claimedAt[2]
	}
	mu.Lock()
	cancelled := stopped[1]
	mu.Unlock()
	// Every statement sent while the worker still counted its claims held
	// (before row 1's work was cancelled; after it only the rollbacks
	// follow) must have returned by the time another worker claims a row.
	sentBefore := cancelled
	if sentBefore.IsZero() || sentBefore.After(first) {
		sentBefore = first
	}
	hanging := tr.hanging(sentBefore, first)
	longest, what := tr.longestSince(silentAt)
	t.Logf("row 1: work cancelled %v after the network went silent, claimed by the other worker %v after; row 2 claimed %v after; longest statement of the silent worker since the silence: %v (%.60s)",
		sinceOrNever(cancelled, silentAt), claimedAt[1].Sub(silentAt).Round(time.Millisecond), claimedAt[2].Sub(silentAt).Round(time.Millisecond),
		longest.Round(time.Millisecond), what)
	if cancelled.IsZero() || !cancelled.Before(claimedAt[1]) {
		t.Errorf("row 1 was claimed elsewhere %v after the network went silent while its work still ran (cancelled: %v)",
			claimedAt[1].Sub(silentAt).Round(time.Millisecond), sinceOrNever(cancelled, silentAt))
	}
	if len(hanging) > 0 {
		t.Errorf("statements of the silent worker still running when another worker claimed its rows (%v after the silence): %v",
			first.Sub(silentAt).Round(time.Millisecond), hanging)
	}

	stop()
	select {
	case r := <-ran:
		t.Logf("the silent worker's Run returned %v after the silence: %+v, %v", r.at.Sub(silentAt).Round(time.Millisecond), r.st, r.err)
		if r.st.Succeeded != 0 {
			t.Errorf("the silent worker counted %d rows succeeded; none could commit", r.st.Succeeded)
		}
	case <-time.After(20 * time.Second):
		longest, what := tr.longestSince(silentAt)
		t.Fatalf("the silent worker's Run did not return within 20 s of its stop; longest statement: %v (%.60s)", longest.Round(time.Millisecond), what)
	}
}

// sinceOrNever formats at - since, or "never" for a zero at.
func sinceOrNever(at, since time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(since).Round(time.Millisecond).String()
}
