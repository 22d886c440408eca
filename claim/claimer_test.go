package claim

import (
	"errors"
	"testing"
)

func TestClaimFinishInt64(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 10)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Key != 3 || cl.Token == 0 || cl.Attempts != 1 || cl.ClaimedAt.IsZero() {
		t.Fatalf("claim = %+v", cl)
	}
	if _, err := c.Claim(ctx, 3); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("second claim: err = %v, want ErrNotClaimed", err)
	}
	batch, err := c.ClaimBatch(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != 4 {
		t.Fatalf("batch = %d rows", len(batch))
	}
	for _, b := range batch {
		if b.Key == 3 || b.Key > 5 || b.Token != batch[0].Token || b.Token <= cl.Token {
			t.Fatalf("batch claim %+v (first %+v)", b, batch[0])
		}
	}
	done, lost, err := c.FinishBatch(ctx, append(batch, cl, Claim[int64]{Key: 9, Token: cl.Token}), "DONE")
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 5 || len(lost) != 1 || lost[0].Key != 9 {
		t.Fatalf("done %v lost %v", done, lost)
	}
	if err := c.Finish(ctx, cl, "DONE"); !errors.Is(err, ErrLost) {
		t.Fatalf("finish again: %v", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`); n != 5 {
		t.Fatalf("DONE rows = %d", n)
	}
}
