package pgprobe_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

func TestAdvisoryProbe(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), pg_advisory_lock(-7, 9), pg_advisory_lock(4242)`).Scan(&pid, nil, nil); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	for _, c := range []struct {
		s    pgprobe.State
		key  []pgprobe.Key
		want int
	}{
		{pgprobe.Any, nil, 2},
		{pgprobe.Granted, nil, 2},
		{pgprobe.Waiting, nil, 0},
		{pgprobe.Granted, []pgprobe.Key{pgprobe.Pair(-7, 9)}, 1},
		{pgprobe.Granted, []pgprobe.Key{pgprobe.Pair(9, -7)}, 0},
		{pgprobe.Granted, []pgprobe.Key{pgprobe.Single(4242)}, 1},
		{pgprobe.Granted, []pgprobe.Key{pgprobe.Pair(0, 4242)}, 0}, // objsubid differs
	} {
		n, err := pgprobe.CountAdvisory(ctx, db.Pool, c.s, c.key...)
		if err != nil || n != c.want {
			t.Errorf("CountAdvisory(%v, %v) = %d, %v; want %d", c.s, c.key, n, err, c.want)
		}
	}
	for _, k := range []pgprobe.Key{pgprobe.Pair(-7, 9), pgprobe.Single(4242)} {
		if got, err := pgprobe.AdvisoryHolder(ctx, db.Pool, k); err != nil || got != pid {
			t.Errorf("AdvisoryHolder(%v) = %d, %v; want %d", k, got, err, pid)
		}
	}
}

func TestProxyRewritesPID(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	for _, rewrite := range []bool{false, true} {
		pool, err := pgxpool.NewWithConfig(ctx, pgprobe.ProxyConfig(t, db.Pool, rewrite, nil))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid uint32
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if announced := conn.Conn().PgConn().PID(); (announced != pid) != rewrite {
			t.Errorf("rewritePID %v: announced pid %d, backend pid %d", rewrite, announced, pid)
		}
		conn.Release()
		pool.Close()
	}
}
