package rolling_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

// need ends the test when something it needs is missing: a failure under
// CI=true, a skip elsewhere (and under CI when .ci/run found a shallow clone
// whose history it could not fetch, PGCLAIM_ROLLING_NO_HISTORY).
func need(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" && os.Getenv("PGCLAIM_ROLLING_NO_HISTORY") == "" {
		t.Fatalf("%s: %v", what, err)
	}
	t.Skipf("%s: %v", what, err)
}

// previousRelease returns the newest commit that changed a migration and
// whose set of migration files differs from HEAD's: the release a running
// deployment has when the current migrations arrive (a commit that only
// edited a migration not yet released is the current release still).
func previousRelease(root string) (string, error) {
	out, err := exec.Command("git", "-C", root, "log", "--format=%H", "--", "sql/migrations/*.sql").Output()
	if err != nil {
		return "", fmt.Errorf("git log -- sql/migrations: %w", err)
	}
	// The migrations of a commit: its .sql files, not the Go beside them
	// (a new doc.go is no release).
	files := func(rev string) (string, error) {
		out, err := exec.Command("git", "-C", root, "ls-tree", "--name-only", rev, "sql/migrations/").Output()
		if err != nil {
			return "", fmt.Errorf("git ls-tree %s sql/migrations: %w", rev, err)
		}
		var sqls []string
		for _, f := range strings.Fields(string(out)) {
			if strings.HasSuffix(f, ".sql") {
				sqls = append(sqls, f)
			}
		}
		return strings.Join(sqls, "\n"), nil
	}
	current, err := files("HEAD")
	if err != nil {
		return "", err
	}
	// The newest commit with other migration files: one that only edited
	// a migration not released yet is the current release still.
	for _, c := range strings.Fields(string(out)) {
		theirs, err := files(c)
		if err != nil {
			return "", err
		}
		if theirs != current {
			return c, nil
		}
	}
	return "", fmt.Errorf("no earlier commit changed sql/migrations (a shallow clone? fetch the history)")
}

// goEnv builds outside any workspace, with the local toolchain; -mod=mod
// lets an older tree's go.sum be completed from the module cache (or the
// Go proxy).
func goEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod -buildvcs=false")
}

