package pgclaim_test

import (
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
)

// TestMyJob is the test docs/getting-started.md shows.
func TestMyJob(t *testing.T) {
	db := pgtest.NewDatabase(t) // fresh database with pgclaim's schema
	pool := db.Pool             // *pgxpool.Pool, closed and dropped when the test ends
	_ = pool
}
