package pgclaim_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

// TestFenceMigration: a database at migration 00004 whose sequence has
// granted many tokens moves to 00005. Every token from pgclaim_fence() is
// above every token granted before; the counter stops with an error at
// 2^48 - 1; the down migration restores bare sequence values; and a
// sequence already past 2^48 - 1 is refused with a message saying why.
func TestFenceMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabaseFrom(t, empty)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS,
		goose.WithTableName(pgclaim.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.UpTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	const granted = 123456789012 // tokens granted by a long-used 00004 database
	if _, err := db.Pool.Exec(ctx, "SELECT setval('pgclaim_fence_seq', $1)", int64(granted)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	var tok, timeline int64
	if err := db.Pool.QueryRow(ctx, `SELECT pgclaim_fence(),
		('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint`).Scan(&tok, &timeline); err != nil {
		t.Fatal(err)
	}
	if want := timeline<<48 + granted + 1; tok != want || tok <= granted {
		t.Fatalf("first token after the migration %d, want %d (timeline %d), above %d", tok, want, timeline, int64(granted))
	}
	// One expression, inlined into the statement: no function call per row.
	checkInlined(ctx, t, db.Pool)

	// The counter's end is an error, not a wrap-around.
	const last = 1<<48 - 1
	if _, err := db.Pool.Exec(ctx, "SELECT setval('pgclaim_fence_seq', $1)", int64(last-1)); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, "SELECT pgclaim_fence()").Scan(&tok); err != nil || tok != timeline<<48+last {
		t.Fatalf("last token %d (%v), want %d", tok, err, timeline<<48+last)
	}
	if err := db.Pool.QueryRow(ctx, "SELECT pgclaim_fence()").Scan(&tok); err == nil || !strings.Contains(err.Error(), "reached maximum value") {
		t.Fatalf("token past the counter's end: %d, %v; want an error", tok, err)
	}

	// Down: bare sequence values again, with no bound of pgclaim's.
	if _, err := p.Down(ctx); err != nil {
		t.Fatal(err)
	}
	var fn *string
	if err := db.Pool.QueryRow(ctx, "SELECT to_regprocedure('pgclaim_fence()')::text").Scan(&fn); err != nil || fn != nil {
		t.Fatalf("pgclaim_fence() after the down migration: %v, %v", fn, err)
	}
	if err := db.Pool.QueryRow(ctx, "SELECT nextval('pgclaim_fence_seq')").Scan(&tok); err != nil || tok != last+1 {
		t.Fatalf("nextval after the down migration: %d, %v; want %d", tok, err, int64(last+1))
	}
	// A sequence past 2^48 - 1 cannot take the timeline: refused.
	if _, err := p.Up(ctx); err == nil || !strings.Contains(err.Error(), "past 2^48 - 1") {
		t.Fatalf("migration over a sequence at %d: %v, want a refusal", tok, err)
	}
}

// checkInlined fails t unless pgclaim_fence() is inlined into the
// statements that call it.
func checkInlined(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	rows, err := pool.Query(ctx, "EXPLAIN (VERBOSE, COSTS OFF) SELECT pgclaim_fence() FROM generate_series(1, 3)")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if text := strings.Join(lines, "\n"); !strings.Contains(text, "nextval") || strings.Contains(text, "pgclaim_fence()") {
		t.Errorf("pgclaim_fence() is not inlined:\n%s", text)
	}
}
