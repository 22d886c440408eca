package claim

import (
	"crypto/md5"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
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

// keyRoundTrip claims, extends, releases and finishes rows of a table keyed
// by K, one by one and in a batch.
func keyRoundTrip[K comparable](t *testing.T, keyType string, key func(i int) K) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, keyType, 6)
	c, err := New[K](db.Pool, jobsTable, Options{From: "PAUSED", To: "PROCESSING", Holder: "h1", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	k1 := key(1)
	cl, err := c.Claim(ctx, k1)
	if err != nil {
		t.Fatal(err)
	}
	if cl.Key != k1 {
		t.Fatalf("key = %v, want %v", cl.Key, k1)
	}
	until, err := c.Extend(ctx, cl, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := until.Sub(cl.ClaimedAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("lease ends %v after claim", d)
	}
	if err := c.Release(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, cl); !errors.Is(err, ErrLost) {
		t.Fatalf("second release: %v", err)
	}
	batch, err := c.ClaimBatch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != 6 {
		t.Fatalf("batch = %d", len(batch))
	}
	seen := map[K]bool{}
	for _, b := range batch {
		seen[b.Key] = true
		if b.Attempts != 1 {
			t.Fatalf("attempts %d after release and reclaim of %v", b.Attempts, b.Key)
		}
	}
	for i := 1; i <= 6; i++ {
		if !seen[key(i)] {
			t.Fatalf("key %v not claimed: %v", key(i), batch)
		}
	}
	if _, err := c.Extend(ctx, cl, time.Hour); !errors.Is(err, ErrLost) {
		t.Fatalf("extend of released claim: %v", err)
	}
	done, lost, err := c.FinishBatch(ctx, append(batch, cl), "DONE")
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 6 || len(lost) != 1 || lost[0] != cl {
		t.Fatalf("done %d lost %v", len(done), lost)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE' AND claimed_by = 'h1' AND lease_until > claimed_at`); n != 6 {
		t.Fatalf("%d rows DONE", n)
	}
}

func TestKeyInt64(t *testing.T) { keyRoundTrip(t, "bigint", func(i int) int64 { return int64(i) }) }
func TestKeyInt32Column(t *testing.T) {
	keyRoundTrip(t, "integer", func(i int) int64 { return int64(i) })
}
func TestKeyText(t *testing.T) {
	keyRoundTrip(t, "text", func(i int) string { return "job-" + strconv.Itoa(i) })
}

// md5Key matches the keys createJobs makes for uuid tables: md5(g::text)::uuid.
func md5Key(i int) [16]byte { return md5.Sum([]byte(strconv.Itoa(i))) }

func TestKeyUUID(t *testing.T) {
	keyRoundTrip(t, "uuid", func(i int) uuid.UUID { return uuid.UUID(md5Key(i)) })
}
func TestKeyUUIDBytes(t *testing.T) { keyRoundTrip(t, "uuid", md5Key) }
func TestKeyPgtypeUUID(t *testing.T) {
	keyRoundTrip(t, "uuid", func(i int) pgtype.UUID { return pgtype.UUID{Bytes: md5Key(i), Valid: true} })
}
