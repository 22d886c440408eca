package claim

import (
	"crypto/md5"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
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
	if cl.Key != 3 || cl.Fence == 0 || cl.Attempts != 1 || cl.ClaimedAt.IsZero() {
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
	fences := map[int64]bool{}
	for _, b := range batch {
		if b.Key == 3 || b.Key > 5 || b.Fence <= cl.Fence || fences[b.Fence] {
			t.Fatalf("batch claim %+v (after %+v)", b, cl)
		}
		fences[b.Fence] = true
	}
	done, lost, err := c.FinishBatch(ctx, append(batch, cl, Claim[int64]{Key: 9, Fence: cl.Fence}), "DONE")
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
	c, err := New[K](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h1", Lease: time.Minute})
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

// TestExecModes runs every statement under each pgx query exec mode (the
// simple protocol is what PgBouncer transaction pooling often needs), on a
// table whose state column is an enum and whose key is text.
func TestExecModes(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	mustExec(t, db.Pool, `CREATE TYPE job_state AS ENUM ('PAUSED', 'PROCESSING', 'DONE', 'FAILED')`)
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			cfg := db.Pool.Config().Copy()
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			name := "jobs_" + strings.ReplaceAll(mode.String(), " ", "_")
			mustExec(t, pool, fmt.Sprintf(`CREATE TABLE %s (id text PRIMARY KEY, state job_state NOT NULL, claimed_at timestamptz,
				claimed_by text, fence bigint, lease_until timestamptz, attempts int NOT NULL DEFAULT 0)`, name))
			mustExec(t, pool, fmt.Sprintf(`INSERT INTO %s (id, state) SELECT 'k' || g, 'PAUSED' FROM generate_series(1, 10) g`, name))
			tbl := jobsTable
			tbl.Name = name
			c, err := New[string](pool, tbl, Config{From: "PAUSED", To: "PROCESSING", Lease: time.Minute, Where: "id <> $1"})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Verify(ctx); err != nil {
				t.Fatal(err)
			}
			one, err := c.Claim(ctx, "k1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Claim(ctx, "k1"); !errors.Is(err, ErrNotClaimed) {
				t.Fatalf("second claim: %v", err)
			}
			batch, err := c.ClaimBatch(ctx, 4, "k2")
			if err != nil || len(batch) != 4 {
				t.Fatalf("batch %v %v", batch, err)
			}
			if _, err := c.Extend(ctx, one, time.Hour); err != nil {
				t.Fatal(err)
			}
			lost, err := c.heartbeat(ctx, append(batch, Claim[string]{Key: "k2", Fence: 1}), time.Hour)
			if err != nil || lost[0] || !lost[4] {
				t.Fatalf("heartbeat lost %v %v", lost, err)
			}
			if err := c.Release(ctx, batch[0]); err != nil {
				t.Fatal(err)
			}
			done, gone, err := c.FinishBatch(ctx, batch, "DONE")
			if err != nil || len(done) != 3 || len(gone) != 1 {
				t.Fatalf("finish batch: %v %v %v", done, gone, err)
			}
			mustExec(t, pool, fmt.Sprintf(`UPDATE %s SET lease_until = now() - interval '1 second' WHERE id = 'k1'`, name))
			sw, err := NewSweeper(c, SweeperConfig[string]{Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2}, BatchSize: 10})
			if err != nil {
				t.Fatal(err)
			}
			got, err := sw.Sweep(ctx)
			if err != nil || len(got) != 1 || got[0].Key != "k1" || got[0].State != "PAUSED" {
				t.Fatalf("sweep %+v %v", got, err)
			}
			if err := c.Finish(ctx, one, "DONE"); !errors.Is(err, ErrLost) {
				t.Fatalf("finish after sweep: %v", err)
			}
			if n := count(t, pool, fmt.Sprintf(`SELECT count(*) FROM %s WHERE state = 'DONE'`, name)); n != 3 {
				t.Fatalf("%d rows DONE", n)
			}
		})
	}
}

// TestOrderAndWhere: ClaimBatch takes rows in Config.Order, filtered by
// Config.Where with its arguments.
func TestOrderAndWhere(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 20)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Order: "id DESC", Where: "id % $1 = $2"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ClaimBatch(ctx, 3, 2, 1) // odd ids, highest first
	if err != nil {
		t.Fatal(err)
	}
	keys := map[int64]bool{}
	for _, g := range got {
		keys[g.Key] = true
	}
	if len(got) != 3 || !keys[19] || !keys[17] || !keys[15] {
		t.Fatalf("claimed %v", got)
	}
	if _, err := c.ClaimBatch(ctx, 3, 2); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "uses 2 parameters, got 1") {
		t.Fatalf("missing arg: %v", err)
	}
}

