package main

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
)

// snapshot returns every row of push_requests as "id status claimed_by
// attempts claimed_at", by id.
func snapshot(t *testing.T, db *pgtest.Database) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT concat_ws(' ', id, status, claimed_by, attempts, claimed_at) FROM push_requests ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// states returns id → status of push_requests.
func states(t *testing.T, db *pgtest.Database) map[int64]string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT id, status FROM push_requests`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			t.Fatal(err)
		}
		out[id] = s
	}
	return out
}

// sweepArgs sweep push_requests by claim age, without asking.
var sweepArgs = []string{"sweep", "--table", "push_requests", "--older-than", "24h", "--to", "FAILED", "--ignore-lease", "--yes"}

func TestSweepDryRun(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)
	before := snapshot(t, db)

	r := cli(t, "", append(sweepArgs, "--dry-run", "--claimed-by", "claimed_by", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	re := regexp.MustCompile(`^dry run: would move 2 stale rows of "push_requests" from PROCESSING to FAILED

KEY  CLAIMED AT +AGE  CLAIMED BY  TO
10   \S+ \S+ +30h  host-a:101  FAILED
11   \S+ \S+ +25h  host-a:101  FAILED
$`)
	if !re.MatchString(r.stdout) {
		t.Errorf("dry run:\n%s", r.stdout)
	}
	if r.stderr != "" {
		t.Errorf("stderr = %q", r.stderr)
	}

	r = cli(t, "", append(sweepArgs, "--dry-run", "--json", "--show", "1", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	out := decodeJSON[sweepJSON](t, r.stdout)
	if !out.DryRun || out.Stale != 2 || out.Moved != 0 || len(out.Rows) != 1 || out.Rows[0].Key != "10" ||
		out.Rows[0].To != "FAILED" || !out.Truncated || out.Rows[0].AgeSeconds == nil || *out.Rows[0].AgeSeconds < 30*3600 {
		t.Errorf("dry run JSON = %+v", out)
	}

	// With retries: row 10 has attempts left, row 11 has not.
	r = cli(t, "", append(sweepArgs, "--dry-run", "--retry", "PAUSED", "--max-attempts", "3", "--attempts", "attempts", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	wantContains(t, "dry run with retry", r.stdout, "would move 2 stale rows of \"push_requests\" from PROCESSING to PAUSED or FAILED\n",
		"(1 to FAILED, 1 to PAUSED, among those listed)\n")
	if !regexp.MustCompile(`(?m)^10 .* PAUSED$`).MatchString(r.stdout) || !regexp.MustCompile(`(?m)^11 .* FAILED$`).MatchString(r.stdout) {
		t.Errorf("dry run with retry:\n%s", r.stdout)
	}

	if after := snapshot(t, db); !reflect.DeepEqual(before, after) {
		t.Errorf("a dry run changed the table:\nbefore %v\nafter  %v", before, after)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)
	before := states(t, db)

	r := cli(t, "", append(sweepArgs, "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	re := regexp.MustCompile(`^moved 2 rows of "push_requests" from PROCESSING to FAILED

KEY  CLAIMED AT +TO
1[01]   \S+ \S+ +FAILED
1[01]   \S+ \S+ +FAILED
$`)
	if !re.MatchString(r.stdout) {
		t.Errorf("sweep:\n%s", r.stdout)
	}
	if r.stderr != "" {
		t.Errorf("no progress expected for one batch; stderr = %q", r.stderr)
	}
	after := states(t, db)
	for id, s := range before {
		want := s
		if id == 10 || id == 11 {
			want = "FAILED"
		}
		if after[id] != want {
			t.Errorf("row %d: %s → %s, want %s", id, s, after[id], want)
		}
	}

	// Nothing left to move.
	r = cli(t, "", append(sweepArgs, "--json", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 0 || out.Stale != 0 || len(out.Rows) != 0 {
		t.Errorf("second sweep = %+v", out)
	}

	// Leases: with --lease-until alone, only the row whose lease passed.
	r = cli(t, "", "sweep", "--table", "push_requests", "--lease-until", "lease_until", "--to", "FAILED", "--yes", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 1 || len(out.Rows) != 1 || out.Rows[0].Key != "12" {
		t.Errorf("lease sweep = %+v", out)
	}
	if s := states(t, db)[12]; s != "FAILED" {
		t.Errorf("row 12 is %s", s)
	}
}

func TestSweepRetry(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)
	r := cli(t, "", append(sweepArgs, "--retry", "PAUSED", "--max-attempts", "3", "--attempts", "attempts", "--json", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	out := decodeJSON[sweepJSON](t, r.stdout)
	if out.Moved != 2 || out.ByState["PAUSED"] != 1 || out.ByState["FAILED"] != 1 || out.Retry != "PAUSED" {
		t.Errorf("sweep with retry = %+v", out)
	}
	st := states(t, db)
	if st[10] != "PAUSED" || st[11] != "FAILED" || st[12] != "PROCESSING" {
		t.Errorf("states after sweep with retry: 10=%s 11=%s 12=%s", st[10], st[11], st[12])
	}
}

// TestSweepLarge sweeps more rows than one batch holds: progress goes to
// stderr per batch (not with --json), and every stale row moves once.
func TestSweepLarge(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)
	exec1(t, db, `INSERT INTO push_requests (id, status, claimed_at, claimed_by)
