package main

import (
	"context"
	"fmt"
	"regexp"
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
)

// createPushRequests creates the field's push_requests table: 5 PAUSED rows,
// 3 in PROCESSING (claimed 30 h, 25 h and 1 h ago; the last one's lease
// passed a minute ago), 3 SENT and 1 FAILED.
func createPushRequests(t *testing.T, db *pgtest.Database) {
	t.Helper()
	exec1(t, db, `
CREATE TABLE push_requests (
    id          bigint PRIMARY KEY,
    status      text NOT NULL,
    claimed_at  timestamptz,
    claimed_by  text,
    attempts    int NOT NULL DEFAULT 0,
    lease_until timestamptz
)`)
	exec1(t, db, `
INSERT INTO push_requests (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 5) g;
INSERT INTO push_requests (id, status, claimed_at, claimed_by, attempts, lease_until) VALUES
 (10, 'PROCESSING', now() - interval '30 hours', 'host-a:101', 1, NULL),
 (11, 'PROCESSING', now() - interval '25 hours', 'host-a:101', 3, NULL),
 (12, 'PROCESSING', now() - interval '1 hour',   'host-b:202', 1, now() - interval '1 minute'),
 (20, 'SENT',       now() - interval '50 hours', 'host-b:202', 1, NULL),
 (21, 'SENT',       now() - interval '49 hours', 'host-b:202', 1, NULL),
 (22, 'SENT',       now() - interval '48 hours', 'host-b:202', 1, NULL),
 (30, 'FAILED',     now() - interval '72 hours', 'host-a:101', 3, NULL)`)
}

func TestClaims(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)

	r := cli(t, "", "claims", "--table", "push_requests", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	re := regexp.MustCompile(`^table "push_requests", state column "status"

STATE       ROWS
FAILED      1
PAUSED      5
PROCESSING  3
SENT        3

PROCESSING: 3 rows, oldest claimed 30h ago \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?Z\); 2 stale \(claimed more than 24h ago\)
see what a sweep would move: pgclaim sweep --table push_requests --older-than 24h --to FAILED --dry-run
$`)
	if !re.MatchString(r.stdout) {
		t.Errorf("claims:\n%s", r.stdout)
	}

	r = cli(t, "", "claims", "--table", "push_requests", "--json", "--stale-after", "26h", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[claimsJSON](t, r.stdout)
	want := []stateCountJSON{{State: "FAILED", Rows: 1}, {State: "PAUSED", Rows: 5}, {State: "PROCESSING", Rows: 3}, {State: "SENT", Rows: 3}}
	if fmt.Sprint(out.States) != fmt.Sprint(want) {
		t.Errorf("states = %v, want %v", out.States, want)
	}
	if out.Table != `"push_requests"` || out.Processing != "PROCESSING" || out.ProcessingRows != 3 || out.Stale != 1 ||
		out.StaleAfterSeconds != 26*3600 || out.OldestAgeSeconds == nil || *out.OldestAgeSeconds < 30*3600 ||
		*out.OldestAgeSeconds > 30*3600+60 || out.OldestClaimedAt == nil {
		t.Errorf("claims JSON = %+v", out)
	}

	// With the lease column, a row whose lease passed is stale too.
	r = cli(t, "", "claims", "--table", "push_requests", "--lease-until", "lease_until", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "claims --lease-until", r.stdout,
		"3 stale (lease passed, or no lease and claimed more than 24h ago)",
		"pgclaim sweep --table push_requests --lease-until lease_until --older-than 24h --to FAILED --dry-run")

	// Another state column and processing state, on a schema-qualified table
	// with names that need quoting.
	exec1(t, db, `CREATE SCHEMA "Ops"; CREATE TABLE "Ops"."Jobs" ("Key" int PRIMARY KEY, "State" text, "Taken At" timestamptz);
INSERT INTO "Ops"."Jobs" VALUES (1, 'busy', now() - interval '2 hours'), (2, 'idle', NULL)`)
	r = cli(t, "", "claims", "--table", "Ops.Jobs", "--state", "State", "--claimed-at", "Taken At",
		"--processing", "busy", "--stale-after", "1h", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "claims on Ops.Jobs", r.stdout, `table "Ops"."Jobs", state column "State"`,
		"busy   1\nidle   1\n", "busy: 1 row, oldest claimed 2h ago",
		"pgclaim sweep --table Ops.Jobs --state State --claimed-at 'Taken At' --processing busy --older-than 1h --to FAILED --dry-run")

	// An empty table.
	exec1(t, db, `TRUNCATE push_requests`)
	r = cli(t, "", "claims", "--table", "push_requests", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := "table \"push_requests\", state column \"status\"\n\nSTATE      ROWS\n(no rows)  0\n\nPROCESSING: no rows\n"; r.stdout != want {
		t.Errorf("empty table:\n%q\nwant\n%q", r.stdout, want)
	}
}

func TestClaimsErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Unmigrated, and no such table: the hint asks whether the URL names
	// the right database.
	empty := unmigrated(t)
	r := cli(t, "", "claims", "--table", "push_requests", "--database-url", empty.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		fmt.Sprintf("pgclaim claims: table \"push_requests\" (--table) does not exist in database %q\n", empty.Name),
		"has no pgclaim tables either: is the URL the service's database? (if it is, run 'pgclaim migrate up'")
	// Counting claims needs only the table, not pgclaim's schema.
	createPushRequests(t, empty)
	r = cli(t, "", "claims", "--table", "push_requests", "--json", "--database-url", empty.URL)
	wantCode(t, r, exitOK)
	if out := decodeJSON[claimsJSON](t, r.stdout); out.Stale != 2 {
		t.Errorf("claims on an unmigrated database = %+v", out)
	}

	db := pgtest.NewDatabase(t)
	r = cli(t, "", "claims", "--table", "push_requests", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, `pgclaim claims: table "push_requests" (--table) does not exist in database`,
		"hint: check --table; qualify it as schema.table")
	if regexp.MustCompile(`no pgclaim tables`).MatchString(r.stderr) {
		t.Errorf("migrated database reported without pgclaim tables:\n%s", r.stderr)
	}

	createPushRequests(t, db)
	r = cli(t, "", "claims", "--table", "push_requests", "--claimed-at", "stamped_at", "--database-url", db.URL)
	wantCode(t, r, exitError)
	if want := "pgclaim claims: table \"push_requests\" has no column \"stamped_at\" (--claimed-at)\n" +
		"hint: name the column with --claimed-at; the columns of \"push_requests\" are: id, status, claimed_at, claimed_by, attempts, lease_until\n"; r.stderr != want {
		t.Errorf("missing column: stderr = %q, want %q", r.stderr, want)
	}
	r = cli(t, "", "claims", "--table", "push_requests", "--state", "state", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, `table "push_requests" has no column "state" (--state)`)

	// A view is not a table; a name with two dots is bad input.
	if _, err := db.Pool.Exec(ctx, `CREATE VIEW pr AS SELECT * FROM push_requests`); err != nil {
		t.Fatal(err)
	}
	r = cli(t, "", "claims", "--table", "pr", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, `"pr" (--table) is not a table`)
	r = cli(t, "", "claims", "--table", "a.b.c", "--database-url", db.URL)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, `pgclaim claims: --table: "a.b.c" has more than one '.'`)
}

