package gate

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/pgtest"
)

// A statement that fails inside readCommitted's BEGIN/COMMIT batch returns
// its own error and leaves the connection idle, back in the pool, rather
// than in an aborted transaction; a statement that succeeds is committed at
// read committed.
func TestReadCommittedBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_isolation = 'serializable'"); err != nil {
		t.Fatal(err)
	}
	pool := db.NewPool(t)
	rc := readCommitted{pool}
	var pgErr *pgconn.PgError
	if _, err := rc.Exec(ctx, "SELECT 1/0"); !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("Exec: %v; want division_by_zero", err)
	}
	var iso string
	if err := rc.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "read committed" {
		t.Fatalf("isolation %q, %v; want read committed", iso, err)
	}
	var n int
	if err := rc.QueryRow(ctx, "SELECT 1 WHERE false").Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("no row: %v; want pgx.ErrNoRows", err)
	}
	if _, err := rc.Exec(ctx, "CREATE TABLE rc_probe (x int)"); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM rc_probe").Scan(&n); err != nil {
		t.Fatalf("the committed statement is not visible: %v", err)
	}
	if s := pool.Stat(); s.TotalConns() != 1 || s.IdleConns() != 1 {
		t.Errorf("pool: %d connections, %d idle; want the one connection reused and idle", s.TotalConns(), s.IdleConns())
	}
}