func run(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = goEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// buildPrevious builds this package's workload from the tree of commit c,
// with the workload's current source (it uses only API both releases have).
func buildPrevious(root, c, tmp string) (string, error) {
	src := filepath.Join(tmp, "prev")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := filepath.Join(tmp, "prev.tar")
	if err := run(root, "git", "archive", "--format=tar", "-o", archive, c); err != nil {
		return "", err
	}
	if err := run(src, "tar", "-xf", archive); err != nil {
		return "", err
	}
	code, err := os.ReadFile(filepath.Join(root, "harness", "rolling", "workload", "main.go"))
	if err != nil {
		return "", err
	}
	wl := filepath.Join(src, "harness", "rolling", "workload")
	if err := os.MkdirAll(wl, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(wl, "main.go"), code, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(tmp, "workload-prev")
	return bin, run(src, "go", "build", "-o", bin, "./harness/rolling/workload")
}

// instance is one workload process.
type instance struct {
	holder  string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  *bufio.Scanner
	stderr  bytes.Buffer
	summary summary
}

type summary struct {
	Holder  string `json:"holder"`
	Runs    int64  `json:"runs"`
	Claimed int64  `json:"claimed"`
}

func start(t *testing.T, bin, url, holder string) *instance {
	t.Helper()
	in := &instance{holder: holder, cmd: exec.Command(bin, holder)}
	in.cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	in.cmd.Stderr = &in.stderr
	var err error
	if in.stdin, err = in.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := in.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in.stdout = bufio.NewScanner(out)
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.cmd.Process.Kill()
		if t.Failed() && in.stdin != nil {
			_ = in.cmd.Wait()
			if s := strings.TrimSpace(in.stderr.String()); s != "" {
				t.Logf("%s logged:\n%s", holder, s)
			}
		}
	})
	started := make(chan bool, 1)
	go func() { started <- in.stdout.Scan() && in.stdout.Text() == "started" }()
	select {
	case ok := <-started:
		if !ok {
			_ = in.cmd.Wait()
			t.Fatalf("%s did not start: %s", holder, in.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no start in 30 s: %s", holder, in.stderr.String())
	}
	return in
}

// stop closes the instance's input, waits for it to end, and reads its
// summary.
func (in *instance) stop(t *testing.T) {
	t.Helper()
	_ = in.stdin.Close()
	var line string
	if in.stdout.Scan() {
		line = in.stdout.Text()
	}
	if err := in.cmd.Wait(); err != nil {
		t.Errorf("%s: %v: %s", in.holder, err, in.stderr.String())
		return
	}
	if err := json.Unmarshal([]byte(line), &in.summary); err != nil {
		t.Errorf("%s: summary %q: %v", in.holder, line, err)
	}
	// The instances log at Warn and above: anything logged is a problem.
	if s := strings.TrimSpace(in.stderr.String()); s != "" {
		t.Errorf("%s logged:\n%s", in.holder, s)
	}
}

const tables = `
CREATE TABLE rolling_runs (
    instant timestamptz NOT NULL,
    holder  text        NOT NULL,
    fence   bigint      NOT NULL,
    attempt integer     NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE rolling_items (
    id          bigint PRIMARY KEY,
    status      text NOT NULL,
    claimed_at  timestamptz,
    claimed_by  text,
    fence       bigint,
    lease_until timestamptz,
    attempts    int NOT NULL DEFAULT 0,
    reason      text
);
CREATE INDEX rolling_items_paused ON rolling_items (id) WHERE status = 'PAUSED';
CREATE TABLE rolling_effects (
    id     bigint      NOT NULL,
    holder text        NOT NULL,
    fence  bigint      NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// TestRollingUpgrade runs two instances of the previous release (the
// newest commit that changed sql/migrations before the current ones),
// applies the current migrations while they run, starts two current
// instances beside them, stops the old ones, then the new: every instant of
// the shared schedule runs once, every row is claimed and finished once,
// and no instance reports an error.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	prev, err := previousRelease(root)
	need(t, err, "find the previous release")
	tmp := t.TempDir()
	began := time.Now()
	oldBin, err := buildPrevious(root, prev, tmp)
	need(t, err, "build the previous release "+prev[:12])
	newBin := filepath.Join(tmp, "workload")
	if err := run(root, "go", "build", "-o", newBin, "./harness/rolling/workload"); err != nil {
		t.Fatal(err)
	}
	t.Logf("previous release %s; both built in %v", prev[:12], time.Since(began).Round(time.Millisecond))

	db := pgtest.NewDatabaseFrom(t, pgtest.Template{Name: "empty", Unmigrated: true})
	if _, err := db.Pool.Exec(ctx, tables); err != nil {
		t.Fatal(err)
	}
	// Rows to claim arrive all along: 10 every 100 ms.
	var (
		produced  int64
		stopProd  = make(chan struct{})
		prodDone  = make(chan error, 1)
		prodMu    sync.Mutex
		producing = func() int64 { prodMu.Lock(); defer prodMu.Unlock(); return produced }
	)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopProd:
				prodDone <- nil
				return
			case <-tick.C:
			}
			prodMu.Lock()
			_, err := db.Pool.Exec(ctx, `INSERT INTO rolling_items (id, status) SELECT g, 'PAUSED' FROM generate_series($1::bigint + 1, $1::bigint + 10) g`, produced)
			if err == nil {
				produced += 10
			}
			prodMu.Unlock()
			if err != nil {
				prodDone <- err
				return
			}
		}
	}()

	old := []*instance{start(t, oldBin, db.URL, "prev-1"), start(t, oldBin, db.URL, "prev-2")}
	waitFor(t, db, 10*time.Second, "the previous release's first runs and claims",
		`SELECT (SELECT count(*) FROM rolling_runs) >= 2 AND (SELECT count(*) FROM rolling_effects) >= 20`)
	before, err := pgclaim.MigrationStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var migratedAt time.Time
	if err := pgclaim.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("current migrations while the previous release runs: %v", err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&migratedAt); err != nil {
		t.Fatal(err)
	}
	var pending []string
	for _, m := range before {
		if !m.Applied {
			pending = append(pending, m.Name)
		}
	}
	t.Logf("applied while the previous release ran: %s", strings.Join(pending, ", "))
	if len(pending) == 0 {
		t.Errorf("the previous release left no migration to apply: the test proves nothing")
	}
	cur := []*instance{start(t, newBin, db.URL, "cur-1"), start(t, newBin, db.URL, "cur-2")}
	time.Sleep(4 * time.Second)
	for _, in := range old {
		in.stop(t)
	}
	time.Sleep(2 * time.Second)
	close(stopProd)
	if err := <-prodDone; err != nil {
		t.Fatalf("producing rows: %v", err)
	}
	waitFor(t, db, 60*time.Second, "every row finished",
		`SELECT NOT EXISTS (SELECT FROM rolling_items WHERE status <> 'DONE')`)
	var until time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT date_trunc('second', clock_timestamp()) - interval '2 seconds'`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	waitFor(t, db, 10*time.Second, "every instant up to "+until.Format(time.TimeOnly)+" decided",
		`SELECT NOT EXISTS (SELECT FROM pgclaim_schedule_runs WHERE instant <= $1 AND state NOT IN ('succeeded', 'failed', 'skipped'))`, until)
	for _, in := range cur {
		in.stop(t)
	}
	t.Logf("ran %v; instances: %+v %+v %+v %+v", time.Since(began).Round(time.Millisecond),
		old[0].summary, old[1].summary, cur[0].summary, cur[1].summary)

	// No lost instant: every second from the first up to until ran, once.
	var first time.Time
	var missing, notSucceeded []time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT min(instant) FROM pgclaim_schedule_runs WHERE schedule = 'rolling-tick'`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	missing = times(t, db, `SELECT g FROM generate_series($1::timestamptz, $2, interval '1 second') g
		WHERE NOT EXISTS (SELECT FROM rolling_runs WHERE instant = g) ORDER BY g`, first, until)
	notSucceeded = times(t, db, `SELECT instant FROM pgclaim_schedule_runs
		WHERE schedule = 'rolling-tick' AND instant <= $1 AND state <> 'succeeded' ORDER BY instant`, until)
	dupRuns := times(t, db, `SELECT instant FROM rolling_runs GROUP BY instant HAVING count(*) > 1 ORDER BY instant`)
	t.Logf("instants %s .. %s", first.Format(time.TimeOnly), until.Format(time.TimeOnly))
	if len(missing) > 0 {
		t.Errorf("instants that never ran: %v", missing)
	}
	if len(notSucceeded) > 0 {
		t.Errorf("instants not succeeded: %v", notSucceeded)
	}
	if len(dupRuns) > 0 {
		t.Errorf("instants run more than once: %v", dupRuns)
	}

	// No duplicate, no lost row: each produced row finished once.
	var rows, effects, distinct, oldAfter int64
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM rolling_items), count(*), count(DISTINCT id),
		count(*) FILTER (WHERE holder LIKE 'prev-%' AND at > $1) FROM rolling_effects`, migratedAt).
		Scan(&rows, &effects, &distinct, &oldAfter); err != nil {
		t.Fatal(err)
	}
	t.Logf("rows %d produced, %d effects (%d distinct); the previous release finished %d after the migrations", rows, effects, distinct, oldAfter)
	if rows != producing() || effects != rows || distinct != rows {
		t.Errorf("rows %d (produced %d), effects %d, distinct %d: want each row finished exactly once", rows, producing(), effects, distinct)
	}
	if oldAfter == 0 {
		t.Errorf("the previous release claimed nothing after the current migrations applied")
	}
}

func waitFor(t *testing.T, db *pgtest.Database, d time.Duration, what, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var ok bool
		if err := db.Pool.QueryRow(context.Background(), query, args...).Scan(&ok); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var left string
			_ = db.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s by %s: %s', status, coalesce(claimed_by, '-'), n), '; '), '')
				FROM (SELECT status, claimed_by, count(*) n FROM rolling_items WHERE status <> 'DONE' GROUP BY 1, 2) s`).Scan(&left)
			t.Fatalf("%s: not after %v (rows not done: %s)", what, d, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func times(t *testing.T, db *pgtest.Database, query string, args ...any) []time.Time {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var v time.Time
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
