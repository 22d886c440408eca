package standbytest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/pgtest"
)

// DB is the database the pair serves.
const DB = "app"

// New starts the pair, creates DB on the primary and migrates it; it
// returns the pair and a pool on the primary, closed when t ends. A test
// writes its own tables through the pool, then waits for the standby with
// Pair.WaitReplayed.
func New(t testing.TB, ctx context.Context) (*pgtest.Pair, *pgxpool.Pool) {
	t.Helper()
	pair := pgtest.NewPair(t, pgtest.PairConfig{})
	admin, err := pgx.Connect(ctx, pair.PrimaryURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+DB)
	_ = admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	primary, err := pgxpool.New(ctx, pair.PrimaryURL(DB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Close)
	if err := pgclaim.Migrate(ctx, primary); err != nil {
		t.Fatal(err)
	}
	return pair, primary
}
