package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// result is one run of the CLI.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs pgclaim in-process with args, stdin and no environment.
func cli(t testing.TB, stdin string, args ...string) result {
	t.Helper()
	return cliEnv(t, strings.NewReader(stdin), map[string]string{}, args...)
}

func cliEnv(t testing.TB, stdin io.Reader, environ map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	e := &env{stdin: stdin, stdout: &out, stderr: &errb, getenv: func(k string) string { return environ[k] }}
	code := runEnv(ctx, e, args)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// wantCode fails the test unless r exited with code.
func wantCode(t testing.TB, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
}

// wantContains fails unless s contains every sub.
func wantContains(t testing.TB, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s does not contain %q:\n%s", what, sub, s)
		}
	}
}

func decodeJSON[T any](t testing.TB, s string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stdout is not the expected JSON: %v\n%s", err, s)
	}
	return v
}

var emptyTemplate = pgtest.Template{Name: "cli_empty", Unmigrated: true}

// unmigrated returns a database without pgclaim's schema.
func unmigrated(t *testing.T) *pgtest.Database {
	return pgtest.NewDatabaseFrom(t, emptyTemplate)
}

func exec1(t testing.TB, db *pgtest.Database, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// refusedURL names a local port nothing listens on.
func refusedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "postgres://postgres:secret@" + addr + "/app?connect_timeout=5"
}

// Every subcommand with the arguments it needs to reach the database.
var subcommands = []struct {
	name string
	args []string
}{
	{"migrate", []string{"migrate", "status"}},
	{"ticks", []string{"ticks"}},
	{"locks", []string{"locks"}},
	{"claims", []string{"claims", "--table", "push_requests"}},
	{"sweep", []string{"sweep", "--table", "push_requests", "--older-than", "24h", "--to", "FAILED"}},
	{"release", []string{"release", "--lock", "report", "--yes"}},
}

// Subcommands that never connect.
var offline = []string{"schema"}

func TestBadURL(t *testing.T) {
	t.Parallel()
	refused := refusedURL(t)
	for _, sc := range subcommands {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()

			r := cli(t, "", append(sc.args, "--database-url", "postgres://postgres:secret@localhost:notaport/app")...)
			wantCode(t, r, exitError)
			wantContains(t, "stderr", r.stderr,
				"pgclaim "+sc.name+": invalid database URL: ",
				"hint: set the URL with --database-url or the DATABASE_URL environment variable")
			if strings.Contains(r.stderr, "secret") {
				t.Errorf("the password is printed:\n%s", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout not empty: %q", r.stdout)
			}

			r = cli(t, "", append(sc.args, "--database-url", refused)...)
			wantCode(t, r, exitError)
			host := strings.TrimSuffix(strings.TrimPrefix(refused, "postgres://postgres:secret@"), "/app?connect_timeout=5")
			wantContains(t, "stderr", r.stderr,
				fmt.Sprintf("pgclaim %s: cannot connect to PostgreSQL at %s (user \"postgres\", database \"app\"): connection refused\n", sc.name, host),
				"hint: is the server running and listening on that address? To use another server, set the URL with --database-url or the DATABASE_URL")
			if strings.Contains(r.stderr, "secret") {
				t.Errorf("the password is printed:\n%s", r.stderr)
			}

			// No URL at all is a usage error.
			r = cli(t, "", sc.args...)
			wantCode(t, r, exitUsage)
			wantContains(t, "stderr", r.stderr, "pgclaim "+sc.name+": no database URL: set the URL with --database-url or the DATABASE_URL")
		})
	}
}

func TestMissingDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	url := db.Server.DatabaseURL("pgclaim_cli_no_such_db")
	r := cli(t, "", "ticks", "--database-url", url)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, `database "pgclaim_cli_no_such_db" does not exist`, "hint: check the database name in the URL")
}

func TestURLFromEnvironment(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	r := cliEnv(t, strings.NewReader(""), map[string]string{"DATABASE_URL": db.URL}, "ticks")
	wantCode(t, r, exitOK)
	if r.stdout != "no ticks recorded\n" {
		t.Errorf("stdout = %q", r.stdout)
	}
	// The flag wins over the environment.
	r = cliEnv(t, strings.NewReader(""), map[string]string{"DATABASE_URL": refusedURL(t)}, "ticks", "--database-url", db.URL)
	wantCode(t, r, exitOK)
}

