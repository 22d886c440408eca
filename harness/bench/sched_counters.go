package bench

// What the schedules scenario counts: statements per pool, runs per
// instant, the schedulers' events and their log records.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/schedule"
)

// stmtCounter counts the statements a pool sends (a pgx tracer): the
// statement count when pg_stat_statements is not available.
type stmtCounter struct {
	n     atomic.Int64
	trace *traceFile
	inst  int
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	if c.trace != nil {
		return c.trace.start(ctx, d)
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if c.trace != nil {
		c.trace.end(ctx, c.inst, d)
	}
}

// schedInstance is one instance of the service: its own pool, and a
// scheduler or a gate on it.
type schedInstance struct {
	pool  *pgxpool.Pool
	count *stmtCounter
}

func openCountedPool(ctx context.Context, url string, n int) (*schedInstance, error) {
	c := &stmtCounter{}
	p, err := openTracedPool(ctx, url, n, c)
	if err != nil {
		return nil, err
	}
	return &schedInstance{pool: p, count: c}, nil
}

// schedRuns records every call of a job: (schedule, instant) → fences.
type schedRuns struct {
	mu    sync.Mutex
	calls map[string][]int64
	n     atomic.Int64
}

func newSchedRuns() *schedRuns { return &schedRuns{calls: map[string][]int64{}} }

func runKey(name string, at time.Time) string { return name + "@" + at.UTC().Format(time.RFC3339Nano) }

func (s *schedRuns) add(name string, at time.Time, fence int64) {
	s.mu.Lock()
	k := runKey(name, at)
	s.calls[k] = append(s.calls[k], fence)
	s.mu.Unlock()
	s.n.Add(1)
}

// callsWith counts the job's calls for (name, at) with fence.
func (s *schedRuns) callsWith(name string, at time.Time, fence int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.calls[runKey(name, at)] {
		if f == fence {
			n++
		}
	}
	return n
}

// dups is the number of job calls beyond the first for one instant.
func (s *schedRuns) dups() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, f := range s.calls {
		n += int64(len(f) - 1)
	}
	return n
}

// schedEvents counts the scheduler's events by kind.
type schedEvents struct {
	mu sync.Mutex
	n  map[schedule.EventKind]int64
}

func (c *schedEvents) Observe(_ context.Context, e schedule.Event) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[schedule.EventKind]int64{}
	}
	c.n[e.Kind]++
	c.mu.Unlock()
}

func (c *schedEvents) get(k schedule.EventKind) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// logCount counts the records at warn level and above that reach it, by
// message and the start of their error: the scenario reports them instead
// of printing thousands of lines.
type logCount struct {
	mu *sync.Mutex
	n  map[string]int64
}

func newLogCount() *logCount { return &logCount{mu: &sync.Mutex{}, n: map[string]int64{}} }

func (c *logCount) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (c *logCount) Handle(_ context.Context, r slog.Record) error {
	k := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			k += ": " + firstLine(a.Value.String())
			return false
		}
		return true
	})
	c.mu.Lock()
	c.n[k]++
	c.mu.Unlock()
	return nil
}

func (c *logCount) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCount) WithGroup(string) slog.Handler      { return c }

// rows returns the counted records, most frequent first.
func (c *logCount) rows() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	type kv struct {
		k string
		n int64
	}
	var all []kv
	for k, n := range c.n {
		all = append(all, kv{k, n})
	}
	slices.SortFunc(all, func(a, b kv) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.k, b.k)) })
	out := make([][]string, 0, len(all))
	for _, x := range all {
		out = append(out, []string{fmt.Sprintf("%d", x.n), x.k})
	}
	return out
}

// first is the most frequent record counted, as "; logged: …" ("" for
// none).
func (c *logCount) first() string {
	if rows := c.rows(); len(rows) > 0 {
		return "; logged: " + strings.Join(rows[0], " × ")
	}
	return ""
}
