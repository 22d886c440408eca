package pgclaim_test

import (
	"bytes"
	"context"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// The README marks the Quickstart's code for this test: a fenced block
// after <!-- quickstart:file PATH --> is a file of the service's module,
// and the lines of a block after <!-- quickstart:run --> are commands run
// in it.
var (
	quickstartFileRE = regexp.MustCompile("(?s)<!-- quickstart:file (\\S+) -->\n```[a-z]*\n(.*?)```\n")
	quickstartRunRE  = regexp.MustCompile("(?s)<!-- quickstart:run -->\n```sh\n(.*?)```\n")
)

// quickstartSeed is not in the README: the rows a service would have when
// the Quickstart's program starts, added as one more migration so the
// program's own MigrateFS applies it. 50 paused pushes, and one a dead
// instance left PROCESSING 25 hours ago.
const quickstartSeed = `-- +goose Up
INSERT INTO push_requests (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 50) g;
INSERT INTO push_requests (id, status, claimed_at, claimed_by, fence, attempts)
VALUES (100, 'PROCESSING', now() - interval '25 hours', 'gone:1', 1, 1);
-- +goose Down
DELETE FROM push_requests;
`

// TestReadmeQuickstart follows the README's Quickstart as written: it
// builds the files the README shows into a module of their own (requiring
// this checkout of pgclaim), runs the README's commands in it, and starts
// two instances of the program against a fresh, empty database. They apply
// the migrations once between them, the job's recovery sweep fails the row a
// dead instance left, and once both serve, the README's
// `go tool pgclaim schedules trigger push-resume` asks for a run: one
// instance runs it, every paused push is sent once with its claim's fence,
// and both stop cleanly on SIGTERM.
func TestReadmeQuickstart(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	mod := t.TempDir()
	files := quickstartFileRE.FindAllStringSubmatch(string(readme), -1)
	seen := map[string]bool{}
	for _, f := range files {
		name, body := f[1], f[2]
		if filepath.IsAbs(name) || strings.Contains(name, "..") || seen[name] {
			t.Fatalf("README: bad or repeated quickstart file %q", name)
		}
		seen[name] = true
		if strings.HasSuffix(name, ".go") {
			if formatted, err := format.Source([]byte(body)); err != nil || !bytes.Equal(formatted, []byte(body)) {
				t.Errorf("README: %s is not gofmt-formatted (%v)", name, err)
			}
		}
		writeFile(t, filepath.Join(mod, name), body)
	}
	if !seen["main.go"] || len(files) < 2 {
		t.Fatalf("README: want the Quickstart's main.go and its migrations marked with <!-- quickstart:file PATH -->; found %v", seen)
	}
	writeFile(t, filepath.Join(mod, "migrations", "99999_quickstart_seed.sql"), quickstartSeed)
	// pgclaim's own requirements, listed in full as in a tidy module: the
	// go command then reads only their go.mod files, which building
	// pgclaim fetched. With pgclaim alone listed it walks the whole graph,
	// down to go.mod files of its dependencies' old test dependencies that
	// nothing here builds, and a fresh module cache does not hold them.
	reqs, err := requirements("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mod, "go.mod"), "module example.com/pushes\n\ngo 1.26.0\n\n"+
		"require github.com/pgclaim/pgclaim v0.0.0\n\n"+reqs+"\nreplace github.com/pgclaim/pgclaim => "+root+"\n")
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mod, "go.sum"), string(sum))

	// The module cache only: no network, no workspace, this toolchain.
	// (go test puts its own toolchain first in PATH.) The cache is filled
	// first, through the caller's module proxy, with what the quickstart's
	// module needs beyond what building pgclaim fetched (`go get -tool`
	// reads the sources of modules imported on other platforms too): on a
	// fresh machine, as a reader's go command would fetch them.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	goEnv := append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	fill := exec.Command(goBin, "mod", "download")
	fill.Dir, fill.Env = mod, goEnv
	if out, err := fill.CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	goEnv = append(goEnv, "GOPROXY=off")
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = mod, goEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run(goBin, "build", "-o", "pushes", ".")

	runs := quickstartRunRE.FindAllStringSubmatch(string(readme), -1)
	if len(runs) == 0 {
		t.Fatal("README: no commands marked with <!-- quickstart:run -->")
	}
	for _, r := range runs {
		for line := range strings.Lines(r[1]) {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				run("sh", "-c", line)
			}
		}
	}
	// The schema the README writes for sqlc is pgclaim's migrations.
	if m, _ := filepath.Glob(filepath.Join(mod, "db", "pgclaim", "00001_pgclaim_init.sql")); len(m) != 1 {
		t.Errorf("the README's commands did not write db/pgclaim/00001_pgclaim_init.sql")
	}

	db := pgtest.NewDatabaseFrom(t, empty)
	type instance struct {
		cmd  *exec.Cmd
		out  syncBuffer
		done chan error
	}
	instances := make([]*instance, 2)
	for i := range instances {
		in := &instance{cmd: exec.Command(filepath.Join(mod, "pushes")), done: make(chan error, 1)}
		in.cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
		in.cmd.Stdout, in.cmd.Stderr = &in.out, &in.out
		if err := in.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { in.done <- in.cmd.Wait() }()
		instances[i] = in
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		for _, in := range instances {
			_ = in.cmd.Process.Signal(syscall.SIGTERM)
		}
		for i, in := range instances {
			select {
			case err := <-in.done:
				if err != nil {
					t.Errorf("instance %d: %v\n%s", i, err, in.out.String())
				}
			case <-time.After(30 * time.Second):
				_ = in.cmd.Process.Kill()
				t.Errorf("instance %d did not stop on SIGTERM\n%s", i, in.out.String())
			}
		}
	}
	defer stop()

	ctx := context.Background()
	triggered := false
	var sent, failed, wrong, effects, distinct, fenced, ticks int
	deadline := time.Now().Add(time.Minute)
	for {
		err := db.Pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM push_requests WHERE status = 'SENT'),
       (SELECT count(*) FROM push_requests WHERE status = 'FAILED' AND id = 100),
       (SELECT count(*) FROM push_requests WHERE status NOT IN ('PAUSED', 'PROCESSING', 'SENT') AND id <> 100),
       (SELECT count(*) FROM sent_pushes),
       (SELECT count(DISTINCT push_id) FROM sent_pushes),
       (SELECT count(*) FROM sent_pushes s JOIN push_requests p ON p.id = s.push_id AND p.fence = s.fence),
       (SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule = 'push-resume' AND state = 'succeeded')`).
			Scan(&sent, &failed, &wrong, &effects, &distinct, &fenced, &ticks)
		if wrong > 0 {
			stop()
			t.Fatalf("%d pushes left PAUSED for another state than SENT\ninstance 0:\n%s\ninstance 1:\n%s",
				wrong, instances[0].out.String(), instances[1].out.String())
		}
		serving := 0
		for i, in := range instances {
			select {
			case err := <-in.done:
				stopped = true
				t.Fatalf("instance %d exited: %v\n%s", i, err, in.out.String())
			default:
			}
			// Both instances are past start-up (migrations, catch-up).
			if strings.Contains(in.out.String(), "pushes: serving") {
				serving++
			}
		}
		if serving == 2 && !triggered {
			// The README's command, as an operator runs it.
			trigger := exec.Command(goBin, "tool", "pgclaim", "schedules", "trigger", "push-resume")
			trigger.Dir, trigger.Env = mod, append(goEnv, "DATABASE_URL="+db.URL)
			if out, err := trigger.CombinedOutput(); err != nil {
				stop()
				t.Fatalf("go tool pgclaim schedules trigger push-resume: %v\n%s", err, out)
			}
			triggered = true
		}
		if err == nil && sent == 50 && failed == 1 && ticks == 1 && serving == 2 {
			break
		}
		if err != nil && serving == 2 { // the schema is the program's by now
			stop()
			t.Fatalf("reading the Quickstart's tables: %v\ninstance 0:\n%s\ninstance 1:\n%s",
				err, instances[0].out.String(), instances[1].out.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %d pushes SENT (want 50), stale row FAILED %d, %d runs succeeded (%v)\ninstance 0:\n%s\ninstance 1:\n%s",
				sent, failed, ticks, err, instances[0].out.String(), instances[1].out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	for i, in := range instances {
		for _, line := range strings.Split(in.out.String(), "\n") {
			// The seeded stale row (key 100) is swept on purpose; the
			// sweeper says so at warn level. Anything else is a fault.
			if strings.Contains(line, "claim: swept stale row") && strings.Contains(line, "key=100 ") {
				continue
			}
			if strings.Contains(line, "ERROR") || strings.Contains(line, "WARN") {
				t.Errorf("instance %d logged a warning or an error:\n%s", i, in.out.String())
				break
			}
		}
	}
	if effects != 50 || distinct != 50 || fenced != 50 {
		t.Errorf("sent_pushes: %d rows, %d pushes, %d with their claim's token; want 50 each", effects, distinct, fenced)
	}
	var versions []int64
	if err := db.Pool.QueryRow(ctx, `SELECT array_agg(version_id ORDER BY version_id) FROM pushes_schema_version WHERE version_id > 0`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if len(versions) != 2 || versions[0] != 1 || versions[1] != 99999 {
		t.Errorf("pushes_schema_version: %v, want [1 99999]", versions)
	}
}

// syncBuffer is a bytes.Buffer safe for a child's output and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// requirements returns the require directives of the go.mod file at path,
// blocks and single lines, as text for another go.mod.
func requirements(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	inBlock := false
	for line := range strings.Lines(string(data)) {
		trimmed := strings.TrimSpace(line)
		switch {
		case inBlock:
			b.WriteString(line)
			inBlock = trimmed != ")"
		case trimmed == "require (":
			b.WriteString(line)
			inBlock = true
		case strings.HasPrefix(trimmed, "require "):
			b.WriteString(line)
		}
	}
	if inBlock {
		return "", fmt.Errorf("%s: a require block is not closed", path)
	}
	return b.String(), nil
}
