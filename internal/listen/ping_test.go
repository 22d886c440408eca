package listen

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/pgtest"
)

// The listening session's ping is no transaction on the server: 50 of them
// add nothing to the database's transaction count, where pgx's Ping (an
// empty statement) adds one each.
func TestPingIsNoTransaction(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reads := 0
	xacts := func() int64 {
		reads++
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	pings := func(p func(context.Context, *pgx.Conn) error) {
		c, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			if err := p(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.Close(ctx) // a backend's counts reach the view when it ends
	}
	x0 := xacts()
	pings(ping)
	pings(func(ctx context.Context, c *pgx.Conn) error { return c.Ping(ctx) }) // the control: seen once counted
	var d int64
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if d = xacts() - x0; d >= 50 {
			break
		}
	}
	if d < 50 {
		t.Fatalf("50 pgx Pings: %d transactions counted within 20 s; want at least 50", d)
	}
	// d holds the control's 50, at most the reads of the count, and (on
	// PostgreSQL 13) a transaction or two of the two sessions' start; the
	// pings, counted, would add 50.
	if d > int64(50+reads+5) {
		t.Fatalf("50 pings and 50 pgx Pings: %d transactions besides %d reads of the count; want about 50 (the pings none)", d-int64(reads), reads)
	}
	t.Logf("50 pings and 50 pgx Pings: %d transactions, %d reads of the count among them", d, reads)
}
