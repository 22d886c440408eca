package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// A leader whose lock session is terminated closes its term without
// opening a connection: the pool it was built with may hold none idle (its
// lock session was taken out of it), and a connect would hold up the
// standby, which waits for the close, by the server's time to start a
// backend.
func TestElectorLostTermClosedWithoutConnect(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	srv := pgtest.Shared(t)
	ctx := context.Background()
	pool := db.NewPool(t)
	leader := newElector(t, pool, "closer", "leader", gate.ElectorConfig{TTL: 2 * time.Second})
	lctx, err := leader.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the leader settles in its term
	before := pool.Stat().NewConnsCount()
	pid, err := electionHolderPID(ctx, db.Pool, "closer")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(time.Second):
		t.Fatal("leader's context not cancelled within 1s of its backend being terminated")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		terms := checkTerms(t, db.Pool, "closer")
		if len(terms) == 1 && terms[0].EndedAt != nil {
			if *terms[0].EndReason != "lost" {
				t.Fatalf("term = %s; want ended lost", terms[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("term not closed 5s after the leader stepped down: %+v", terms)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if after := pool.Stat().NewConnsCount(); after != before {
		t.Fatalf("closing the lost term opened %d connection(s) in the leader's pool (%d → %d): the standby waited for a connect", after-before, before, after)
	}
}
