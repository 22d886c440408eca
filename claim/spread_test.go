package claim

import (
	"errors"
	"strings"
	"testing"
)

// Spread cannot be combined with Order; the error names the field.
func TestSpreadWithOrderRefused(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	_, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Spread: true, Order: "claimed_at"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Config.Spread") {
		t.Fatalf("New: %v; want an ErrInvalid naming Config.Spread", err)
	}
}

// Spread claims start at random rows: over 20 small batches from a table of
// 10,000 rows, some start far from the first row (without Spread each
// would take the next rows from the first).
func TestSpreadStartsAtRandomRows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", concRows)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Spread: true})
	if err != nil {
		t.Fatal(err)
	}
	far := 0
	for range 20 {
		batch, err := c.ClaimBatch(ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) != 5 {
			t.Fatalf("claimed %d, want 5", len(batch))
		}
		lo := batch[0].Key
		for _, cl := range batch {
			lo = min(lo, cl.Key)
		}
		if lo > 1000 {
			far++
		}
	}
	if far == 0 {
		t.Fatalf("every batch started within the first 1,000 rows")
	}
}

// Where claimable rows are few among many finished ones, the sample finds
// none most of the time and the claim starts at the first row: every
// claimable row is still claimed, and Config.Where still applies.
func TestSpreadFewClaimableRows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", concRows)
	mustExec(t, db.Pool, `UPDATE jobs SET state = 'DONE' WHERE id NOT IN (17, 18, 5000, 9998, 9999, 10000)`)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Spread: true, Where: "id % 2 = $1"})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.ClaimBatch(ctx, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]bool{}
	for _, cl := range batch {
		got[cl.Key] = true
	}
	if len(got) != 4 || !got[18] || !got[5000] || !got[9998] || !got[10000] {
		t.Fatalf("claimed %v; want the even claimable rows 18, 5000, 9998, 10000", got)
	}
}
