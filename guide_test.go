package pgclaim_test

import (
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
)

// The getting-started guide's line for tests that should use Docker.
import _ "github.com/pgclaim/pgclaim/pgtest/pgcontainer"

// TestMyJob is the test docs/getting-started.md shows.
func TestMyJob(t *testing.T) {
	db := pgtest.NewDatabase(t) // fresh database with pgclaim's schema
	pool := db.Pool             // *pgxpool.Pool, closed and dropped when the test ends
	_ = pool
}