SELECT g, 'PROCESSING', now() - interval '2 days', 'host-z:9' FROM generate_series(1000, 3497) g`)

	r := cli(t, "", append(sweepArgs, "--batch", "1000", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	if want := "swept 1000 / ~2500\nswept 2000 / ~2500\nswept 2500 / ~2500\n"; r.stderr != want {
		t.Errorf("progress = %q, want %q", r.stderr, want)
	}
	wantContains(t, "stdout", r.stdout, "moved 2500 rows of \"push_requests\" from PROCESSING to FAILED\n", "… and 2480 more\n")
	if n := len(regexp.MustCompile(`(?m)^\d+ +\S+ \S+ +FAILED$`).FindAllString(r.stdout, -1)); n != 20 {
		t.Errorf("%d rows listed, want 20 (--show)", n)
	}
	var processing, failed int
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FILTER (WHERE status = 'PROCESSING'), count(*) FILTER (WHERE status = 'FAILED') FROM push_requests`).
		Scan(&processing, &failed); err != nil {
		t.Fatal(err)
	}
	if processing != 1 || failed != 2501 {
		t.Errorf("after the sweep: %d PROCESSING (want 1: row 12), %d FAILED (want 2501)", processing, failed)
	}

	exec1(t, db, `UPDATE push_requests SET status = 'PROCESSING' WHERE id >= 1000`)
	r = cli(t, "", append(sweepArgs, "--batch", "1000", "--json", "--database-url", db.URL)...)
	wantCode(t, r, exitOK)
	if r.stderr != "" {
		t.Errorf("progress printed with --json: %q", r.stderr)
	}
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 2498 || out.Stale != 2498 || len(out.Rows) != 20 || !out.Truncated {
		t.Errorf("JSON sweep = moved %d, stale %d, %d rows listed", out.Moved, out.Stale, len(out.Rows))
	}
}

func TestSweepErrors(t *testing.T) {
	t.Parallel()

	empty := unmigrated(t)
	r := cli(t, "", append(sweepArgs, "--database-url", empty.URL)...)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		fmt.Sprintf("pgclaim sweep: table \"push_requests\" (--table) does not exist in database %q\n", empty.Name),
		"has no pgclaim tables either", "run 'pgclaim migrate up'")
	// Sweeping a table of the service needs only that table.
	createPushRequests(t, empty)
	r = cli(t, "", append(sweepArgs, "--json", "--database-url", empty.URL)...)
	wantCode(t, r, exitOK)
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 2 {
		t.Errorf("sweep on an unmigrated database = %+v", out)
	}

	db := pgtest.NewDatabase(t)
	createPushRequests(t, db)
	before := snapshot(t, db)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--claimed-by", "owner"}, exitError,
			"pgclaim sweep: table \"push_requests\" has no column \"owner\" (--claimed-by)\nhint: name the column with --claimed-by; the columns of \"push_requests\" are: id, status, claimed_at,"},
		{[]string{"--key", "uid"}, exitError, `table "push_requests" has no column "uid" (--key)`},
		{[]string{"--claimed-at", "claimed_by"}, exitError, `pgclaim sweep: --claimed-at: column "claimed_by" has type text; want timestamp with time zone`},
		{[]string{"--key", "claimed_by"}, exitError, `pgclaim sweep: --key: column "claimed_by" has no primary key or unique index of its own`},
		{[]string{"--retry", "PAUSED", "--max-attempts", "3"}, exitUsage, "pgclaim sweep: --attempts: must be set: --retry needs it"},
		{[]string{"--retry", "PAUSED"}, exitUsage, "pgclaim sweep: --max-attempts: must be positive when --retry is set"},
		{[]string{"--processing", "FAILED"}, exitUsage, "pgclaim sweep: --to: must differ from --processing"},
	} {
		r := cli(t, "", append(append(append([]string{}, sweepArgs...), c.args...), "--database-url", db.URL)...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: want exit %d and %q, got %s", c.args, c.code, c.want, r)
		}
	}
	if after := snapshot(t, db); !reflect.DeepEqual(before, after) {
		t.Errorf("a refused sweep changed the table")
	}
}

