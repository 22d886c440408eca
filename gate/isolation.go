package gate

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Isolation. pgclaim's statements rely on READ COMMITTED semantics: an
// UPDATE ... WHERE or INSERT ... ON CONFLICT that meets a row changed by a
// concurrent transaction re-checks it against the newest version, where
// REPEATABLE READ and SERIALIZABLE fail with SQLSTATE 40001 instead. Every
// statement the gate runs is therefore run at READ COMMITTED, whatever
// default_transaction_isolation the database, role or pool sets:
//
//   - on the gate's dedicated lock connections (never returned to the pool)
//     the session default is set to read committed once, when the
//     connection is prepared (SessionSetup), at no cost per statement;
//   - through the pool, each statement runs in its own explicit READ
//     COMMITTED transaction, BEGIN, statement and COMMIT sent as one batch:
//     one round trip, as before, and still one transaction per statement,
//     so the Lease keeps working behind a transaction-pooling PgBouncer.

// readCommitted is a store.DBTX running each statement through pool in its
// own READ COMMITTED transaction, in one round trip.
type readCommitted struct{ pool *pgxpool.Pool }

const (
	beginReadCommitted = "BEGIN ISOLATION LEVEL READ COMMITTED"
	commit             = "COMMIT"
)

// send acquires a connection and sends BEGIN, the statement and COMMIT as
// one batch.
func (r readCommitted) send(ctx context.Context, sql string, args []any) (*pgxpool.Conn, pgx.BatchResults, error) {
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	b := &pgx.Batch{}
	b.Queue(beginReadCommitted)
	b.Queue(sql, args...)
	b.Queue(commit)
	br := c.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		done(ctx, c, br)
		return nil, nil, err
	}
	return c, br, nil
}

// done closes the batch and releases the connection; a transaction an error
// left open (aborted) is rolled back first (with ctx's values, even after
// ctx ended), so the connection goes back to the pool clean (the pool would
// otherwise close it).
func done(ctx context.Context, c *pgxpool.Conn, br pgx.BatchResults) error {
	err := br.Close()
	if pc := c.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		ctx, cancel := releaseCtx(ctx)
		_, _ = c.Exec(ctx, "ROLLBACK")
		cancel()
	}
	c.Release()
	return err
}

func (r readCommitted) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, br, err := r.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if derr := done(ctx, c, br); err == nil {
		err = derr
	}
	return tag, err
}

func (r readCommitted) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, br, err := r.send(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return &rcRow{ctx: ctx, c: c, br: br}
}

// Query is not used by the gate's statements through the pool (none
// returns a set); it runs the statement at the pool's own isolation.
func (r readCommitted) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return r.pool.Query(ctx, sql, args...)
}

// rcRow scans the statement's row, then reads the COMMIT's result.
type rcRow struct {
	ctx context.Context
	c   *pgxpool.Conn
	br  pgx.BatchResults
}

func (r *rcRow) Scan(dest ...any) error {
	err := r.br.QueryRow().Scan(dest...)
	if err == nil {
		_, err = r.br.Exec()
	}
	derr := done(r.ctx, r.c, r.br)
	if err != nil {
		return err // pgx.ErrNoRows stays comparable
	}
	return derr
}

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }
