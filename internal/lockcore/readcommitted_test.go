package lockcore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
	rc := ReadCommitted{Pool: pool}
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

// A statement sent plain, on a connection whose session default was read
// committed when the gate asked, but was changed since, fails with a
// serialization failure where it meets a concurrent change: it is sent
// again in a READ COMMITTED transaction (the failure changed nothing), and
// so is every later statement on that connection.
func TestReadCommittedAfterSessionChange(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	pool := db.NewPool(t)
	rc := ReadCommitted{Pool: pool}
	if _, err := rc.Exec(ctx, "CREATE TABLE rc_row (id int PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Exec(ctx, "INSERT INTO rc_row VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	// The pool's one connection, asked already, now defaults to repeatable read.
	if _, err := pool.Exec(ctx, "SET default_transaction_isolation = 'repeatable read'"); err != nil {
		t.Fatal(err)
	}
	other := db.NewPool(t)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "UPDATE rc_row SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		var n int
		err := rc.QueryRow(ctx, "UPDATE rc_row SET n = n + 10 WHERE id = 1 RETURNING n").Scan(&n)
		if err == nil && n != 11 {
			err = fmt.Errorf("n = %d after the update; want 11", n)
		}
		res <- err
	}()
	waitLockWait(t, db.Pool, backend)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("update after a concurrent change: %v; want it re-run at read committed", err)
	}
	var iso string
	if err := rc.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "read committed" {
		t.Fatalf("the next statement ran at %q (%v); want read committed", iso, err)
	}
}

// waitLockWait waits until backend waits for a lock.
func waitLockWait(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, backend int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(context.Background(), "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", backend).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited for the row", backend)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Query through ReadCommitted, on a connection defaulting to serializable
// (wrapped) and to read committed (plain): the rows come back, a
// set-returning update is committed once they are read, a failing
// statement returns its error, and the connection goes back to the pool
// idle every time.
func TestReadCommittedQuery(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"serializable", "read committed"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			ctx := context.Background()
			if _, err := db.Pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_isolation = '"+level+"'"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE rc_set (id int PRIMARY KEY, n int NOT NULL); INSERT INTO rc_set SELECT g, 0 FROM generate_series(1, 3) g"); err != nil {
				t.Fatal(err)
			}
			pool := db.NewPool(t)
			rc := ReadCommitted{Pool: pool}
			rows, err := rc.Query(ctx, "UPDATE rc_set SET n = n + 1 RETURNING id, current_setting('transaction_isolation')")
			if err != nil {
				t.Fatal(err)
			}
			var ids []int
			for rows.Next() {
				var id int
				var iso string
				if err := rows.Scan(&id, &iso); err != nil {
					t.Fatal(err)
				}
				if iso != "read committed" {
					t.Fatalf("row %d read at %q; want read committed", id, iso)
				}
				ids = append(ids, id)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if len(ids) != 3 {
				t.Fatalf("%d rows, want 3", len(ids))
			}
			var sum int
			if err := db.Pool.QueryRow(ctx, "SELECT sum(n) FROM rc_set").Scan(&sum); err != nil || sum != 3 {
				t.Fatalf("sum %d (%v) after the update; want 3, committed", sum, err)
			}
			rows, err = rc.Query(ctx, "SELECT 1/(id - 2) FROM rc_set ORDER BY id")
			if err == nil {
				for rows.Next() {
				}
				err = rows.Err()
				rows.Close()
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
				t.Fatalf("failing query: %v; want division_by_zero", err)
			}
			if s := pool.Stat(); s.TotalConns() != 1 || s.IdleConns() != 1 {
				t.Errorf("pool: %d connections, %d idle; want the one connection reused and idle", s.TotalConns(), s.IdleConns())
			}
			if _, err := rc.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatalf("the connection after the failure: %v", err)
			}
		})
	}
}
