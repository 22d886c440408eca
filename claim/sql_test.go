package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// sqlRecorder is a DBTX that runs nothing: it records each statement sent to
// it with its arguments, and answers as a table with no matching row would
// (no rows, zero rows affected), so that every method sends the statements
// it builds without a server.
type sqlRecorder struct{ b strings.Builder }

func (r *sqlRecorder) record(sql string, args []any) {
	fmt.Fprintf(&r.b, "%s\n", sql)
	for i, a := range args {
		fmt.Fprintf(&r.b, "  arg %d: %s\n", i, showArg(a))
	}
}

// showArg prints an argument with its type, dereferencing pointers so the
// text is deterministic.
func showArg(a any) string {
	switch v := a.(type) {
	case *string:
		if v == nil {
			return "(*string)(nil)"
		}
		return fmt.Sprintf("*string %q", *v)
	case string:
		return fmt.Sprintf("string %q", v)
	}
	return fmt.Sprintf("%T %v", a, a)
}

func (r *sqlRecorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.record(sql, args)
	return pgconn.NewCommandTag("UPDATE 0"), nil
}

func (r *sqlRecorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.record(sql, args)
	return noRows{}, nil
}

func (r *sqlRecorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.record(sql, args)
	return noRows{}
}

// noRows is an empty result.
type noRows struct{}