// TestSweepEnumAndUUID sweeps a table whose state is an enum and whose key
// is a uuid, and prints the keys as uuids.
func TestSweepEnumAndUUID(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	exec1(t, db, `
CREATE TYPE job_state AS ENUM ('queued', 'running', 'done', 'dead');
CREATE TABLE jobs (id uuid PRIMARY KEY, state job_state NOT NULL, claimed_at timestamptz);
INSERT INTO jobs VALUES
 ('00000000-0000-0000-0000-00000000000a', 'running', now() - interval '3 hours'),
 ('00000000-0000-0000-0000-00000000000b', 'running', now() - interval '1 minute'),
 ('00000000-0000-0000-0000-00000000000c', 'queued', NULL)`)
	args := []string{"--table", "jobs", "--state", "state", "--processing", "running", "--database-url", db.URL}

	r := cli(t, "", append([]string{"claims", "--stale-after", "1h"}, args...)...)
	wantCode(t, r, exitOK)
	wantContains(t, "claims", r.stdout, "queued   1\nrunning  2\n", "running: 2 rows, oldest claimed 3h ago", "1 stale")

	r = cli(t, "", append([]string{"sweep", "--older-than", "1h", "--to", "dead", "--dry-run"}, args...)...)
	wantCode(t, r, exitOK)
	wantContains(t, "dry run", r.stdout, "would move 1 stale row of \"jobs\" from running to dead", "\n00000000-0000-0000-0000-00000000000a  ")

	r = cli(t, "", append([]string{"sweep", "--older-than", "1h", "--to", "dead", "--yes"}, args...)...)
	wantCode(t, r, exitOK)
	wantContains(t, "sweep", r.stdout, "moved 1 row of \"jobs\" from running to dead", "\n00000000-0000-0000-0000-00000000000a  ")
	var state string
	if err := db.Pool.QueryRow(context.Background(), `SELECT state::text FROM jobs WHERE id = '00000000-0000-0000-0000-00000000000a'`).Scan(&state); err != nil || state != "dead" {
		t.Errorf("swept row is %q (%v)", state, err)
	}

	r = cli(t, "", append([]string{"sweep", "--older-than", "1h", "--to", "buried"}, args...)...)
	wantCode(t, r, exitError)
	if want := "pgclaim sweep: --to: \"buried\" is not a value of the state column's type job_state\nhint: the values of job_state are: queued, running, done, dead\n"; r.stderr != want {
		t.Errorf("stderr = %q, want %q", r.stderr, want)
	}
	r = cli(t, "", append([]string{"claims", "--stale-after", "1h"}, append(args, "--processing", "Running")...)...)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, `pgclaim claims: --processing: "Running" is not a value of the state column's type job_state`)
}

// createLeasedPushRequests is createPushRequests with row 13 claimed 30
// hours ago by a holder that still renews its lease.
func createLeasedPushRequests(t *testing.T, db *pgtest.Database) {
	t.Helper()
	createPushRequests(t, db)
	exec1(t, db, `INSERT INTO push_requests (id, status, claimed_at, claimed_by, attempts, lease_until) VALUES
	 (13, 'PROCESSING', now() - interval '30 hours', 'host-c:303', 1, now() + interval '10 minutes')`)
}

