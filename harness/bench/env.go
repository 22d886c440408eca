package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/pgtest"
)

// env is the server a run uses and what every scenario needs from it.
type env struct {
	cfg   Config
	prog  *progress
	srv   *pgtest.Server
	admin *pgxpool.Pool
	// pgss: pg_stat_statements is loaded and queryable from admin.
	pgss bool
	// owned: the server was started by this run, and is stopped by close.
	owned bool
}

func newEnv(ctx context.Context, cfg Config, prog *progress) (*env, error) {
	opts := pgtest.Config{Logf: func(f string, a ...any) { prog.logf("postgres: "+f, a...) }}
	if cfg.DatabaseURL != "" {
		opts.URL = cfg.DatabaseURL
		opts.NoContainer = true
	}
	srv, owned := cfg.server, false
	if srv == nil {
		prog.logf("provisioning PostgreSQL...")
		var err error
		srv, err = pgtest.Start(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		owned = true
	}
	e := &env{cfg: cfg, prog: prog, srv: srv, owned: owned}
	var err error
	if err := e.statementStats(ctx); err != nil {
		prog.logf("pg_stat_statements unavailable (%v): no per-statement profile", err)
	}
	e.admin, err = srv.Admin(ctx)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	return e, nil
}

// statementStats turns pg_stat_statements on where it can: on a cluster
// pgtest started itself it preloads the library and restarts the server
// once; elsewhere it is used only when the server already loads it.
func (e *env) statementStats(ctx context.Context) error {
	admin, err := e.srv.Admin(ctx)
	if err != nil {
		return err
	}
	var libs string
	if err := admin.QueryRow(ctx, "SELECT current_setting('shared_preload_libraries')").Scan(&libs); err != nil {
		return err
	}
	if !strings.Contains(libs, "pg_stat_statements") {
		if e.srv.Source() != pgtest.SourceLocal {
			return errors.New("not in shared_preload_libraries of this server")
		}
		var avail bool
		if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_stat_statements')").Scan(&avail); err != nil {
			return err
		}
		if !avail {
			return errors.New("extension not installed")
		}
		set := "pg_stat_statements"
		if strings.TrimSpace(libs) != "" {
			set = libs + ",pg_stat_statements"
		}
		if _, err := admin.Exec(ctx, "ALTER SYSTEM SET shared_preload_libraries = "+quoteLiteral(set)); err != nil {
			return err
		}
		e.prog.logf("restarting the throwaway server to load pg_stat_statements...")
		if err := e.srv.Restart(ctx); err != nil {
			return err
		}
		admin, err = e.srv.Admin(ctx)
		if err != nil {
			return err
		}
		// The pool's connections died with the restart: wait until it has
		// new ones.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err = admin.Exec(ctx, "SELECT 1"); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "SELECT count(*) FROM pg_stat_statements"); err != nil {
		return err
	}
	e.pgss = true
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (e *env) close() {
	if e.owned {
		_ = e.srv.Close()
	}
}

func (e *env) machine(ctx context.Context) Machine {
	m := Machine{
		OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), CPUModel: cpuModel(),
		MemoryGiB: memoryGiB(), Go: goVersion(), ServerSource: string(e.srv.Source()),
		StatementStats: e.pgss, Settings: map[string]string{},
	}
	_ = e.admin.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&m.Postgres)
	for _, s := range []string{"fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_wal_size", "max_connections"} {
		var v string
		if err := e.admin.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err == nil {
			m.Settings[s] = v
		}
	}
	return m
}

// database creates a fresh database with pgclaim's schema for one scenario.
func (e *env) database(ctx context.Context) (*pgtest.Database, error) {
	db, err := e.srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		// pgtest's error says what is wrong, and names CREATEDB when the
		// role lacks it.
		return nil, err
	}
	return db, nil
}

// pool opens a pool of up to n connections on db; the caller closes it.
// scratch returns a fresh database for a scenario and a pool of n
// connections on it; done closes the pool and drops the database.
func (e *env) scratch(ctx context.Context, n int) (db *pgtest.Database, pool *pgxpool.Pool, done func(), err error) {
	if db, err = e.database(ctx); err != nil {
		return nil, nil, nil, err
	}
	if pool, err = e.pool(ctx, db, n); err != nil {
		db.Drop(context.WithoutCancel(ctx))
		return nil, nil, nil, err
	}
	return db, pool, func() {
		pool.Close()
		db.Drop(context.WithoutCancel(ctx))
	}, nil
}

