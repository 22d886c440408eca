package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL names the environment variable holding the connection string of a
// PostgreSQL server for tests. The role needs the CREATEDB privilege; pgtest
// creates one database per test on that server and drops it afterwards.
const EnvURL = "PGCLAIM_TEST_DATABASE_URL"

// EnvBin names the environment variable holding the directory of the
// PostgreSQL server binaries (initdb, postgres) pgtest runs its own clusters
// from: the local cluster of Start and the Pair. Set it to run a suite on
// one major version, e.g. to the bin directory .ci/pg-major.sh prints. Unset,
// pgtest searches PATH, pg_config and /usr/lib/postgresql/*/bin.
const EnvBin = "PGCLAIM_TEST_PG_BIN"

// Source says where a Server came from.
type Source string

// The sources a Server can come from, in the order Start tries them.
const (
	SourceURL       Source = "url"       // the server named by PGCLAIM_TEST_DATABASE_URL (or Config.URL)
	SourceContainer Source = "container" // a container, from a ContainerProvider (package pgcontainer)
	SourceLocal     Source = "local"     // a cluster started from local PostgreSQL binaries
)

var (
	// ErrUnavailable is returned by Start when no PostgreSQL server could be
	// had from any source. The error's text names all three options.
	ErrUnavailable = errors.New("pgtest: no PostgreSQL server available")

	// ErrUnsupported is returned by fault hooks the server's source cannot
	// offer (restarting a server pgtest did not start itself).
	ErrUnsupported = errors.New("pgtest: not supported for this server")
)

// Server is a running PostgreSQL server on which pgtest creates databases.
// Its methods are safe for concurrent use.
type Server struct {
	source   Source
	adminURL string // connection string to a maintenance database
	restart  func(ctx context.Context) error
	close    func() error

	mu        sync.Mutex
	admin     *pgxpool.Pool
	version   int // server_version_num, once read
	templates map[string]*templateState
}

// Source reports where the server came from.
func (s *Server) Source() Source { return s.source }

// URL returns a connection string to the server's maintenance database.
func (s *Server) URL() string { return s.adminURL }

// DatabaseURL returns the connection string for database name on the server.
func (s *Server) DatabaseURL(name string) string {
	u, err := url.Parse(s.adminURL)
	if err != nil || u.Scheme == "" {
		// keyword/value form
		return s.adminURL + " dbname=" + quoteKV(name)
	}
	u.Path = "/" + name
	return u.String()
}

func quoteKV(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Admin returns a pool on the server's maintenance database, shared by all
// callers and closed by Close.
func (s *Server) Admin(ctx context.Context) (*pgxpool.Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admin != nil {
		return s.admin, nil
	}
	cfg, err := pgxpool.ParseConfig(s.adminURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: admin url: %w", err)
	}
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: admin pool: %w", err)
	}
	s.admin = p
	return p, nil
}

// serverVersion returns the server's server_version_num (150004 for
// 15.4), read once.
func (s *Server) serverVersion(ctx context.Context) (int, error) {
	s.mu.Lock()
	v := s.version
	s.mu.Unlock()
	if v != 0 {
		return v, nil
	}
	admin, err := s.Admin(ctx)
	if err != nil {
		return 0, err
	}
	if err := admin.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		return 0, fmt.Errorf("pgtest: server version: %w", err)
	}
	s.mu.Lock()
	s.version = v
	s.mu.Unlock()
	return v, nil
}

// terminateWait is how long Terminate and TerminateDatabase wait for a
// backend to exit.
const terminateWait = 5 * time.Second

// Terminate ends the server backend with process id pid
// (pg_terminate_backend) and waits up to five seconds for it to exit. A pool
// that held a connection to that backend sees its next query on it fail.
func (s *Server) Terminate(ctx context.Context, pid uint32) error {
	n, err := s.terminate(ctx, "pid = $1", int32(pid))
	if err != nil {
		return fmt.Errorf("pgtest: terminate backend %d: %w", pid, err)
	}
	if n == 0 {
		return fmt.Errorf("pgtest: terminate backend %d: no such backend", pid)
	}
	return nil
}

