package claim

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
)

// readOnly reports, once until a claim succeeds again, that the worker's
// claims reach a read-only server: a standby, or a writer's address that
// points at a reader for a while after a failover (Aurora, RDS), or a
// standby promoted late. The pool's connections are dropped, so that the
// next claims connect anew and reach the writer once it answers at the
// address, rather than go on using sessions on the reader.
func (r *run[K]) readOnly(ctx context.Context, err error) {
	w := r.w
	if pool, ok := w.c.db.(*pgxpool.Pool); ok {
		pool.Reset()
	}
	if r.onReader {
		return
	}
	r.onReader = true
	w.c.c.report(ctx, Event{}, rec(slog.LevelError,
		"claim: worker: this connection reaches a read-only server (a standby, or the writer's address pointing at a reader after a failover): dropping the pool's connections and claiming again every PollInterval until the writer answers",
		slog.String("table", w.c.c.t.qname), slog.Any("error", err)))
}

// writable notes a claim that succeeded: after readOnly, the writer answers.
func (r *run[K]) writable(ctx context.Context) {
	if !r.onReader {
		return
	}
	r.onReader = false
	r.w.c.c.report(ctx, Event{}, rec(slog.LevelInfo, "claim: worker: the writer answers again", slog.String("table", r.w.c.c.t.qname)))
}