// TestSweepLiveLease: a sweep of a table with a lease column that does not
// name it (--lease-until) would move rows under a live lease; it is
// refused, dry run or not, and names the flags that say what is meant.
func TestSweepLiveLease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createLeasedPushRequests(t, db)
	before := snapshot(t, db)
	bare := []string{"sweep", "--table", "push_requests", "--older-than", "24h", "--to", "FAILED", "--database-url", db.URL}

	for _, extra := range [][]string{{}, {"--dry-run"}, {"--yes"}, {"--yes", "--json"}} {
		r := cli(t, "y\n", append(append([]string{}, bare...), extra...)...)
		wantCode(t, r, exitError)
		wantContains(t, "stderr", r.stderr,
			`pgclaim sweep: table "push_requests" has a lease column "lease_until" (timestamptz) that the sweep would ignore`,
			"hint: pass --lease-until lease_until", "--ignore-lease")
		if r.stdout != "" {
			t.Errorf("%v: stdout = %q", extra, r.stdout)
		}
	}
	if after := snapshot(t, db); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused sweep changed the table:\nbefore %v\nafter  %v", before, after)
	}

	r := cli(t, "", append(append([]string{}, bare...), "--ignore-lease", "--lease-until", "lease_until", "--yes")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "pgclaim sweep: --ignore-lease and --lease-until exclude each other")

	// With the lease column named, the row under a live lease stays.
	r = cli(t, "", append(append([]string{}, bare...), "--lease-until", "lease_until", "--yes", "--json")...)
	wantCode(t, r, exitOK)
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 3 {
		t.Errorf("sweep with --lease-until = %+v", out)
	}
	st := states(t, db)
	if st[10] != "FAILED" || st[11] != "FAILED" || st[12] != "FAILED" || st[13] != "PROCESSING" {
		t.Errorf("after a sweep with --lease-until: 10=%s 11=%s 12=%s 13=%s (want 13 left PROCESSING)", st[10], st[11], st[12], st[13])
	}

	// --ignore-lease: the operator means it; the old claim goes.
	r = cli(t, "", append(append([]string{}, bare...), "--ignore-lease", "--yes", "--json")...)
	wantCode(t, r, exitOK)
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 1 || len(out.Rows) != 1 || out.Rows[0].Key != "13" {
		t.Errorf("sweep with --ignore-lease = %+v", out)
	}
}

// TestSweepConfirms: without --yes a sweep shows what it would move and
// asks first, like release; nothing moves unless the answer is yes, and
// a sweep nobody can confirm (stdin not a terminal) is refused before it
// looks at the table.
func TestSweepConfirms(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	createLeasedPushRequests(t, db)
	before := snapshot(t, db)
	args := []string{"sweep", "--table", "push_requests", "--older-than", "24h", "--to", "FAILED",
		"--lease-until", "lease_until", "--claimed-by", "claimed_by", "--database-url", db.URL}

	for _, stdin := range []string{"n\n", "", "maybe\n"} {
		r := cli(t, stdin, args...)
		wantCode(t, r, exitError)
		re := regexp.MustCompile(`^would move 3 stale rows of "push_requests" from PROCESSING to FAILED

KEY  CLAIMED AT +AGE  CLAIMED BY  TO
10   \S+ \S+ +30h  host-a:101  FAILED
11   \S+ \S+ +25h  host-a:101  FAILED
12   \S+ \S+ +1h   host-b:202  FAILED

A holder still working on one of these rows loses it \(its finish fails\)\. Move them\? \[y/N\] \n?pgclaim sweep: not swept: no confirmation
hint: answer y, or pass --yes
$`)
		if !re.MatchString(r.stderr) {
			t.Errorf("stdin %q: stderr:\n%s", stdin, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("stdin %q: stdout = %q", stdin, r.stdout)
		}
	}

	// Not a terminal: refused without asking.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	if _, err := pw.WriteString("y\n"); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	r := cliEnv(t, pr, map[string]string{}, args...)
	wantCode(t, r, exitError)
	if want := "pgclaim sweep: refusing to sweep without confirmation: stdin is not a terminal\n" +
		"hint: pass --yes to sweep without asking, or --dry-run to see what would move\n"; r.stderr != want {
		t.Errorf("stdin a pipe: stderr = %q, want %q", r.stderr, want)
	}
	if after := snapshot(t, db); !reflect.DeepEqual(before, after) {
		t.Fatalf("an unconfirmed sweep changed the table:\nbefore %v\nafter  %v", before, after)
	}

	r = cli(t, "yes\n", append(args, "--json")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "would move 3 stale rows", "Move them? [y/N] ")
	if out := decodeJSON[sweepJSON](t, r.stdout); out.Moved != 3 || out.Stale != 3 {
		t.Errorf("confirmed sweep = %+v", out)
	}
	if st := states(t, db); st[10] != "FAILED" || st[11] != "FAILED" || st[12] != "FAILED" || st[13] != "PROCESSING" {
		t.Errorf("after the confirmed sweep: %v", st)
	}

	// Nothing stale: nothing to ask.
	r = cli(t, "", args...)
	wantCode(t, r, exitOK)
	if r.stdout != "moved 0 rows of \"push_requests\" from PROCESSING to FAILED\n" || r.stderr != "" {
		t.Errorf("sweep with nothing stale: %s", r)
	}
}