// TerminateDatabase ends every backend connected to database name (except
// the caller's own) and returns how many it ended.
func (s *Server) TerminateDatabase(ctx context.Context, name string) (int, error) {
	n, err := s.terminate(ctx, "datname = $1 AND pid <> pg_backend_pid()", name)
	if err != nil {
		return 0, fmt.Errorf("pgtest: terminate backends of %q: %w", name, err)
	}
	return n, nil
}

// terminate ends the backends of pg_stat_activity matching cond (with one
// argument, arg) and waits up to terminateWait for them to exit; it
// returns how many it signalled. From PostgreSQL 14 on the server waits
// (pg_terminate_backend(pid, timeout)); on 13, which has only the
// one-argument form, terminate polls until the backends have left
// pg_stat_activity and released their locks.
func (s *Server) terminate(ctx context.Context, cond string, arg any) (int, error) {
	admin, err := s.Admin(ctx)
	if err != nil {
		return 0, err
	}
	v, err := s.serverVersion(ctx)
	if err != nil {
		return 0, err
	}
	var n int
	if v >= 140000 {
		err = admin.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, %d))
			FROM pg_stat_activity WHERE `, terminateWait.Milliseconds())+cond, arg).Scan(&n)
		return n, err
	}
	var pids []int32
	err = admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)), coalesce(array_agg(pid), '{}')
		FROM pg_stat_activity WHERE `+cond, arg).Scan(&n, &pids)
	if err != nil || n == 0 {
		return n, err
	}
	deadline := time.Now().Add(terminateWait)
	for {
		var alive bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = ANY($1))
			OR EXISTS (SELECT FROM pg_locks WHERE pid = ANY($1))`, pids).Scan(&alive)
		switch {
		case err != nil:
			return n, err
		case !alive:
			return n, nil
		case time.Now().After(deadline):
			return n, fmt.Errorf("still running %v after %v", pids, terminateWait)
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Restart stops the server immediately (as after a crash: every session is
// cut, no checkpoint) and starts it again on the same address. It returns once
// the server accepts connections. Only a cluster pgtest started itself can be
// restarted; on other servers the error wraps ErrUnsupported.
func (s *Server) Restart(ctx context.Context) error {
	if s.restart == nil {
		return fmt.Errorf("pgtest: restart a %s server: %w", s.source, ErrUnsupported)
	}
	s.mu.Lock()
	admin := s.admin
	s.admin = nil
	s.mu.Unlock()
	if admin != nil {
		admin.Close()
	}
	return s.restart(ctx)
}

// Close stops a server pgtest started and removes its files; for a server
// named by URL it only closes pgtest's connections. A test process need not
// call it: a server started for tests is stopped and removed when the process
// exits, however it exits.
func (s *Server) Close() error {
	s.mu.Lock()
	admin := s.admin
	s.admin = nil
	s.mu.Unlock()
	if admin != nil {
		admin.Close()
	}
	if s.close != nil {
		return s.close()
	}
	return nil
}

// Config adjusts Start. The zero value provisions in the default order.
type Config struct {
	// URL, when set, is used instead of the PGCLAIM_TEST_DATABASE_URL
	// environment variable.
	URL string
	// NoContainer skips the container source even where package pgcontainer
	// is linked.
	NoContainer bool
	// BinDir, when set, is the directory holding initdb and postgres. Unset,
	// it is the PGCLAIM_TEST_PG_BIN environment variable (EnvBin), else
	// pgtest searches PATH, pg_config and /usr/lib/postgresql/*/bin.
	BinDir string
	// Logf, when set, receives progress messages (which source was chosen).
	Logf func(format string, args ...any)
	// Settings are extra "name=value" server settings for a cluster started
	// from local binaries (e.g. "max_connections=100"), applied after
	// pgtest's own, which they override. A server named by URL or a
	// container is used as it is: check current_setting where it matters.
	Settings []string
}

// Start provisions a PostgreSQL server, trying in order:
//
//  1. the server named by PGCLAIM_TEST_DATABASE_URL (or opts.URL);
//  2. a container, when a provider is registered (import package
//     pgtest/pgcontainer for testcontainers-go) and a Docker engine answers;
//  3. an ephemeral cluster started from local PostgreSQL binaries (in
//     opts.BinDir or PGCLAIM_TEST_PG_BIN, else found on PATH, via
//     pg_config, or under /usr/lib/postgresql/*/bin), run as the
//     postgres user when the process is root, on a free loopback port.
//
// When none is available the error wraps ErrUnavailable and names all three
// options. Start is for programs; tests use Shared, NewDatabase or Pool.
func Start(ctx context.Context, opts ...Config) (*Server, error) {
	var o Config
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.URL == "" {
		o.URL = os.Getenv(EnvURL)
	}
	return provision(ctx, o, realSources)
}

// sources are the three ways of getting a server; tests replace them to
// check the order in which provision tries them.
type sources struct {
	url       func(ctx context.Context, url string) (*Server, error)
	container func(ctx context.Context) (*Server, error) // an error when no provider is registered or no engine answers
	local     func(ctx context.Context, binDir string, settings []string) (*Server, error)
}

var realSources = sources{url: fromURL, container: startContainer, local: startLocal}

// ContainerProvider starts a PostgreSQL server in a container. It returns the
// connection string of a role that may create databases (and roles, for
// tests that run as an application role) and a function that removes the
// container, or an error at once when it cannot start one (no engine).
type ContainerProvider func(ctx context.Context) (url string, remove func() error, err error)

var (
	containerMu       sync.Mutex
	containerProvider ContainerProvider
)

// UseContainers makes Start (and so Shared) try p after the URL and before
// local binaries. Package pgtest/pgcontainer calls it when imported; pgtest
// itself links no container runtime.
func UseContainers(p ContainerProvider) {
	containerMu.Lock()
	defer containerMu.Unlock()
	containerProvider = p
}

// errNoProvider is the container source's reason when none is registered.
var errNoProvider = errors.New(`not linked (import _ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" to use a Docker engine)`)

func startContainer(ctx context.Context) (*Server, error) {
	containerMu.Lock()
	p := containerProvider
	containerMu.Unlock()
	if p == nil {
		return nil, errNoProvider
	}
	u, remove, err := p(ctx)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, u, nil); err != nil {
		_ = remove()
		return nil, err
	}
	return &Server{source: SourceContainer, adminURL: u, close: remove}, nil
}