func (noRows) Close()                                       {}
func (noRows) Err() error                                   { return nil }
func (noRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (noRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (noRows) Next() bool                                   { return false }
func (noRows) Scan(...any) error                            { return pgx.ErrNoRows }
func (noRows) Values() ([]any, error)                       { return nil, nil }
func (noRows) RawValues() [][]byte                          { return nil }
func (noRows) Conn() *pgx.Conn                              { return nil }
func (noRows) TypeMap() *pgtype.Map                         { return nil }

// sqlCase is one Table/Config configuration and the statements it sends.
type sqlCase[K any] struct {
	name    string
	table   Table
	opts    Config
	keys    [2]K
	where   []any // ClaimBatch's args
	sweeper []SweeperConfig[K]
	want    string
}

// sentSQL runs every operation of a claimer built from tc (and of its
// sweepers) on a recorder and returns what was sent, op by op.
func sentSQL[K any](t *testing.T, tc sqlCase[K]) string {
	t.Helper()
	ctx := context.Background()
	rec := &sqlRecorder{}
	opts := tc.opts
	opts.Logger = slog.New(slog.DiscardHandler)
	c, err := New[K](rec, tc.table, opts)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	op := func(name string, f func() error) {
		rec.b.Reset()
		err := f()
		if rec.b.Len() == 0 {
			return // the operation needs a column the table lacks
		}
		fmt.Fprintf(&out, "== %s (%v)\n%s", name, err, rec.b.String())
	}
	cl := Claim[K]{Key: tc.keys[0], Fence: 7}
	cls := []Claim[K]{cl, {Key: tc.keys[1], Fence: 9}}
	op("Claim", func() error { _, err := c.Claim(ctx, tc.keys[0]); return err })
	op("ClaimBatch", func() error { _, err := c.ClaimBatch(ctx, 10, tc.where...); return err })
	op("Finish", func() error { return c.Finish(ctx, cl, "DONE") })
	for _, cause := range []error{nil, errors.New("boom")} {
		for _, retryIn := range []time.Duration{0, 3 * time.Second} {
			op(fmt.Sprintf("finishWith(%v, %v)", cause, retryIn), func() error {
				return c.finishWith(ctx, cl, "FAILED", cause, retryIn)
			})
		}
	}
	op("FinishBatch", func() error { _, _, err := c.FinishBatch(ctx, cls, "DONE"); return err })
	op("Extend", func() error { _, err := c.Extend(ctx, cl, time.Minute); return err })
	op("Release", func() error { return c.Release(ctx, cl) })
	if tc.table.Fence != "" && tc.table.LeaseUntil != "" { // what a Worker's heartbeat needs
		op("heartbeat", func() error { _, err := c.heartbeat(ctx, cls, 30*time.Second); return err })
	}
	for i, cfg := range tc.sweeper {
		cfg.SkipVerify = true
		s, err := NewSweeper(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		op(fmt.Sprintf("Sweep %d", i), func() error { _, err := s.Sweep(ctx); return err })
	}
	return out.String()
}

// TestSQLGolden pins the text and the arguments of every statement the
// package builds, for a few representative configurations, without a
// server.
func TestSQLGolden(t *testing.T) {
	check := func(name, got, want string) {
		t.Run(name, func(t *testing.T) {
			if got != want {
				t.Errorf("statements differ; got:\n%s", got)
			}
		})
	}
	for _, tc := range sqlInt64Cases {
		check(tc.name, sentSQL(t, tc), tc.want)
	}
	for _, tc := range sqlTextCases {
		check(tc.name, sentSQL(t, tc), tc.want)
	}
}

var sqlInt64Cases = []sqlCase[int64]{
	{
		name:    "minimal",
		table:   Table{Name: "jobs", Key: "id", State: "state", ClaimedAt: "claimed_at"},
		opts:    Config{From: "PAUSED", To: "PROCESSING", Holder: "h1"},
		keys:    [2]int64{1, 2},
		sweeper: []SweeperConfig[int64]{{StaleAfter: 5 * time.Minute, Failed: "FAILED", BatchSize: 100}},
		want:    goldenMinimal,
	},
	{
		name: "all columns",
		table: Table{Name: "app.jobs", Key: "id", State: "state", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by",
			Fence: "fence", LeaseUntil: "lease_until", Attempts: "attempts", RetryAt: "retry_at", Reason: "reason"},
		opts: Config{From: "PAUSED", To: "PROCESSING", Holder: "h1", Lease: 30 * time.Second, Order: "created_at, id"},
		keys: [2]int64{1, 2},
		sweeper: []SweeperConfig[int64]{
			{StaleAfter: 5 * time.Minute, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3, Backoff: 10 * time.Second}, FailAfter: 24 * time.Hour, BatchSize: 100},
			{Failed: "FAILED", BatchSize: 50},
			{StaleAfter: 5 * time.Minute, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, BatchSize: 100},
			{StaleAfter: 5 * time.Minute, Failed: "FAILED", BatchSize: 100,
				Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 5, Backoff: time.Second, MaxBackoff: time.Minute}},
		},
		want: goldenAllColumns,
	},
	{
		name:  "where with args",
		table: jobsTable,
		opts:  Config{From: "PAUSED", To: "PROCESSING", Holder: "h1", Where: "tenant = $1 AND priority > $2"},
		keys:  [2]int64{1, 2},
		where: []any{"acme", 5},
		sweeper: []SweeperConfig[int64]{{StaleAfter: time.Minute, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2},
			FailAfter: time.Hour, BatchSize: 10, Where: "tenant = $1", Args: []any{"acme"}}},
		want: goldenWhere,
	},
}

var sqlTextCases = []sqlCase[string]{
	{
		name: "text key",
		table: Table{Name: "Push Queue", Key: "Job ID", State: "Status", ClaimedAt: "claimedAt",
			Fence: "fence", RetryAt: "retry_at", Reason: "why"},
		opts:    Config{From: "PAUSED", To: "PROCESSING", Holder: "h1"},
		keys:    [2]string{"k1", "k2"},
		sweeper: []SweeperConfig[string]{{StaleAfter: 2 * time.Minute, Failed: "FAILED", BatchSize: 25}},
		want:    goldenTextKey,
	},
}