// TestFinishBatchPairs: FinishBatch and the heartbeat match each row to a
// claim by the pair (key, token), not by key and token separately; a claim
// passed twice finishes once; claims sharing a token (stamped on several
// rows by the caller's own SQL) each finish their own row.
func TestFinishBatchPairs(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 8)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.ClaimBatch(ctx, 8)
	if err != nil || len(batch) != 8 {
		t.Fatalf("claim: %v %v", batch, err)
	}
	by := map[int64]Claim[int64]{}
	for _, cl := range batch {
		by[cl.Key] = cl
	}
	swap := func(a, b int64) Claim[int64] { return Claim[int64]{Key: a, Fence: by[b].Fence} }
	in := []Claim[int64]{
		swap(2, 3), by[4], by[1], swap(3, 2), by[1],
		{Key: 5, Fence: by[5].Fence + 1000}, {Key: 6, Fence: 0},
	}
	// Each key of the swapped pairs and each token is in the batch, but
	// not as a pair of one claim: the heartbeat extends 4 and 1 only.
	lost, err := c.heartbeat(ctx, in, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, true, false, true, true}; !slices.Equal(lost, want) {
		t.Fatalf("heartbeat lost %v, want %v", lost, want)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE lease_until > now() + interval '30 minutes'`); n != 2 {
		t.Fatalf("%d leases extended, want 2", n)
	}
	done, gone, err := c.FinishBatch(ctx, in, "DONE")
	if err != nil {
		t.Fatal(err)
	}
	if want := []Claim[int64]{by[4], by[1]}; !slices.Equal(done, want) {
		t.Fatalf("done %v, want %v", done, want)
	}
	if want := []Claim[int64]{in[0], in[3], in[4], in[5], in[6]}; !slices.Equal(gone, want) {
		t.Fatalf("lost %v, want %v", gone, want)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE' AND id IN (1, 4)`); n != 2 {
		t.Fatalf("%d of rows 1 and 4 DONE", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PROCESSING'`); n != 6 {
		t.Fatalf("%d rows PROCESSING, want 6", n)
	}

	// One token on three rows, as one nextval per statement would stamp.
	mustExec(t, db.Pool, `UPDATE jobs SET fence = 77 WHERE id IN (5, 6, 7)`)
	shared := []Claim[int64]{{Key: 7, Fence: 77}, {Key: 5, Fence: 77}, by[2], {Key: 6, Fence: 77}, {Key: 3, Fence: 77}}
	done, gone, err = c.FinishBatch(ctx, shared, "DONE")
	if err != nil {
		t.Fatal(err)
	}
	if want := []Claim[int64]{shared[0], shared[1], shared[2], shared[3]}; !slices.Equal(done, want) || len(gone) != 1 || gone[0] != shared[4] {
		t.Fatalf("shared token: done %v lost %v", done, gone)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'DONE'`); n != 6 {
		t.Fatalf("%d rows DONE, want 6", n)
	}
}

// States are written into the batch claim's and the sweeper's text as
// literals: one with a quote in it is quoted, and selects its rows.
func TestStateWithQuote(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 5)
	const waiting, working = "it's waiting", `it's "working"`
	mustExec(t, db.Pool, `UPDATE jobs SET state = $1 WHERE id <= 3`, waiting)
	c, err := New[int64](db.Pool, jobsTable, Config{From: waiting, To: working, Holder: "q", Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cls, err := c.ClaimBatch(ctx, 10)
	if err != nil || len(cls) != 3 {
		t.Fatalf("ClaimBatch: %d claims, %v; want the 3 rows in %q", len(cls), err, waiting)
	}
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE state = $1`, working)
	sw, err := NewSweeper(c, SweeperConfig[int64]{Failed: "it's failed", BatchSize: 10, SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	swept, err := sw.Sweep(ctx)
	if err != nil || len(swept) != 3 {
		t.Fatalf("Sweep: %d rows, %v; want 3", len(swept), err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'it''s failed'`); n != 3 {
		t.Fatalf("%d rows swept to the failed state; want 3", n)
	}
}
