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

// Source says where a Server came from.
type Source string

// The sources a Server can come from, in the order Start tries them.
const (
	SourceURL       Source = "url"       // the server named by PGCLAIM_TEST_DATABASE_URL (or Config.URL)
	SourceContainer Source = "container" // a container started with testcontainers-go
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

// Terminate ends the server backend with process id pid
// (pg_terminate_backend) and waits up to five seconds for it to exit. A pool
// that held a connection to that backend sees its next query on it fail.
func (s *Server) Terminate(ctx context.Context, pid uint32) error {
	admin, err := s.Admin(ctx)
	if err != nil {
		return err
	}
	var ok bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: terminate backend %d: %w", pid, err)
	}
	if !ok {
		return fmt.Errorf("pgtest: terminate backend %d: no such backend", pid)
	}
	return nil
}

// TerminateDatabase ends every backend connected to database name (except
// the caller's own) and returns how many it ended.
func (s *Server) TerminateDatabase(ctx context.Context, name string) (int, error) {
	admin, err := s.Admin(ctx)
	if err != nil {
		return 0, err
	}
	var n int
	err = admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pgtest: terminate backends of %q: %w", name, err)
	}
	return n, nil
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
	// NoContainer skips the testcontainers-go source.
	NoContainer bool
	// BinDir, when set, is the directory holding initdb and postgres, instead
	// of searching PATH, pg_config and /usr/lib/postgresql/*/bin.
	BinDir string
	// Logf, when set, receives progress messages (which source was chosen).
	Logf func(format string, args ...any)
}

// Start provisions a PostgreSQL server, trying in order:
//
//  1. the server named by PGCLAIM_TEST_DATABASE_URL (or opts.URL);
//  2. a container from testcontainers-go's postgres module, when a Docker
//     engine answers;
//  3. an ephemeral cluster started from local PostgreSQL binaries (found on
//     PATH, via pg_config, or under /usr/lib/postgresql/*/bin), run as the
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
	container func(ctx context.Context) (*Server, error) // errNoEngine when no Docker engine answers
	local     func(ctx context.Context, binDir string) (*Server, error)
}

var realSources = sources{url: fromURL, container: startContainer, local: startLocal}

var errNoEngine = errors.New("no Docker engine answered")

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
		reasons = append(reasons, "testcontainers: skipped")
	} else {
		s, err := src.container(ctx)
		if err == nil {
			logf("pgtest: started a PostgreSQL container")
			return s, nil
		}
		reasons = append(reasons, "testcontainers: "+err.Error())
	}
	s, err := src.local(ctx, o.BinDir)
	if err == nil {
		logf("pgtest: started a local PostgreSQL cluster")
		return s, nil
	}
	reasons = append(reasons, "local binaries: "+err.Error())
	return nil, fmt.Errorf("%w: set %s to a server's connection string (role with CREATEDB), "+
		"or run a Docker engine for testcontainers-go, "+
		"or install PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin (%s)",
		ErrUnavailable, EnvURL, strings.Join(reasons, "; "))
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
	deadline := time.Now().Add(60 * time.Second)
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
	return fmt.Errorf("server not ready after 60s: %w", last)
}
