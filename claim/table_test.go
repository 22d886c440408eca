package claim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := newDB(t).Pool
	ok := jobsTable
	with := func(f func(*Table)) Table { tb := ok; f(&tb); return tb }
	cases := []struct {
		name  string
		tbl   Table
		opts  Config
		field string
	}{
		{"empty name", with(func(t *Table) { t.Name = "" }), pausedOpts, "Table.Name"},
		{"two dots", with(func(t *Table) { t.Name = "a.b.c" }), pausedOpts, "Table.Name"},
		{"empty schema", with(func(t *Table) { t.Name = ".jobs" }), pausedOpts, "Table.Name (schema)"},
		{"empty table after schema", with(func(t *Table) { t.Name = "public." }), pausedOpts, "Table.Name"},
		{"empty key", with(func(t *Table) { t.Key = "" }), pausedOpts, "Table.Key"},
		{"empty state", with(func(t *Table) { t.State = "" }), pausedOpts, "Table.State"},
		{"empty claimed_at", with(func(t *Table) { t.ClaimedAt = "" }), pausedOpts, "Table.ClaimedAt"},
		{"NUL in column", with(func(t *Table) { t.Fence = "fe\x00nce" }), pausedOpts, "Table.Fence"},
		{"too long", with(func(t *Table) { t.Attempts = strings.Repeat("a", 64) }), pausedOpts, "Table.Attempts"},
		{"column used twice", with(func(t *Table) { t.ClaimedBy = "state" }), pausedOpts, "Table.ClaimedBy"},
		{"reason column used twice", with(func(t *Table) { t.Reason = "claimed_at" }), pausedOpts, "Table.Reason"},
		{"empty from", ok, Config{To: "PROCESSING"}, "Config.From"},
		{"empty to", ok, Config{From: "PAUSED"}, "Config.To"},
		{"from == to", ok, Config{From: "X", To: "X"}, "Config.To"},
		{"negative lease", ok, Config{From: "A", To: "B", Lease: -time.Second}, "Config.Lease"},
		{"lease without column", with(func(t *Table) { t.LeaseUntil = "" }), Config{From: "A", To: "B", Lease: time.Second}, "Table.LeaseUntil"},
		{"unterminated quote in where", ok, Config{From: "A", To: "B", Where: "x = 'a"}, "Config.Where"},
	}
	for _, tc := range cases {
		_, err := New[int64](pool, tc.tbl, tc.opts)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "claim: "+tc.field+": ") {
			t.Errorf("%s: err = %v, want ErrInvalid naming %s", tc.name, err, tc.field)
		}
	}
	if _, err := New[int64](nil, ok, pausedOpts); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil db: err = %v", err)
	}

	c, err := New[int64](pool, ok, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	calls := []struct {
		name  string
		err   error
		field string
	}{
		{"batch zero", func() error { _, err := c.ClaimBatch(ctx, 0); return err }(), "ClaimBatch: n"},
		{"batch negative", func() error { _, err := c.ClaimBatch(ctx, -1); return err }(), "ClaimBatch: n"},
		{"batch args without where", func() error { _, err := c.ClaimBatch(ctx, 1, 7); return err }(), "ClaimBatch: args"},
		{"finish to same state", c.Finish(ctx, Claim[int64]{}, "PROCESSING"), "Finish: state"},
		{"finish to empty state", c.Finish(ctx, Claim[int64]{}, ""), "Finish: state"},
		{"finish batch same state", func() error { _, _, err := c.FinishBatch(ctx, nil, "PROCESSING"); return err }(), "FinishBatch: state"},
		{"extend zero", func() error { _, err := c.Extend(ctx, Claim[int64]{}, 0); return err }(), "Extend: d"},
		{"extend negative", func() error { _, err := c.Extend(ctx, Claim[int64]{}, -time.Second); return err }(), "Extend: d"},
	}
	for _, tc := range calls {
		if !errors.Is(tc.err, ErrInvalid) || !strings.HasPrefix(tc.err.Error(), "claim: "+tc.field+": ") {
			t.Errorf("%s: err = %v, want ErrInvalid naming %s", tc.name, tc.err, tc.field)
		}
	}

	// Without a Fence column, claims work but fenced operations refuse.
	nf, err := New[int64](pool, with(func(t *Table) { t.Fence = "" }), pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Finish":  nf.Finish(ctx, Claim[int64]{}, "DONE"),
		"Release": nf.Release(ctx, Claim[int64]{}),
		"Extend":  func() error { _, err := nf.Extend(ctx, Claim[int64]{}, time.Second); return err }(),
		"Worker": func() error {
			_, err := NewWorker(nf, WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", BatchSize: 1})
			return err
		}(),
	} {
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Table.Fence") || !strings.Contains(err.Error(), name) {
			t.Errorf("%s without Fence: err = %v", name, err)
		}
	}

	wcases := []struct {
		field string
		cfg   WorkerConfig[int64]
	}{
		{"WorkerConfig.Work", WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 1}},
		{"WorkerConfig.Done", WorkerConfig[int64]{Work: noWork, Failed: "FAILED", BatchSize: 1}},
		{"WorkerConfig.Done", WorkerConfig[int64]{Work: noWork, Done: "PROCESSING", Failed: "FAILED", BatchSize: 1}},
		{"WorkerConfig.Failed", WorkerConfig[int64]{Work: noWork, Done: "DONE", BatchSize: 1}},
		{"WorkerConfig.BatchSize", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED"}},
		{"WorkerConfig.BatchSize", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", BatchSize: -5}},
		{"WorkerConfig.Concurrency", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", BatchSize: 1, Concurrency: -1}},
		{"WorkerConfig.Retry.MaxAttempts", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED"}, BatchSize: 1}},
		{"WorkerConfig.Retry.State", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{MaxAttempts: 3}, BatchSize: 1}},
		{"WorkerConfig.PollInterval", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", BatchSize: 1, PollInterval: -time.Second}},
		{"WorkerConfig.StopTimeout", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", BatchSize: 1, StopTimeout: -time.Second}},
		{"WorkerConfig.Args", WorkerConfig[int64]{Work: noWork, Done: "DONE", Failed: "FAILED", BatchSize: 1, Args: []any{1}}},
	}
	for _, tc := range wcases {
		_, err := NewWorker(c, tc.cfg)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "claim: "+tc.field+": ") {
			t.Errorf("worker: err = %v, want ErrInvalid naming %s", err, tc.field)
		}
	}

	scases := []struct {
		field string
		cfg   SweeperConfig[int64]
	}{
		{"SweeperConfig.Failed", SweeperConfig[int64]{StaleAfter: time.Hour, BatchSize: 10}},
		{"SweeperConfig.Failed", SweeperConfig[int64]{Failed: "PROCESSING", StaleAfter: time.Hour, BatchSize: 10}},
		{"SweeperConfig.StaleAfter", SweeperConfig[int64]{Failed: "FAILED", StaleAfter: -time.Hour, BatchSize: 10}},
		{"SweeperConfig.BatchSize", SweeperConfig[int64]{Failed: "FAILED", StaleAfter: time.Hour}},
		{"SweeperConfig.BatchSize", SweeperConfig[int64]{Failed: "FAILED", StaleAfter: time.Hour, BatchSize: -1}},
		{"SweeperConfig.Retry.MaxAttempts", SweeperConfig[int64]{Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED"}, StaleAfter: time.Hour, BatchSize: 10}},
		{"SweeperConfig.Retry.State", SweeperConfig[int64]{Failed: "FAILED", Retry: RetryPolicy{MaxAttempts: 2}, StaleAfter: time.Hour, BatchSize: 10}},
		{"SweeperConfig.Args", SweeperConfig[int64]{Failed: "FAILED", StaleAfter: time.Hour, BatchSize: 10, Where: "id > $1"}},
	}
	for _, tc := range scases {
		_, err := NewSweeper(c, tc.cfg)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "claim: "+tc.field+": ") {
			t.Errorf("sweeper: err = %v, want ErrInvalid naming %s", err, tc.field)
		}
	}
	// Zero StaleAfter is only valid when leases decide staleness.
	nl, err := New[int64](pool, with(func(t *Table) { t.LeaseUntil = "" }), pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSweeper(nl, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10}); !errors.Is(err, ErrInvalid) ||
		!strings.Contains(err.Error(), "SweeperConfig.StaleAfter") {
		t.Errorf("sweeper without lease or StaleAfter: err = %v", err)
	}
	s, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10, SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctx, 0); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "every") {
		t.Errorf("Run(0): err = %v", err)
	}
	if _, err := Each(ctx, []int64{1}, nil, func(context.Context, int64) error { return nil }); !errors.Is(err, ErrInvalid) {
		t.Errorf("Each(nil cas): err = %v", err)
	}
}

func noWork(context.Context, pgx.Tx, Claim[int64]) error { return nil }

func TestVerify(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := newDB(t).Pool
	mustExec(t, pool, `CREATE TABLE v (
		id bigint PRIMARY KEY, nonuniq bigint, state text, status int, claimed_at timestamptz, claimed_local timestamp,
		claimed_by text, fence bigint, fence4 int, lease_until timestamptz, attempts int, attempts_text text,
		reason text, reason_short varchar(20))`)
	good := Table{Name: "v", Key: "id", State: "state", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by",
		Fence: "fence", LeaseUntil: "lease_until", Attempts: "attempts", Reason: "reason"}
	verify := func(tb Table) error {
		c, err := New[int64](pool, tb, pausedOpts)
		if err != nil {
			t.Fatal(err)
		}
		return c.Verify(ctx)
	}
	if err := verify(good); err != nil {
		t.Fatalf("good table: %v", err)
	}
	type want struct{ field, text string }
	cases := []struct {
		name string
		f    func(*Table)
		want []want
	}{
		{"missing column", func(t *Table) { t.ClaimedAt = "claimed_when" }, []want{{"Table.ClaimedAt", `column "claimed_when" not found`}}},
		{"missing table", func(t *Table) { t.Name = "nope" }, []want{{"Table.Name", "does not exist"}}},
		{"missing schema", func(t *Table) { t.Name = "nope.v" }, []want{{"Table.Name", "does not exist"}}},
		{"wrong types", func(t *Table) {
			t.State, t.ClaimedAt, t.Fence, t.Attempts = "status", "claimed_local", "fence4", "attempts_text"
			t.Reason = "reason_short"
		}, []want{
			{"Table.State", "has type integer"},
			{"Table.ClaimedAt", "has type timestamp without time zone"},
			{"Table.Fence", "has type integer; want bigint"},
			{"Table.Attempts", "has type text"},
			{"Table.Reason", "has type character varying; want text"},
		}},
		{"key not unique", func(t *Table) { t.Key = "nonuniq" }, []want{{"Table.Key", "no primary key or unique index"}}},
	}
	for _, tc := range cases {
		tb := good
		tc.f(&tb)
		err := verify(tb)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), "claim: "+w.field+": ") || !strings.Contains(err.Error(), w.text) {
				t.Errorf("%s: err = %v, want %s: ...%s", tc.name, err, w.field, w.text)
			}
		}
	}
	mustExec(t, pool, `DROP SEQUENCE pgclaim_fence_seq`)
	if err := verify(good); err == nil || !strings.Contains(err.Error(), "Table.Fence") || !strings.Contains(err.Error(), "pgclaim_fence_seq") {
		t.Errorf("no sequence: err = %v", err)
	}
	mustExec(t, pool, `DROP FUNCTION pgclaim_fence()`)
	if err := verify(good); err == nil || !strings.Contains(err.Error(), "Table.Fence") || !strings.Contains(err.Error(), "function pgclaim_fence() not found") {
		t.Errorf("no fence function: err = %v", err)
	}
}

