package bench

// How the latency scenario sees its workers: the tracer that counts their
// statements, claims and pings, and the log of rows inserted and claimed.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// latTracer counts the statements a pool sends, and among them the claim
// statements (ClaimBatch's) and those that claimed nothing; and the pings
// the pool sends before handing out a connection (shouldPing).
type latTracer struct{ all, claims, empty, pings atomic.Int64 }

// shouldPing is pgxpool's default (ping a connection idle over a second),
// counted.
func (t *latTracer) shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	if p.IdleDuration > time.Second {
		t.pings.Add(1)
		return true
	}
	return false
}

type latClaimKey struct{}

// isClaimStatement matches ClaimBatch's statement (claim/sql.go).
func isClaimStatement(sql string) bool {
	return strings.Contains(sql, "pgclaim_c AS (") && strings.Contains(sql, "SKIP LOCKED")
}

func (t *latTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.all.Add(1)
	if isClaimStatement(d.SQL) {
		t.claims.Add(1)
		return context.WithValue(ctx, latClaimKey{}, true)
	}
	return ctx
}

func (t *latTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(latClaimKey{}) != nil && d.Err == nil && d.CommandTag.RowsAffected() == 0 {
		t.empty.Add(1)
	}
}

// latLog records when each row was written and when its work started.
type latLog struct {
	mu      sync.Mutex
	sent    map[int64]time.Time
	started map[int64][]time.Time
	arrived chan struct{}
}

func newLatLog() *latLog {
	return &latLog{sent: map[int64]time.Time{}, started: map[int64][]time.Time{}, arrived: make(chan struct{}, 1)}
}

func (l *latLog) send(id int64, t time.Time) {
	l.mu.Lock()
	l.sent[id] = t
	l.mu.Unlock()
}

func (l *latLog) start(id int64, t time.Time) {
	l.mu.Lock()
	l.started[id] = append(l.started[id], t)
	l.mu.Unlock()
	select {
	case l.arrived <- struct{}{}:
	default:
	}
}

// all reports whether every row of ids was started.
func (l *latLog) all(ids []int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if len(l.started[id]) == 0 {
			return false
		}
	}
	return true
}

// wait waits until every row of ids was started, or d has passed.
func (l *latLog) wait(ctx context.Context, d time.Duration, ids []int64) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for !l.all(ids) {
		select {
		case <-l.arrived:
		case <-t.C:
			return l.all(ids)
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// lags are the start lags of ids (the first start of each).
func (l *latLog) lags(ids []int64) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for _, id := range ids {
		if st := l.started[id]; len(st) > 0 {
			out = append(out, st[0].Sub(l.sent[id]))
		}
	}
	return out
}