// TestClaimsReasons: a sweep with --reason records why each row moved, and
// claims --reason lists the reasons, grouping rows failed for the same
// cause although their times and tokens differ.
func TestClaimsReasons(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)
	exec1(t, db, `ALTER TABLE push_requests ADD COLUMN fence bigint, ADD COLUMN why text`)
	exec1(t, db, `UPDATE push_requests SET why = 'upstream 503', fence = 7 WHERE id = 30`)
	exec1(t, db, `INSERT INTO push_requests (id, status, claimed_at, claimed_by, attempts, fence) VALUES
	 (13, 'PROCESSING', now() - interval '28 hours', 'host-a:101', 1, 40),
	 (14, 'PROCESSING', now() - interval '27 hours', 'host-a:101', 1, 41)`)

	r := cli(t, "", "sweep", "--table", "push_requests", "--older-than", "24h", "--to", "FAILED", "--ignore-lease", "--yes",
		"--claimed-by", "claimed_by", "--attempts", "attempts", "--reason", "why", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	var n int
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM push_requests WHERE status = 'FAILED' AND why LIKE 'claim: swept: claimed at %, more than 24h0m0s ago (claim by host-a:101, attempt _)'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Fatalf("%d swept rows with the sweeper's reason, want 4 (rows 10, 11, 13, 14)", n)
	}
	// Two rows a service's sweeper failed: their reasons differ only in
	// time and fence.
	exec1(t, db, `INSERT INTO push_requests (id, status, why) VALUES
	 (31, 'FAILED', 'claim: swept: lease expired at 2026-11-29T09:00:05.123456Z (claim by host-b:202, fence 42, attempt 3)'),
	 (32, 'FAILED', 'claim: swept: lease expired at 2026-11-29T09:01:17.5Z (claim by host-b:202, fence 57, attempt 3)')`)

	r = cli(t, "", "claims", "--table", "push_requests", "--reason", "why", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[claimsJSON](t, r.stdout)
	want := []reasonJSON{
		{State: "FAILED", Reason: "claim: swept: claimed at <time>, more than 24h0m0s ago (claim by host-a:101, attempt 1)", Rows: 3},
		{State: "FAILED", Reason: "claim: swept: lease expired at <time> (claim by host-b:202, attempt 3)", Rows: 2},
		{State: "FAILED", Reason: "claim: swept: claimed at <time>, more than 24h0m0s ago (claim by host-a:101, attempt 3)", Rows: 1},
		{State: "FAILED", Reason: "upstream 503", Rows: 1},
	}
	if fmt.Sprint(out.Reasons) != fmt.Sprint(want) {
		t.Errorf("reasons:\n%v\nwant\n%v", out.Reasons, want)
	}
	r = cli(t, "", "claims", "--table", "push_requests", "--reason", "why", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "claims --reason", r.stdout, "REASON (commonest first", "FAILED  3     claim: swept: claimed at <time>", "upstream 503")

	r = cli(t, "", "claims", "--table", "push_requests", "--reason", "nope", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "claims --reason nope", r.stderr, `no column "nope" (--reason)`)
}
