package pgtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func TestNewDatabaseIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := NewDatabase(t), NewDatabase(t)
	if a.Name == b.Name {
		t.Fatalf("two tests got the same database %q", a.Name)
	}
	for _, db := range []*Database{a, b} {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN
			('pgclaim_ticks', 'pgclaim_locks', 'pgclaim_fence_seq', 'pgclaim_schema_version')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 4 {
			t.Fatalf("%s: want pgclaim's 4 relations, found %d", db.Name, n)
		}
	}
	if _, err := a.Pool.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := b.Pool.QueryRow(ctx, "SELECT to_regclass('only_in_a') IS NOT NULL").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("a table created in one test's database is visible in another's")
	}
}

func TestTemplateSetupAndUnmigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := 0
	tpl := Template{Name: "app_setup", Unmigrated: true, Setup: func(ctx context.Context, p *pgxpool.Pool) error {
		calls++
		_, err := p.Exec(ctx, "CREATE TABLE app_rows (id int)")
		return err
	}}
	for i := 0; i < 3; i++ {
		db := NewDatabaseFrom(t, tpl)
		var app, pgclaim bool
		if err := db.Pool.QueryRow(ctx, "SELECT to_regclass('app_rows') IS NOT NULL, to_regclass('pgclaim_ticks') IS NOT NULL").Scan(&app, &pgclaim); err != nil {
			t.Fatal(err)
		}
		if !app || pgclaim {
			t.Fatalf("clone %d: app table %v (want true), pgclaim table %v (want false)", i, app, pgclaim)
		}
	}
	if calls != 1 {
		t.Fatalf("template setup ran %d times, want once", calls)
	}
	if _, err := Shared(t).CreateDatabase(ctx, Template{Name: "bad-name; DROP"}); err == nil || !strings.Contains(err.Error(), "Template.Name") {
		t.Fatalf("bad template name: got %v, want an error naming Template.Name", err)
	}
}

func TestProvisionOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var tried []string
	fake := func(ok map[string]bool) sources {
		mk := func(name string) (*Server, error) {
			tried = append(tried, name)
			if ok[name] {
				return &Server{source: Source(name)}, nil
			}
			return nil, errors.New(name + " unavailable")
		}
		return sources{
			url:       func(context.Context, string) (*Server, error) { return mk("url") },
			container: func(context.Context) (*Server, error) { return mk("container") },
			local:     func(context.Context, string, []string) (*Server, error) { return mk("local") },
		}
	}
	cases := []struct {
		name  string
		opts  Config
		ok    map[string]bool
		tried string
		want  Source // "" means an error
	}{
		{"url wins", Config{URL: "postgres://x"}, map[string]bool{"url": true, "container": true, "local": true}, "url", "url"},
		{"bad url is an error, no fallback", Config{URL: "postgres://x"}, map[string]bool{"container": true, "local": true}, "url", ""},
		{"container before local", Config{}, map[string]bool{"container": true, "local": true}, "container", "container"},
		{"local when no engine", Config{}, map[string]bool{"local": true}, "container,local", "local"},
		{"no container requested", Config{NoContainer: true}, map[string]bool{"container": true, "local": true}, "local", "local"},
		{"nothing", Config{}, nil, "container,local", ""},
	}
	for _, c := range cases {
		tried = nil
		s, err := provision(ctx, c.opts, fake(c.ok))
		if got := strings.Join(tried, ","); got != c.tried {
			t.Errorf("%s: tried %q, want %q", c.name, got, c.tried)
		}
		if c.want == "" {
			if err == nil {
				t.Errorf("%s: got a server from %s, want an error", c.name, s.source)
			}
			continue
		}
		if err != nil || s.source != c.want {
			t.Errorf("%s: got %v, %v; want source %s", c.name, s, err, c.want)
		}
	}
}