func (e *env) pool(ctx context.Context, db *pgtest.Database, n int) (*pgxpool.Pool, error) {
	return openPool(ctx, db.URL, n)
}

func openPool(ctx context.Context, url string, n int) (*pgxpool.Pool, error) {
	return openTracedPool(ctx, url, n, nil)
}

// openTracedPool is openPool with a tracer on every connection (nil: none).
func openTracedPool(ctx context.Context, url string, n int, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(n)
	if tracer != nil {
		pc.ConnConfig.Tracer = tracer
	}
	pc.MinConns = 0
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

// Profile is what the server spent on one phase, from pg_stat_statements:
// the statements that took the most execution time.
type Profile struct {
	Label       string      `json:"label"`
	WallSeconds float64     `json:"wall_seconds"`
	ExecSeconds float64     `json:"exec_seconds"` // server execution time of all statements
	WALBytes    int64       `json:"wal_bytes,omitempty"`
	ClientCPU   float64     `json:"client_cpu_seconds,omitempty"`
	MachineCPU  float64     `json:"machine_cpu_seconds,omitempty"`
	Statements  []Statement `json:"statements,omitempty"`
}

// Statement is one normalised statement of a profile.
type Statement struct {
	Query         string  `json:"query"`
	Calls         int64   `json:"calls"`
	TotalMs       float64 `json:"total_ms"`
	MeanMs        float64 `json:"mean_ms"`
	MaxMs         float64 `json:"max_ms"`
	Rows          int64   `json:"rows"`
	BlocksPerCall float64 `json:"blocks_per_call"`
}

// phase measures one timed part of a scenario.
type phase struct {
	e      *env
	dbName string
	t0     time.Time
	wal0   int64
	cpu0   time.Duration
	mcpu0  time.Duration
}

// begin starts a phase on database dbName: statement statistics of that
// database are reset.
func (e *env) begin(ctx context.Context, dbName string) *phase {
	ph := &phase{e: e, dbName: dbName}
	if e.pgss {
		_, _ = e.admin.Exec(ctx, "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = $1), 0)", dbName)
	}
	ph.wal0 = e.walBytes(ctx)
	ph.cpu0, ph.mcpu0 = processCPU(), machineCPU()
	ph.t0 = time.Now()
	return ph
}

func (e *env) walBytes(ctx context.Context) int64 {
	var n int64
	if err := e.admin.QueryRow(ctx, "SELECT wal_bytes::bigint FROM pg_stat_wal").Scan(&n); err != nil {
		return 0
	}
	return n
}

// end closes the phase and returns its profile (top statements by total
// execution time when pg_stat_statements is available).
func (ph *phase) end(ctx context.Context, label string, top int) Profile {
	wall := time.Since(ph.t0)
	p := Profile{
		Label:       label,
		WallSeconds: wall.Seconds(),
		ClientCPU:   (processCPU() - ph.cpu0).Seconds(),
		MachineCPU:  (machineCPU() - ph.mcpu0).Seconds(),
	}
	if w := ph.e.walBytes(ctx); w > 0 {
		p.WALBytes = w - ph.wal0
	}
	if !ph.e.pgss {
		return p
	}
	const q = `SELECT query, calls, total_exec_time, mean_exec_time, max_exec_time, rows,
  (shared_blks_hit + shared_blks_read + shared_blks_dirtied)::float8 / greatest(calls, 1)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
ORDER BY total_exec_time DESC`
	rows, err := ph.e.admin.Query(ctx, q, ph.dbName)
	if err != nil {
		return p
	}
	defer rows.Close()
	for rows.Next() {
		var s Statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.MeanMs, &s.MaxMs, &s.Rows, &s.BlocksPerCall); err != nil {
			return p
		}
		p.ExecSeconds += s.TotalMs / 1000
		if len(p.Statements) < top {
			s.Query = oneLine(s.Query)
			p.Statements = append(p.Statements, s)
		}
	}
	return p
}

// maxStatement returns the longest single execution among statements of
// the profile whose text contains substr.
func (p Profile) maxStatement(substr string) (Statement, bool) {
	var best Statement
	found := false
	for _, s := range p.Statements {
		if strings.Contains(s.Query, substr) && (!found || s.MaxMs > best.MaxMs) {
			best, found = s, true
		}
	}
	return best, found
}

// oneLine collapses whitespace so a statement prints on one line.
func oneLine(q string) string {
	return strings.Join(strings.Fields(q), " ")
}

// scanInt64 runs a query returning one bigint.
func scanInt64(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, q string, args ...any) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}
