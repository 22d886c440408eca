package gate_test

import (
	"context"
	"fmt"
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

// BenchmarkExclusiveVsAdvisory: Exclusive with an empty job and a bare
// pg_try_advisory_lock + pg_advisory_unlock cycle on a dedicated connection,
// side by side (see sideBySide).
func BenchmarkExclusiveVsAdvisory(b *testing.B) {
	db := pgtest.NewDatabase(b)
	g := newGate(b, db.Pool, "bench", gate.Config{})
	conn := dedicated(b, db.Pool)
	ctx := context.Background()
	sideBySide(b, "exclusive", func(int) error { return g.Exclusive(ctx, "job", noop) }, "advisory", func(int) error {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(1, 2)").Scan(&ok); err != nil || !ok {
			return fmt.Errorf("lock: %v %v", ok, err)
		}
		if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock(1, 2)").Scan(&ok); err != nil || !ok {
			return fmt.Errorf("unlock: %v %v", ok, err)
		}
		return nil
	})
}