func TestUnavailableNamesAllThreeOptions(t *testing.T) {
	t.Parallel()
	_, err := provision(context.Background(), Config{NoContainer: true, BinDir: t.TempDir()}, realSources)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
	for _, want := range []string{EnvURL, "Docker", "initdb"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestSourceOnThisMachine(t *testing.T) {
	t.Parallel()
	s := Shared(t)
	switch {
	case os.Getenv(EnvURL) != "":
		if s.Source() != SourceURL {
			t.Fatalf("%s is set but the server came from %s", EnvURL, s.Source())
		}
	default:
		// This test binary does not import pgcontainer: no container.
		if s.Source() != SourceLocal {
			t.Fatalf("server came from %s, want %s", s.Source(), SourceLocal)
		}
	}
}

// TestNoContainerUnlessLinked: pgtest alone links no container runtime, and
// says how to get one.
func TestNoContainerUnlessLinked(t *testing.T) {
	t.Parallel()
	_, err := startContainer(context.Background())
	if err == nil || !strings.Contains(err.Error(), "pgtest/pgcontainer") {
		t.Fatalf("want the reason to name pgtest/pgcontainer, got %v", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "testcontainers") || strings.Contains(dep, "docker") {
			t.Fatalf("pgtest links %s", dep)
		}
	}
}

func TestStartFromURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Start(ctx, Config{URL: Shared(t).URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Source() != SourceURL {
		t.Fatalf("source %s, want url", s.Source())
	}
	db, err := s.CreateDatabase(ctx, Template{Name: "pgclaim"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Drop(ctx)
	if err := db.Pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("restart of a URL server: got %v, want ErrUnsupported", err)
	}
	if _, err := Start(ctx, Config{URL: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"}); err == nil || !strings.Contains(err.Error(), EnvURL) {
		t.Fatalf("unreachable URL: got %v, want an error naming %s", err, EnvURL)
	}
}

func backendPID(t *testing.T, p *pgxpool.Pool) uint32 {
	t.Helper()
	var pid uint32
	if err := p.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func onePool(t *testing.T, db *Database) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestTerminateBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := NewDatabase(t)
	p := onePool(t, db)
	pid := backendPID(t, p)
	if err := db.Server.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("query on a terminated backend succeeded")
	}
	if got := backendPID(t, p); got == pid {
		t.Fatalf("retry ran on the terminated backend %d", pid)
	}
	if err := db.Server.Terminate(ctx, pid); err == nil {
		t.Fatal("terminating a backend that is gone reported success")
	}

	// Every backend of one database, and only that database.
	other := NewDatabase(t)
	otherPID := backendPID(t, other.Pool)
	q := onePool(t, db)
	backendPID(t, q)
	n, err := db.Server.TerminateDatabase(ctx, db.Name)
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("terminated %d backends of %s, want at least 2", n, db.Name)
	}
	if _, err := q.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("query on a terminated backend succeeded")
	}
	if got := backendPID(t, other.Pool); got != otherPID {
		t.Fatalf("another database's backend was terminated (%d → %d)", otherPID, got)
	}
}

func TestRestartLocalCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := findBinDir(""); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	// A cluster of its own: restarting the shared one would disturb the
	// other tests of this process. Its extra setting holds across the
	// restart.
	s, err := startLocal(ctx, "", []string{"max_connections=37"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := s.CreateDatabase(ctx, Template{Name: "pgclaim"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE survives (x int); INSERT INTO survives VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	before := backendPID(t, db.Pool)
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool's old connections are dead; pgxpool drops them as they fail.
	var x int
	var lastErr error
	for i := 0; i < 10; i++ {
		if lastErr = db.Pool.QueryRow(ctx, "SELECT x FROM survives").Scan(&x); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("server not back after restart: %v", lastErr)
	}
	if x != 42 {
		t.Fatalf("read %d after restart, want 42", x)
	}
	if after := backendPID(t, db.Pool); after == before {
		t.Fatal("same backend pid after a restart")
	}
	var mc string
	if err := db.Pool.QueryRow(ctx, "SELECT current_setting('max_connections')").Scan(&mc); err != nil || mc != "37" {
		t.Fatalf("max_connections after restart = %q (%v), want the extra setting 37", mc, err)
	}
	if err := db.Drop(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCreateDatabase measures the per-test cost: clone the migrated
// template, open a pool, ping, drop.
func BenchmarkCreateDatabase(b *testing.B) {
	s := Shared(b)
	ctx := context.Background()
	if _, err := s.template(ctx, Template{Name: "pgclaim"}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		db, err := s.CreateDatabase(ctx, Template{Name: "pgclaim"})
		if err != nil {
			b.Fatal(err)
		}
		if err := db.Pool.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		if err := db.Drop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