// TestRun calls run, the entry point main uses, with a URL flag.
func TestRun(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"ticks", "--database-url", db.URL, "--json"}, strings.NewReader(""), &out, &errb)
	if code != exitOK || out.String() != "[]\n" || errb.Len() != 0 {
		t.Errorf("run = %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	r := cli(t, "")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "Usage:\n  pgclaim COMMAND [flags]", "  migrate  ", "  release  ")

	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		r = cli(t, "", args...)
		wantCode(t, r, exitOK)
		wantContains(t, "stdout", r.stdout, "Commands:\n  migrate    apply pgclaim's migrations") // aligned with "schedules"
	}

	r = cli(t, "", "frobnicate")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, `pgclaim: unknown command "frobnicate"`)

	r = cli(t, "", "help", "frobnicate")
	wantCode(t, r, exitUsage)

	names := offline
	for _, sc := range subcommands {
		names = append(names, sc.name)
	}
	for _, name := range names {
		sc := struct{ name string }{name}
		for _, args := range [][]string{{sc.name, "-h"}, {sc.name, "--help"}, {"help", sc.name}} {
			r = cli(t, "", args...)
			wantCode(t, r, exitOK)
			wantContains(t, "stdout", r.stdout, "Usage: pgclaim "+sc.name, "Flags:", "  --database-url URL", "  --json\n")
			if r.stderr != "" {
				t.Errorf("%v: stderr = %q", args, r.stderr)
			}
		}
		r = cli(t, "", sc.name, "--no-such-flag")
		wantCode(t, r, exitUsage)
		wantContains(t, "stderr", r.stderr, "pgclaim "+sc.name+": flag provided but not defined: -no-such-flag",
			"Run 'pgclaim "+sc.name+" -h' for usage.")
	}

	// Required flags and bad values are usage errors, found before connecting.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "missing action: want 'up' or 'status'"},
		{[]string{"migrate", "down"}, `unknown action "down"`},
		{[]string{"ticks", "extra"}, `unexpected argument "extra"`},
		{[]string{"ticks", "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"claims"}, "--table is required"},
		{[]string{"claims", "--table", "t", "--stale-after", "-1h"}, "--stale-after must be positive"},
		{[]string{"sweep", "--table", "t", "--to", "FAILED"}, "--older-than is required"},
		{[]string{"sweep", "--table", "t", "--older-than", "1h"}, "--to is required"},
		{[]string{"sweep", "--table", "t", "--older-than", "1h", "--to", "F", "--batch", "0"}, "--batch must be at least 1"},
		{[]string{"release"}, "--lock is required"},
	} {
		r = cli(t, "", c.args...)
		wantCode(t, r, exitUsage)
		wantContains(t, "stderr", r.stderr, c.want)
	}
}

// TestBinary builds the real program and runs it as an operator would.
func TestBinary(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "pgclaim")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	db := unmigrated(t)

	runBin := func(env []string, args ...string) result {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{code: code, stdout: out.String(), stderr: errb.String()}
	}

	r := runBin(nil)
	wantCode(t, r, exitUsage)

	r = runBin([]string{"DATABASE_URL=" + db.URL}, "ticks")
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, "is not migrated", "hint: run 'pgclaim migrate up'")

	r = runBin([]string{"DATABASE_URL=" + db.URL}, "migrate", "up")
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "applied 00001_pgclaim_init.sql\n")

	r = runBin([]string{"DATABASE_URL=" + db.URL}, "ticks", "--json")
	wantCode(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("stdout = %q", r.stdout)
	}

	// An answer piped in is not an operator's: a sweep needs --yes.
	sweep := exec.Command(bin, "sweep", "--table", "push_requests", "--older-than", "24h", "--to", "FAILED")
	sweep.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
	sweep.Stdin = strings.NewReader("y\n")
	out, err := sweep.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitError ||
		!strings.Contains(string(out), "refusing to sweep without confirmation: stdin is not a terminal") {
		t.Errorf("sweep with stdin a pipe: %v\n%s", err, out)
	}

	r = runBin([]string{"DATABASE_URL=" + refusedURL(t)}, "locks")
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, "connection refused")
}
