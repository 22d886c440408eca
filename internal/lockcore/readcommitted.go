package lockcore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statements through the pool at READ COMMITTED. pgclaim's statements rely
// on READ COMMITTED semantics: an UPDATE ... WHERE or INSERT ... ON
// CONFLICT that meets a row changed by a concurrent transaction re-checks
// it against the newest version, where REPEATABLE READ and SERIALIZABLE
// fail with SQLSTATE 40001 instead. ReadCommitted runs each statement as
// its own transaction at that level, whatever default_transaction_isolation
// the database, role or pool sets:
//
//   - on a connection whose session default is READ COMMITTED (asked once
//     per connection, the first time it is used here) the statement is
//     sent as it is: one plain round trip;
//   - on any other, it is sent in an explicit READ COMMITTED transaction,
//     BEGIN, statement and COMMIT as one batch: one round trip too, and
//     still one transaction per statement, so it keeps working behind a
//     transaction-pooling PgBouncer.
//
// A plain statement that fails with a serialization failure (the session's
// default was changed since it was asked; a statement failing so changed
// nothing) is sent again that way when it returns at most a row (Exec,
// QueryRow), and every later statement on that connection is wrapped. A
// set-returning statement (Query) that fails so returns the error (its rows
// may have been read already); the later ones are wrapped.

// ReadCommitted is a store.DBTX running each statement through Pool as its
// own READ COMMITTED transaction (see above).
type ReadCommitted struct{ Pool *pgxpool.Pool }

const (
	beginReadCommitted = "BEGIN ISOLATION LEVEL READ COMMITTED"
	commit             = "COMMIT"
	// rcKey marks, in a pool connection's CustomData, whether its
	// session's default isolation is read committed.
	rcKey = "pgclaim.read_committed"
)

// serializationFailure reports SQLSTATE 40001: the statement ran at
// REPEATABLE READ or SERIALIZABLE, met a concurrent change, and was rolled
// back.
func serializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

// acquire takes a connection from the pool and reports whether its
// session's default isolation is read committed (asked on its first use).
func (r ReadCommitted) acquire(ctx context.Context) (*pgxpool.Conn, bool, error) {
	c, err := r.Pool.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	data := c.Conn().PgConn().CustomData()
	if rc, ok := data[rcKey].(bool); ok {
		return c, rc, nil
	}
	var iso string
	if err := c.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&iso); err != nil {
		c.Release()
		return nil, false, err
	}
	data[rcKey] = iso == "read committed"
	return c, iso == "read committed", nil
}

// wrapFromNow marks c's session as not read committed by default.
func wrapFromNow(c *pgxpool.Conn) { c.Conn().PgConn().CustomData()[rcKey] = false }

// send sends BEGIN, the statement and COMMIT as one batch on c, which it
// releases on error.
func send(ctx context.Context, c *pgxpool.Conn, sql string, args []any) (pgx.BatchResults, error) {
	return sendEnded(ctx, c, sql, args, commit)
}

// sendEnded sends BEGIN, the statement and end (COMMIT or ROLLBACK) as one
// batch on c, which it releases on error.
func sendEnded(ctx context.Context, c *pgxpool.Conn, sql string, args []any, end string) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue(beginReadCommitted)
	b.Queue(sql, args...)
	b.Queue(end)
	br := c.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		done(ctx, c, br)
		return nil, err
	}
	return br, nil
}

// done closes the batch and releases the connection; a transaction an error
// left open (aborted) is rolled back first (with ctx's values, even after
// ctx ended), so the connection goes back to the pool clean (the pool would
// otherwise close it).
func done(ctx context.Context, c *pgxpool.Conn, br pgx.BatchResults) error {
	err := br.Close()
	if pc := c.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		ctx, cancel := ReleaseContext(ctx)
		_, _ = c.Exec(ctx, "ROLLBACK")
		cancel()
	}
	c.Release()
	return err
}

func (r ReadCommitted) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, rc, err := r.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if rc {
		tag, err := c.Exec(ctx, sql, args...)
		if !serializationFailure(err) {
			c.Release()
			return tag, err
		}
		wrapFromNow(c)
	}
	br, err := send(ctx, c, sql, args)
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

func (r ReadCommitted) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return rcRow{r: r, ctx: ctx, sql: sql, args: args}
}

