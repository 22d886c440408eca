package gate_test

import (
	"context"
	"testing"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// BenchmarkExclusive: advisory exclusion alone — try-lock with a fencing
// token, run an empty job under the connection watch, unlock.
func BenchmarkExclusive(b *testing.B) {
	db := pgtest.NewDatabase(b)
	g := newGate(b, db.Pool, "bench", gate.Config{})
	ctx := context.Background()
	cycles(b, func(int) error { return g.Exclusive(ctx, "job", noop) })
}

// BenchmarkExclusiveHeld: the lock is held elsewhere; the cycle is one
// try-lock that fails.
func BenchmarkExclusiveHeld(b *testing.B) {
	db := pgtest.NewDatabase(b)
	holder := dedicated(b, db.Pool)
	class, key := gate.AdvisoryKey("job")
	if _, err := holder.Exec(context.Background(), "SELECT pg_advisory_lock($1, $2)", class, key); err != nil {
		b.Fatal(err)
	}
	g := newGate(b, db.Pool, "bench", gate.Config{})
	ctx := context.Background()
	cycles(b, func(int) error {
		if err := g.Exclusive(ctx, "job", noop); err == nil {
			b.Fatal("ran while the lock was held")
		}
		return nil
	})
}
