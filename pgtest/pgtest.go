package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

var (
	sharedOnce   sync.Once
	sharedServer *Server
	sharedErr    error
)

// Shared returns the server shared by every test in this process, starting
// it on first use (see Start). When no server can be had the test is skipped,
// or failed when the CI environment variable is "true".
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		sharedServer, sharedErr = Start(ctx)
	})
	if sharedErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v", sharedErr)
		}
		t.Skipf("%v", sharedErr)
	}
	return sharedServer
}

// Template describes a template database: pgclaim's migrations, then Setup.
type Template struct {
	// Name identifies the template (letters, digits and underscores). On a
	// server named by PGCLAIM_TEST_DATABASE_URL templates outlive the test
	// process and are reused by later runs while pgclaim's migrations are
	// unchanged: change Name when Setup changes.
	Name string
	// Setup, when set, runs once on the template after pgclaim's migrations,
	// e.g. to apply the application's own migrations.
	Setup func(ctx context.Context, pool *pgxpool.Pool) error
	// Unmigrated leaves pgclaim's migrations out: databases cloned from the
	// template start empty but for what Setup creates.
	Unmigrated bool
}

type templateState struct {
	once sync.Once
	name string
	err  error
}

var templateNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,30}$`)

// Database is a database created for one test (or one program run).
type Database struct {
	Name   string        // the database's name
	URL    string        // its connection string, e.g. for child processes
	Pool   *pgxpool.Pool // a pool on it, closed when the database is dropped
	Server *Server       // the server it lives on

	mu    sync.Mutex
	pools []*pgxpool.Pool
}

// NewDatabase creates a fresh database with pgclaim's schema for t, and drops
// it when t ends.
func NewDatabase(t testing.TB) *Database {
	t.Helper()
	return NewDatabaseFrom(t, Template{Name: "pgclaim"})
}

// NewDatabaseFrom creates a fresh database cloned from tpl for t, and drops
// it when t ends.
func NewDatabaseFrom(t testing.TB, tpl Template) *Database {
	t.Helper()
	s := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := s.CreateDatabase(ctx, tpl)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Errorf("%v", err)
		}
	})
	return db
}

// Pool returns a pool on a fresh database with pgclaim's schema, dropped
// when t ends. It is NewDatabase(t).Pool.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewDatabase(t).Pool
}

// NewPool opens another, independent pool on the database (as a second
// instance of a service would have), closed when t ends.
func (d *Database) NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	p, err := d.OpenPool(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// OpenPool opens another pool on the database; Drop closes it if the caller
// has not.
func (d *Database) OpenPool(ctx context.Context) (*pgxpool.Pool, error) {
	p, err := pgxpool.New(ctx, d.URL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: open pool on %s: %w", d.Name, err)
	}
	d.mu.Lock()
	d.pools = append(d.pools, p)
	d.mu.Unlock()
	return p, nil
}

// Drop closes the database's pools and drops it, ending any session still
// connected to it.
func (d *Database) Drop(ctx context.Context) error {
	d.mu.Lock()
	pools := d.pools
	d.pools = nil
	d.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
	admin, err := d.Server.Admin(ctx)
	if err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", d.Name, err)
	}
	return nil
}

// CreateDatabase creates a fresh database cloned from tpl (built on first
// use: pgclaim's migrations, then tpl.Setup) and opens a pool on it. The
// caller drops it with Drop.
func (s *Server) CreateDatabase(ctx context.Context, tpl Template) (*Database, error) {
	tplName, err := s.template(ctx, tpl)
	if err != nil {
		return nil, err
	}
	admin, err := s.Admin(ctx)
	if err != nil {
		return nil, err
	}
	v, err := s.serverVersion(ctx)
	if err != nil {
		return nil, err
	}
	name := "pgtest_" + tpl.Name + "_" + randomSuffix()
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{tplName}.Sanitize()
	if v >= 150000 {
		// 15 made WAL_LOG the default strategy, which writes the whole
		// template to WAL; FILE_COPY, the only strategy before 15, copies
		// the files and logs one record.
		stmt += " STRATEGY FILE_COPY"
	}
	if _, err := admin.Exec(ctx, stmt); err != nil {
		return nil, fmt.Errorf("pgtest: create database: %w", createErr(err))
	}
	db := &Database{Name: name, URL: s.DatabaseURL(name), Server: s}
	if db.Pool, err = db.OpenPool(ctx); err != nil {
		_ = db.Drop(ctx)
		return nil, err
	}
	return db, nil
}

// createErr adds to a CREATE DATABASE error what the role lacks, when it is
// the privilege: the server's own message is the whole story otherwise.
func createErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("%w (the role needs the CREATEDB privilege)", err)
	}
	return err
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// template returns the name of the template database for tpl, building it
// once per process. Building is serialised across processes sharing a
// server by an advisory lock, and a template only gets its final name once
// complete, so a half-built template is never cloned.
func (s *Server) template(ctx context.Context, tpl Template) (string, error) {
	if !templateNameRE.MatchString(tpl.Name) {
		return "", fmt.Errorf("pgtest: Template.Name %q: must be 1-30 letters, digits or underscores", tpl.Name)
	}
	s.mu.Lock()
	if s.templates == nil {
		s.templates = map[string]*templateState{}
	}
	st := s.templates[tpl.Name]
	if st == nil {
		st = &templateState{}
		s.templates[tpl.Name] = st
	}
	s.mu.Unlock()
	st.once.Do(func() { st.name, st.err = s.buildTemplate(ctx, tpl) })
	return st.name, st.err
}

func (s *Server) buildTemplate(ctx context.Context, tpl Template) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	final := "pgtest_tpl_" + tpl.Name + "_" + sum[:12]
	admin, err := s.Admin(ctx)
	if err != nil {
		return "", err
	}
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Release()
	const lockKey = 0x7067746573740001 // "pgtest" + 1: template builds
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lockKey)); err != nil {
		return "", fmt.Errorf("pgtest: lock for template build: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(lockKey)) }()

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", final).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return final, nil
	}
	building := final + "_building"
	q := pgx.Identifier{building}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+q+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+q); err != nil {
		return "", fmt.Errorf("pgtest: create template: %w", createErr(err))
	}
	if err := s.setupTemplate(ctx, building, tpl); err != nil {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+q+" WITH (FORCE)")
		return "", err
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+q+" RENAME TO "+pgx.Identifier{final}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgtest: finish template: %w", err)
	}
	// Nobody connects to a template, so cloning it never waits for sessions.
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{final}.Sanitize()+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return "", fmt.Errorf("pgtest: finish template: %w", err)
	}
	return final, nil
}

func (s *Server) setupTemplate(ctx context.Context, name string, tpl Template) error {
	p, err := pgxpool.New(ctx, s.DatabaseURL(name))
	if err != nil {
		return fmt.Errorf("pgtest: connect to template: %w", err)
	}
	defer p.Close()
	if !tpl.Unmigrated {
		if err := pgclaim.Migrate(ctx, p); err != nil {
			return fmt.Errorf("pgtest: migrate template: %w", err)
		}
	}
	if tpl.Setup != nil {
		if err := tpl.Setup(ctx, p); err != nil {
			return fmt.Errorf("pgtest: template %s setup: %w", tpl.Name, err)
		}
	}
	// A frozen, analysed template gives autovacuum no reason to visit it; a
	// worker connected to the template would make every clone wait for it.
	if _, err := p.Exec(ctx, "VACUUM (FREEZE, ANALYZE)"); err != nil {
		return fmt.Errorf("pgtest: vacuum template: %w", err)
	}
	return nil
}

// migrationsHash identifies the content of pgclaim's migrations, so a
// template built by an older version is never reused.
func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".sql") {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, p)
		if err != nil {
			return err
		}
		h.Write([]byte(p))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
