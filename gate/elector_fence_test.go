package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// stallInsertKey is the advisory lock (one bigint key, apart from the
// elections' (class, key) pairs) a stalled candidate's insert waits for.
const stallInsertKey = 7310

// A lease candidate draws its fence in StartLeaseTerm and then stalls
// before its insert meets the open-term index (a backend descheduled on a
// loaded machine; here a trigger makes the insert of holder "stalled" wait
// for an advisory lock the test holds). Meanwhile another candidate opens a
// term with a higher fence, leads and resigns. When the stalled insert goes
// on, no open term is in its way any more. Fences must still rise with
// leadership: the stalled candidate may lead only with a fence above the
// term that led before it.
func TestElectorLeaseFenceRisesWithLeadership(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION test_stall_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.holder = 'stalled' THEN
				PERFORM pg_advisory_xact_lock_shared(7310);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_stall BEFORE INSERT ON pgclaim_terms
			FOR EACH ROW EXECUTE FUNCTION test_stall_insert()`); err != nil {
		t.Fatal(err)
	}
	blocker, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Release()
	if _, err := blocker.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(stallInsertKey)); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if _, err := blocker.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(stallInsertKey)); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer unlock()

	// A TTL long enough that the stalled candidate's lease still lasts
	// when its insert goes on.
	o := gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: 10 * time.Second, RetryInterval: 20 * time.Millisecond}
	stalled := newElector(t, db.NewPool(t), "fence", "stalled", o)
	leader := newElector(t, db.NewPool(t), "fence", "leader", o)

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stalledDone := make(chan error, 1)
	go func() {
		_, err := stalled.Campaign(cctx)
		stalledDone <- err
	}()
	// Wait until the stalled insert waits (its fence drawn).
	for wait := time.Now(); ; time.Sleep(time.Millisecond) {
		var n int
		if err := db.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = $1 AND objsubid = 1
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			stallInsertKey).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Since(wait) > 10*time.Second {
			t.Fatal("the stalled candidate's insert never waited")
		}
	}

	if _, err := leader.Campaign(cctx); err != nil {
		t.Fatalf("Campaign of the other candidate: %v", err)
	}
	before := leader.Fence()
	if err := leader.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	unlock() // the stalled insert goes on

	if err := <-stalledDone; err != nil {
		t.Fatalf("Campaign of the stalled candidate: %v", err)
	}
	after := stalled.Fence()
	t.Logf("fence of the leader before: %d; of the stalled candidate leading after it: %d", before, after)
	if after <= before {
		t.Errorf("the stalled candidate leads with fence %d after the leader of fence %d resigned", after, before)
	}
	if err := stalled.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	terms := checkTerms(t, db.Pool, "fence")
	if len(terms) != 2 || terms[0].Holder != "leader" || terms[1].Holder != "stalled" {
		t.Fatalf("terms = %v; want the leader's, then the stalled candidate's", terms)
	}
	for _, tr := range terms {
		if tr.EndReason == nil || *tr.EndReason != "resigned" {
			t.Errorf("%s: want resigned", tr)
		}
	}
}