const goldenMinimal = `== Claim (claim: not claimed: row is not in the From state)
UPDATE "jobs" AS pgclaim_t SET "state" = $3, "claimed_at" = statement_timestamp() WHERE pgclaim_t."id" = $1 AND (pgclaim_t."state" = $2) IS TRUE RETURNING pgclaim_t."claimed_at", 0::bigint, 0::bigint
  arg 0: int64 1
  arg 1: string "PAUSED"
  arg 2: string "PROCESSING"
== ClaimBatch (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "jobs" WHERE "state" = 'PAUSED' ORDER BY "id" LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE "jobs" AS pgclaim_t SET "state" = $2, "claimed_at" = statement_timestamp()
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PAUSED') IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."claimed_at", 0::bigint, 0::bigint
  arg 0: int 10
  arg 1: string "PROCESSING"
== Sweep 0 (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "jobs"
  WHERE "state" = 'PROCESSING' AND "claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')
  ORDER BY "claimed_at"
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE "jobs" AS pgclaim_t SET "state" = $3
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PROCESSING' AND pgclaim_t."claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')) IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."state"::text, 0::bigint, ''::text, pgclaim_t."claimed_at", 0::bigint, ('claim: swept: ' || 'claimed at ' || to_char(pgclaim_t."claimed_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ', more than ' || $4 || ' ago' || ' (' || 'claim' || ')')
  arg 0: int 100
  arg 1: int64 300000000
  arg 2: string "FAILED"
  arg 3: string "5m0s"
`
const goldenAllColumns = `== Claim (claim: not claimed: row is not in the From state)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = $3, "claimed_at" = statement_timestamp(), "claimed_by" = $4, "fence" = pgclaim_fence(), "attempts" = COALESCE(pgclaim_t."attempts", 0) + 1, "lease_until" = statement_timestamp() + ($5::bigint * interval '1 microsecond') WHERE pgclaim_t."id" = $1 AND (pgclaim_t."state" = $2 AND (pgclaim_t."retry_at" IS NULL OR pgclaim_t."retry_at" <= statement_timestamp())) IS TRUE RETURNING pgclaim_t."claimed_at", pgclaim_t."fence", pgclaim_t."attempts"::bigint
  arg 0: int64 1
  arg 1: string "PAUSED"
  arg 2: string "PROCESSING"
  arg 3: string "h1"
  arg 4: int64 30000000
== ClaimBatch (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "app"."jobs" WHERE "state" = 'PAUSED' AND ("retry_at" IS NULL OR "retry_at" <= statement_timestamp()) ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = $2, "claimed_at" = statement_timestamp(), "claimed_by" = $3, "fence" = pgclaim_fence(), "attempts" = COALESCE(pgclaim_t."attempts", 0) + 1, "lease_until" = statement_timestamp() + ($4::bigint * interval '1 microsecond')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PAUSED') IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."claimed_at", pgclaim_t."fence", pgclaim_t."attempts"::bigint
  arg 0: int 10
  arg 1: string "PROCESSING"
  arg 2: string "h1"
  arg 3: int64 30000000
== Finish (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "state" = $1 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "DONE"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== finishWith(<nil>, 0s) (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "state" = $1, "reason" = $5 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: (*string)(nil)
== finishWith(<nil>, 3s) (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "state" = $1, "reason" = $5, "retry_at" = statement_timestamp() + ($6::bigint * interval '1 microsecond') WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: (*string)(nil)
  arg 5: int64 3000000
== finishWith(boom, 0s) (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "state" = $1, "reason" = $5 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: *string "boom"
== finishWith(boom, 3s) (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "state" = $1, "reason" = $5, "retry_at" = statement_timestamp() + ($6::bigint * interval '1 microsecond') WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: *string "boom"
  arg 5: int64 3000000
== FinishBatch (<nil>)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = $3
WHERE pgclaim_t."id" = ANY(COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0))) AND (pgclaim_t."state" = $4 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
RETURNING width_bucket(pgclaim_t."fence", $2::bigint[])
  arg 0: []int64 [1 2]
  arg 1: []int64 [7 9]
  arg 2: string "DONE"
  arg 3: string "PROCESSING"
== Extend (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "lease_until" = statement_timestamp() + ($1::bigint * interval '1 microsecond') WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE RETURNING "lease_until"
  arg 0: int64 60000000
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== Release (claim: claim lost: row is no longer held with this token)
UPDATE "app"."jobs" SET "state" = $1, "attempts" = GREATEST(COALESCE("attempts", 1) - 1, 0) WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "PAUSED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== heartbeat (<nil>)
WITH pgclaim_l AS (
  SELECT pgclaim_t."id" FROM "app"."jobs" AS pgclaim_t
  WHERE pgclaim_t."id" = ANY(COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0))) AND (pgclaim_t."state" = $3 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
  FOR UPDATE OF pgclaim_t SKIP LOCKED
)
UPDATE "app"."jobs" AS pgclaim_t SET "lease_until" = statement_timestamp() + ($4::bigint * interval '1 microsecond')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_l)) AND (pgclaim_t."state" = $3 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
RETURNING width_bucket(pgclaim_t."fence", $2::bigint[])
  arg 0: []int64 [1 2]
  arg 1: []int64 [7 9]
  arg 2: string "PROCESSING"
  arg 3: int64 30000000
SELECT width_bucket(pgclaim_t."fence", $2::bigint[]) FROM "app"."jobs" AS pgclaim_t WHERE pgclaim_t."id" = ANY(COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0))) AND (pgclaim_t."state" = $3 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "app"."jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
  arg 0: []int64 [1 2]
  arg 1: []int64 [7 9]
  arg 2: string "PROCESSING"
== Sweep 0 (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "app"."jobs"
  WHERE "state" = 'PROCESSING' AND ("lease_until" < statement_timestamp() OR ("lease_until" IS NULL AND "claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')))
  ORDER BY "claimed_at"
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = CASE WHEN COALESCE(pgclaim_t."attempts", 0) < $5 AND NOT ((pgclaim_t."claimed_at" < statement_timestamp() - ($6::bigint * interval '1 microsecond')) IS TRUE) THEN $4 WHEN true THEN $3 ELSE pgclaim_t."state" END, "retry_at" = CASE WHEN COALESCE(pgclaim_t."attempts", 0) < $5 AND NOT ((pgclaim_t."claimed_at" < statement_timestamp() - ($6::bigint * interval '1 microsecond')) IS TRUE) THEN statement_timestamp() + ($7::bigint * interval '1 microsecond') ELSE pgclaim_t."retry_at" END, "reason" = ('claim: swept: ' || CASE WHEN pgclaim_t."lease_until" IS NOT NULL THEN 'lease expired at ' || to_char(pgclaim_t."lease_until" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE 'claimed at ' || to_char(pgclaim_t."claimed_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ', more than ' || $8 || ' ago' END || CASE WHEN pgclaim_t."claimed_at" < statement_timestamp() - ($9::bigint * interval '1 microsecond') THEN ', claimed more than ' || $10 || ' ago' ELSE '' END || ' (' || COALESCE('claim by ' || pgclaim_t."claimed_by", 'claim') || COALESCE(', fence ' || pgclaim_t."fence", '') || COALESCE(', attempt ' || pgclaim_t."attempts", '') || ')')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PROCESSING' AND (pgclaim_t."lease_until" < statement_timestamp() OR (pgclaim_t."lease_until" IS NULL AND pgclaim_t."claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')))) IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."state"::text, pgclaim_t."fence", COALESCE(pgclaim_t."claimed_by"::text, ''), pgclaim_t."claimed_at", pgclaim_t."attempts"::bigint, pgclaim_t."reason"
  arg 0: int 100
  arg 1: int64 300000000
  arg 2: string "FAILED"
  arg 3: string "PAUSED"
  arg 4: int 3
  arg 5: int64 86400000000
  arg 6: int64 10000000
  arg 7: string "5m0s"
  arg 8: int64 86400000000
  arg 9: string "24h0m0s"
== Sweep 1 (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "app"."jobs"
  WHERE "state" = 'PROCESSING' AND "lease_until" < statement_timestamp()
  ORDER BY "claimed_at"
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = $2, "reason" = ('claim: swept: ' || 'lease expired at ' || to_char(pgclaim_t."lease_until" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ' (' || COALESCE('claim by ' || pgclaim_t."claimed_by", 'claim') || COALESCE(', fence ' || pgclaim_t."fence", '') || COALESCE(', attempt ' || pgclaim_t."attempts", '') || ')')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PROCESSING' AND pgclaim_t."lease_until" < statement_timestamp()) IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."state"::text, pgclaim_t."fence", COALESCE(pgclaim_t."claimed_by"::text, ''), pgclaim_t."claimed_at", pgclaim_t."attempts"::bigint, pgclaim_t."reason"
  arg 0: int 50
  arg 1: string "FAILED"
== Sweep 2 (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "app"."jobs"
  WHERE "state" = 'PROCESSING' AND ("lease_until" < statement_timestamp() OR ("lease_until" IS NULL AND "claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')))
  ORDER BY "claimed_at"
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = CASE WHEN COALESCE(pgclaim_t."attempts", 0) < $5 THEN $4 WHEN true THEN $3 ELSE pgclaim_t."state" END, "reason" = ('claim: swept: ' || CASE WHEN pgclaim_t."lease_until" IS NOT NULL THEN 'lease expired at ' || to_char(pgclaim_t."lease_until" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE 'claimed at ' || to_char(pgclaim_t."claimed_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ', more than ' || $6 || ' ago' END || ' (' || COALESCE('claim by ' || pgclaim_t."claimed_by", 'claim') || COALESCE(', fence ' || pgclaim_t."fence", '') || COALESCE(', attempt ' || pgclaim_t."attempts", '') || ')')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PROCESSING' AND (pgclaim_t."lease_until" < statement_timestamp() OR (pgclaim_t."lease_until" IS NULL AND pgclaim_t."claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')))) IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."state"::text, pgclaim_t."fence", COALESCE(pgclaim_t."claimed_by"::text, ''), pgclaim_t."claimed_at", pgclaim_t."attempts"::bigint, pgclaim_t."reason"
  arg 0: int 100
  arg 1: int64 300000000
  arg 2: string "FAILED"
  arg 3: string "PAUSED"
  arg 4: int 3
  arg 5: string "5m0s"
== Sweep 3 (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "app"."jobs"
  WHERE "state" = 'PROCESSING' AND ("lease_until" < statement_timestamp() OR ("lease_until" IS NULL AND "claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')))
  ORDER BY "claimed_at"
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE "app"."jobs" AS pgclaim_t SET "state" = CASE WHEN COALESCE(pgclaim_t."attempts", 0) < $5 THEN $4 WHEN true THEN $3 ELSE pgclaim_t."state" END, "retry_at" = CASE WHEN COALESCE(pgclaim_t."attempts", 0) < $5 THEN statement_timestamp() + (LEAST($6::bigint << LEAST(GREATEST(COALESCE(pgclaim_t."attempts", 0) - 1, 0), $7::int)::int, $8::bigint) * interval '1 microsecond') ELSE pgclaim_t."retry_at" END, "reason" = ('claim: swept: ' || CASE WHEN pgclaim_t."lease_until" IS NOT NULL THEN 'lease expired at ' || to_char(pgclaim_t."lease_until" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE 'claimed at ' || to_char(pgclaim_t."claimed_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ', more than ' || $9 || ' ago' END || ' (' || COALESCE('claim by ' || pgclaim_t."claimed_by", 'claim') || COALESCE(', fence ' || pgclaim_t."fence", '') || COALESCE(', attempt ' || pgclaim_t."attempts", '') || ')')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PROCESSING' AND (pgclaim_t."lease_until" < statement_timestamp() OR (pgclaim_t."lease_until" IS NULL AND pgclaim_t."claimed_at" < statement_timestamp() - ($2::bigint * interval '1 microsecond')))) IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."state"::text, pgclaim_t."fence", COALESCE(pgclaim_t."claimed_by"::text, ''), pgclaim_t."claimed_at", pgclaim_t."attempts"::bigint, pgclaim_t."reason"
  arg 0: int 100
  arg 1: int64 300000000
  arg 2: string "FAILED"
  arg 3: string "PAUSED"
  arg 4: int 5
  arg 5: int64 1000000
  arg 6: int 6
  arg 7: int64 60000000
  arg 8: string "5m0s"
`
const goldenWhere = `== Claim (claim: not claimed: row is not in the From state)
UPDATE "jobs" AS pgclaim_t SET "state" = $3, "claimed_at" = statement_timestamp(), "claimed_by" = $4, "fence" = pgclaim_fence(), "attempts" = COALESCE(pgclaim_t."attempts", 0) + 1, "lease_until" = NULL WHERE pgclaim_t."id" = $1 AND (pgclaim_t."state" = $2) IS TRUE RETURNING pgclaim_t."claimed_at", pgclaim_t."fence", pgclaim_t."attempts"::bigint
  arg 0: int64 1
  arg 1: string "PAUSED"
  arg 2: string "PROCESSING"
  arg 3: string "h1"
== ClaimBatch (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "jobs" WHERE "state" = 'PAUSED' AND (tenant = $1 AND priority > $2) ORDER BY "id" LIMIT $3 FOR UPDATE SKIP LOCKED
)
UPDATE "jobs" AS pgclaim_t SET "state" = $4, "claimed_at" = statement_timestamp(), "claimed_by" = $5, "fence" = pgclaim_fence(), "attempts" = COALESCE(pgclaim_t."attempts", 0) + 1, "lease_until" = NULL
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PAUSED') IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."claimed_at", pgclaim_t."fence", pgclaim_t."attempts"::bigint
  arg 0: string "acme"
  arg 1: int 5
  arg 2: int 10
  arg 3: string "PROCESSING"
  arg 4: string "h1"
== Finish (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "state" = $1 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "DONE"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== finishWith(<nil>, 0s) (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "state" = $1 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== finishWith(<nil>, 3s) (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "state" = $1 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== finishWith(boom, 0s) (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "state" = $1 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== finishWith(boom, 3s) (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "state" = $1 WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== FinishBatch (<nil>)
UPDATE "jobs" AS pgclaim_t SET "state" = $3
WHERE pgclaim_t."id" = ANY(COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0))) AND (pgclaim_t."state" = $4 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
RETURNING width_bucket(pgclaim_t."fence", $2::bigint[])
  arg 0: []int64 [1 2]
  arg 1: []int64 [7 9]
  arg 2: string "DONE"
  arg 3: string "PROCESSING"
== Extend (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "lease_until" = statement_timestamp() + ($1::bigint * interval '1 microsecond') WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE RETURNING "lease_until"
  arg 0: int64 60000000
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== Release (claim: claim lost: row is no longer held with this token)
UPDATE "jobs" SET "state" = $1, "attempts" = GREATEST(COALESCE("attempts", 1) - 1, 0) WHERE "id" = $2 AND ("state" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "PAUSED"
  arg 1: int64 1
  arg 2: string "PROCESSING"
  arg 3: int64 7
== heartbeat (<nil>)
WITH pgclaim_l AS (
  SELECT pgclaim_t."id" FROM "jobs" AS pgclaim_t
  WHERE pgclaim_t."id" = ANY(COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0))) AND (pgclaim_t."state" = $3 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
  FOR UPDATE OF pgclaim_t SKIP LOCKED
)
UPDATE "jobs" AS pgclaim_t SET "lease_until" = statement_timestamp() + ($4::bigint * interval '1 microsecond')
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_l)) AND (pgclaim_t."state" = $3 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
RETURNING width_bucket(pgclaim_t."fence", $2::bigint[])
  arg 0: []int64 [1 2]
  arg 1: []int64 [7 9]
  arg 2: string "PROCESSING"
  arg 3: int64 30000000
SELECT width_bucket(pgclaim_t."fence", $2::bigint[]) FROM "jobs" AS pgclaim_t WHERE pgclaim_t."id" = ANY(COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0))) AND (pgclaim_t."state" = $3 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."id" = (COALESCE($1, ARRAY(SELECT "id" FROM "jobs" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
  arg 0: []int64 [1 2]
  arg 1: []int64 [7 9]
  arg 2: string "PROCESSING"
== Sweep 0 (<nil>)
WITH pgclaim_c AS (
  SELECT "id" FROM "jobs"
  WHERE "state" = 'PROCESSING' AND ("lease_until" < statement_timestamp() OR ("lease_until" IS NULL AND "claimed_at" < statement_timestamp() - ($3::bigint * interval '1 microsecond'))) AND (tenant = $1)
  ORDER BY "claimed_at"
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
UPDATE "jobs" AS pgclaim_t SET "state" = CASE WHEN COALESCE(pgclaim_t."attempts", 0) < $6 AND NOT ((pgclaim_t."claimed_at" < statement_timestamp() - ($7::bigint * interval '1 microsecond')) IS TRUE) THEN $5 WHEN true THEN $4 ELSE pgclaim_t."state" END
WHERE pgclaim_t."id" = ANY(ARRAY(SELECT "id" FROM pgclaim_c)) AND (pgclaim_t."state" = 'PROCESSING' AND (pgclaim_t."lease_until" < statement_timestamp() OR (pgclaim_t."lease_until" IS NULL AND pgclaim_t."claimed_at" < statement_timestamp() - ($3::bigint * interval '1 microsecond')))) IS TRUE
RETURNING pgclaim_t."id", pgclaim_t."state"::text, pgclaim_t."fence", COALESCE(pgclaim_t."claimed_by"::text, ''), pgclaim_t."claimed_at", pgclaim_t."attempts"::bigint, ('claim: swept: ' || CASE WHEN pgclaim_t."lease_until" IS NOT NULL THEN 'lease expired at ' || to_char(pgclaim_t."lease_until" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE 'claimed at ' || to_char(pgclaim_t."claimed_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ', more than ' || $8 || ' ago' END || CASE WHEN pgclaim_t."claimed_at" < statement_timestamp() - ($9::bigint * interval '1 microsecond') THEN ', claimed more than ' || $10 || ' ago' ELSE '' END || ' (' || COALESCE('claim by ' || pgclaim_t."claimed_by", 'claim') || COALESCE(', fence ' || pgclaim_t."fence", '') || COALESCE(', attempt ' || pgclaim_t."attempts", '') || ')')
  arg 0: string "acme"
  arg 1: int 10
  arg 2: int64 60000000
  arg 3: string "FAILED"
  arg 4: string "PAUSED"
  arg 5: int 2
  arg 6: int64 3600000000
  arg 7: string "1m0s"
  arg 8: int64 3600000000
  arg 9: string "1h0m0s"
`
const goldenTextKey = `== Claim (claim: not claimed: row is not in the From state)
UPDATE "Push Queue" AS pgclaim_t SET "Status" = $3, "claimedAt" = statement_timestamp(), "fence" = pgclaim_fence() WHERE pgclaim_t."Job ID" = $1 AND (pgclaim_t."Status" = $2 AND (pgclaim_t."retry_at" IS NULL OR pgclaim_t."retry_at" <= statement_timestamp())) IS TRUE RETURNING pgclaim_t."claimedAt", pgclaim_t."fence", 0::bigint
  arg 0: string "k1"
  arg 1: string "PAUSED"
  arg 2: string "PROCESSING"
== ClaimBatch (<nil>)
WITH pgclaim_c AS (
  SELECT "Job ID" FROM "Push Queue" WHERE "Status" = 'PAUSED' AND ("retry_at" IS NULL OR "retry_at" <= statement_timestamp()) ORDER BY "Job ID" LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE "Push Queue" AS pgclaim_t SET "Status" = $2, "claimedAt" = statement_timestamp(), "fence" = pgclaim_fence()
WHERE pgclaim_t."Job ID" = ANY(ARRAY(SELECT "Job ID" FROM pgclaim_c)) AND (pgclaim_t."Status" = 'PAUSED') IS TRUE
RETURNING pgclaim_t."Job ID", pgclaim_t."claimedAt", pgclaim_t."fence", 0::bigint
  arg 0: int 10
  arg 1: string "PROCESSING"
== Finish (claim: claim lost: row is no longer held with this token)
UPDATE "Push Queue" SET "Status" = $1 WHERE "Job ID" = $2 AND ("Status" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "DONE"
  arg 1: string "k1"
  arg 2: string "PROCESSING"
  arg 3: int64 7
== finishWith(<nil>, 0s) (claim: claim lost: row is no longer held with this token)
UPDATE "Push Queue" SET "Status" = $1, "why" = $5 WHERE "Job ID" = $2 AND ("Status" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: string "k1"
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: (*string)(nil)
== finishWith(<nil>, 3s) (claim: claim lost: row is no longer held with this token)
UPDATE "Push Queue" SET "Status" = $1, "why" = $5, "retry_at" = statement_timestamp() + ($6::bigint * interval '1 microsecond') WHERE "Job ID" = $2 AND ("Status" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: string "k1"
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: (*string)(nil)
  arg 5: int64 3000000
== finishWith(boom, 0s) (claim: claim lost: row is no longer held with this token)
UPDATE "Push Queue" SET "Status" = $1, "why" = $5 WHERE "Job ID" = $2 AND ("Status" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: string "k1"
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: *string "boom"
== finishWith(boom, 3s) (claim: claim lost: row is no longer held with this token)
UPDATE "Push Queue" SET "Status" = $1, "why" = $5, "retry_at" = statement_timestamp() + ($6::bigint * interval '1 microsecond') WHERE "Job ID" = $2 AND ("Status" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "FAILED"
  arg 1: string "k1"
  arg 2: string "PROCESSING"
  arg 3: int64 7
  arg 4: *string "boom"
  arg 5: int64 3000000
== FinishBatch (<nil>)
UPDATE "Push Queue" AS pgclaim_t SET "Status" = $3
WHERE pgclaim_t."Job ID" = ANY(COALESCE($1, ARRAY(SELECT "Job ID" FROM "Push Queue" LIMIT 0))) AND (pgclaim_t."Status" = $4 AND pgclaim_t."fence" = ($2::bigint[])[width_bucket(pgclaim_t."fence", $2::bigint[])] AND pgclaim_t."Job ID" = (COALESCE($1, ARRAY(SELECT "Job ID" FROM "Push Queue" LIMIT 0)))[width_bucket(pgclaim_t."fence", $2::bigint[])]) IS TRUE
RETURNING width_bucket(pgclaim_t."fence", $2::bigint[])
  arg 0: []string [k1 k2]
  arg 1: []int64 [7 9]
  arg 2: string "DONE"
  arg 3: string "PROCESSING"
== Release (claim: claim lost: row is no longer held with this token)
UPDATE "Push Queue" SET "Status" = $1 WHERE "Job ID" = $2 AND ("Status" = $3 AND "fence" = $4) IS TRUE
  arg 0: string "PAUSED"
  arg 1: string "k1"
  arg 2: string "PROCESSING"
  arg 3: int64 7
== Sweep 0 (<nil>)
WITH pgclaim_c AS (
  SELECT "Job ID" FROM "Push Queue"
  WHERE "Status" = 'PROCESSING' AND "claimedAt" < statement_timestamp() - ($2::bigint * interval '1 microsecond')
  ORDER BY "claimedAt"
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
UPDATE "Push Queue" AS pgclaim_t SET "Status" = $3, "why" = ('claim: swept: ' || 'claimed at ' || to_char(pgclaim_t."claimedAt" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ', more than ' || $4 || ' ago' || ' (' || 'claim' || COALESCE(', fence ' || pgclaim_t."fence", '') || ')')
WHERE pgclaim_t."Job ID" = ANY(ARRAY(SELECT "Job ID" FROM pgclaim_c)) AND (pgclaim_t."Status" = 'PROCESSING' AND pgclaim_t."claimedAt" < statement_timestamp() - ($2::bigint * interval '1 microsecond')) IS TRUE
RETURNING pgclaim_t."Job ID", pgclaim_t."Status"::text, pgclaim_t."fence", ''::text, pgclaim_t."claimedAt", 0::bigint, pgclaim_t."why"
  arg 0: int 25
  arg 1: int64 120000000
  arg 2: string "FAILED"
  arg 3: string "2m0s"
`