// Query runs a set-returning statement. Its connection goes back to the
// pool when the rows are closed; wrapped, the transaction is committed once
// the last row has been read (Next returning false), and a failed commit is
// the rows' Err.
func (r ReadCommitted) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, rc, err := r.acquire(ctx)
	if err != nil {
		return nil, err
	}
	if rc {
		rows, err := c.Query(ctx, sql, args...)
		if err != nil {
			if serializationFailure(err) {
				wrapFromNow(c)
			}
			c.Release()
			return nil, err
		}
		return &plainRows{Rows: rows, c: c}, nil
	}
	br, err := send(ctx, c, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		// The statement failed: COMMIT is not reached; the batch is closed
		// and an aborted transaction rolled back.
		done(ctx, c, br)
		return nil, err
	}
	return &batchRows{Rows: rows, ctx: ctx, c: c, br: br}, nil
}

// plainRows are the rows of a plain statement; closing them releases the
// connection.
type plainRows struct {
	pgx.Rows
	c *pgxpool.Conn
}

func (p *plainRows) Close() {
	if p.c == nil {
		return
	}
	p.Rows.Close()
	if serializationFailure(p.Rows.Err()) {
		wrapFromNow(p.c)
	}
	p.c.Release()
	p.c = nil
}

// batchRows are the rows of a statement sent between BEGIN and COMMIT; the
// batch is ended (COMMIT read, the connection released) after the last row
// or on Close, whichever comes first.
type batchRows struct {
	pgx.Rows
	ctx   context.Context
	c     *pgxpool.Conn
	br    pgx.BatchResults
	ended bool
	err   error
}

func (b *batchRows) Next() bool {
	if b.ended {
		return false
	}
	if b.Rows.Next() {
		return true
	}
	b.end()
	return false
}

func (b *batchRows) end() {
	if b.ended {
		return
	}
	b.ended = true
	b.Rows.Close()
	b.err = b.Rows.Err()
	if b.err == nil {
		_, b.err = b.br.Exec()
	}
	if derr := done(b.ctx, b.c, b.br); b.err == nil {
		b.err = derr
	}
}

func (b *batchRows) Close() { b.end() }

func (b *batchRows) Err() error {
	if b.ended {
		return b.err
	}
	return b.Rows.Err()
}

// rcRow sends its statement when scanned.
type rcRow struct {
	r    ReadCommitted
	ctx  context.Context
	sql  string
	args []any
}

func (q rcRow) Scan(dest ...any) error {
	c, rc, err := q.r.acquire(q.ctx)
	if err != nil {
		return err
	}
	if rc {
		err := c.QueryRow(q.ctx, q.sql, q.args...).Scan(dest...)
		if !serializationFailure(err) {
			c.Release()
			return err // pgx.ErrNoRows stays comparable
		}
		wrapFromNow(c)
	}
	br, err := send(q.ctx, c, q.sql, q.args)
	if err != nil {
		return err
	}
	return scanEnded(q.ctx, c, br, dest)
}

// scanEnded scans the row of a batch's statement into dest, reads the
// batch's end and releases c. pgx.ErrNoRows is returned as it is, so it
// stays comparable.
func scanEnded(ctx context.Context, c *pgxpool.Conn, br pgx.BatchResults, dest []any) error {
	err := br.QueryRow().Scan(dest...)
	if err == nil {
		_, err = br.Exec()
	}
	derr := done(ctx, c, br)
	if err != nil {
		return err
	}
	return derr
}

// RolledBack is a store.DBTX for probes: it sends each statement through
// pool in a READ COMMITTED transaction that is always rolled back, BEGIN,
// the statement and ROLLBACK as one batch (one round trip), so nothing it
// writes is ever committed. Only QueryRow is supported.
type RolledBack struct{ Pool *pgxpool.Pool }

const rollback = "ROLLBACK"

var errProbeOnly = errors.New("pgclaim: a probe runs one row-returning statement only")

func (r RolledBack) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errProbeOnly
}

func (r RolledBack) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errProbeOnly
}

func (r RolledBack) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return probeRow{r: r, ctx: ctx, sql: sql, args: args}
}

// probeRow sends its statement when scanned.
type probeRow struct {
	r    RolledBack
	ctx  context.Context
	sql  string
	args []any
}

func (q probeRow) Scan(dest ...any) error {
	c, err := q.r.Pool.Acquire(q.ctx)
	if err != nil {
		return err
	}
	br, err := sendEnded(q.ctx, c, q.sql, q.args, rollback)
	if err != nil {
		return err
	}
	return scanEnded(q.ctx, c, br, dest)
}