// TestHostileIdentifiers uses names built to break naive quoting: the table
// must survive, and every operation must work on it.
func TestHostileIdentifiers(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := newDB(t).Pool
	const (
		schema = `My "Schema"`
		name   = `"; DROP TABLE x; --`
	)
	mustExec(t, pool, `CREATE TABLE x (id int)`)
	mustExec(t, pool, `CREATE SCHEMA "My ""Schema"""`)
	mustExec(t, pool, `CREATE TYPE "My ""Schema"""."St'ate" AS ENUM ('PAUSED', 'PROCESSING', 'DONE', 'FAILED')`)
	mustExec(t, pool, `CREATE TABLE "My ""Schema""".""";  DROP TABLE x; --" (id int)`)
	mustExec(t, pool, `CREATE TABLE "My ""Schema""".""";  DROP TABLE x; --x" (id int)`)
	mustExec(t, pool, `CREATE TABLE "My ""Schema"""."""; DROP TABLE x; --" (
		"Key'); DROP TABLE x; --" text PRIMARY KEY,
		"State" "My ""Schema"""."St'ate" NOT NULL,
		"claimed at" timestamptz,
		"By""Whom" text,
		"FENCE" bigint,
		"lease; until" timestamptz,
		"attempts\" int NOT NULL DEFAULT 0,
		"why'); --" text)`)
	mustExec(t, pool, `INSERT INTO "My ""Schema"""."""; DROP TABLE x; --" ("Key'); DROP TABLE x; --", "State")
		SELECT 'k' || g, 'PAUSED' FROM generate_series(1, 20) g`)
	tbl := Table{
		Name:       schema + "." + name,
		Key:        `Key'); DROP TABLE x; --`,
		State:      "State",
		ClaimedAt:  "claimed at",
		ClaimedBy:  `By"Whom`,
		Fence:      "FENCE",
		LeaseUntil: "lease; until",
		Attempts:   `attempts\`,
		Reason:     `why'); --`,
	}
	c, err := New[string](pool, tbl, Config{From: "PAUSED", To: "PROCESSING", Lease: time.Minute,
		Where: `"Key'); DROP TABLE x; --" <> $1`})
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
	batch, err := c.ClaimBatch(ctx, 5, "k2")
	if err != nil || len(batch) != 5 {
		t.Fatalf("batch: %v %v", batch, err)
	}
	for _, b := range batch {
		if b.Key == "k2" || b.Key == "k1" {
			t.Fatalf("Where filter ignored: %v", b.Key)
		}
	}
	if _, err := c.Extend(ctx, one, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, batch[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.Finish(ctx, one, "DONE"); err != nil {
		t.Fatal(err)
	}
	if _, lost, err := c.FinishBatch(ctx, batch[1:], "FAILED"); err != nil || len(lost) != 0 {
		t.Fatalf("finish batch: lost %v err %v", lost, err)
	}
	stale, err := c.ClaimBatch(ctx, 1, "k2")
	if err != nil || len(stale) != 1 {
		t.Fatalf("claim to go stale: %v %v", stale, err)
	}
	mustExec(t, pool, `UPDATE "My ""Schema"""."""; DROP TABLE x; --" SET "claimed at" = "claimed at" - interval '2 hours', "lease; until" = NULL`)
	sw, err := NewSweeper(c, SweeperConfig[string]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2}, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if swept, err := sw.Sweep(ctx); err != nil || len(swept) != 1 || swept[0].Key != stale[0].Key {
		t.Fatalf("sweep: %v %v, want the stale claim %v", swept, err, stale[0].Key)
	}
	if n := count(t, pool, `SELECT count(*) FROM "My ""Schema"""."""; DROP TABLE x; --" WHERE "why'); --" LIKE 'claim: swept: claimed at %'`); n != 1 {
		t.Fatalf("%d rows with the sweeper's reason, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM x`); n != 0 {
		t.Fatalf("x has %d rows", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname IN ('x', '"; DROP TABLE x; --', '";  DROP TABLE x; --', '";  DROP TABLE x; --x')`); n != 4 {
		t.Fatalf("%d of 4 tables left", n)
	}
	got := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT "State"::text, count(*) FROM "My ""Schema"""."""; DROP TABLE x; --" GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		got[s] = n
	}
	if got["DONE"] != 1 || got["FAILED"] != 4 || got["PAUSED"] != 15 {
		t.Fatalf("states = %v", got)
	}
}