func provision(ctx context.Context, o Config, src sources) (*Server, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if o.URL != "" {
		s, err := src.url(ctx, o.URL)
		if err != nil {
			// A URL given on purpose that does not work is an error, not a
			// reason to quietly start something else.
			return nil, fmt.Errorf("pgtest: %s: %w", EnvURL, err)
		}
		logf("pgtest: using the server named by %s", EnvURL)
		return s, nil
	}
	var reasons []string
	if o.NoContainer {
		reasons = append(reasons, "container: skipped")
	} else {
		s, err := src.container(ctx)
		if err == nil {
			logf("pgtest: started a PostgreSQL container")
			return s, nil
		}
		reasons = append(reasons, "container: "+err.Error())
	}
	s, err := src.local(ctx, o.BinDir, o.Settings)
	if err == nil {
		logf("pgtest: started a local PostgreSQL cluster")
		return s, nil
	}
	reasons = append(reasons, "local binaries: "+err.Error())
	return nil, fmt.Errorf("%w: set %s to a server's connection string (role with CREATEDB), "+
		"or run a Docker engine and import pgtest/pgcontainer, "+
		"or install PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin "+
		"or name their directory in %s (%s)",
		ErrUnavailable, EnvURL, EnvBin, strings.Join(reasons, "; "))
}

func fromURL(ctx context.Context, u string) (*Server, error) {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("bad connection string: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, err
	}
	_ = conn.Close(ctx)
	return &Server{source: SourceURL, adminURL: u}, nil
}

// waitReady polls until a connection to u succeeds or ctx ends; alive, when
// non-nil, reports an early exit of the server process.
func waitReady(ctx context.Context, u string, alive func() error) error {
	// 60 s, or the caller's deadline when it set one (a starved machine's
	// crash recovery may take longer).
	start := time.Now()
	deadline := time.Now().Add(60 * time.Second)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	var last error
	for time.Now().Before(deadline) {
		if alive != nil {
			if err := alive(); err != nil {
				return err
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, u)
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("server not ready after %v: %w", time.Since(start).Round(time.Second), last)
}
