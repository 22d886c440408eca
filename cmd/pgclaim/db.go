package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/internal/qualify"
)

// dbtx is what the commands query: a pool, a connection or a transaction.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// envURL is the environment variable read when --database-url is not given.
const envURL = "DATABASE_URL"

// urlHint tells the operator how to name the database.
const urlHint = "set the URL with --database-url or the " + envURL + " environment variable, " +
	"e.g. postgres://user:password@localhost:5432/dbname"

// connectTimeout bounds connecting when the URL sets no connect_timeout.
const connectTimeout = 10 * time.Second

// connect opens a small pool on the database named by --database-url or
// DATABASE_URL and checks that it answers. Its errors say what went wrong
// (no URL, a URL that does not parse, a server that cannot be reached or
// refuses the login) and how to set the URL.
func (f *flags) connect(ctx context.Context) (*pgxpool.Pool, error) {
	url := f.url
	if url == "" {
		url = f.e.getenv(envURL)
	}
	if strings.TrimSpace(url) == "" {
		return nil, &usageError{msg: "no database URL: " + urlHint}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &failure{msg: "invalid database URL: " + err.Error(), hint: urlHint, err: err}
	}
	cfg.MaxConns = 4
	if f.schema != "" {
		// The CLI's own sessions find pgclaim's objects in the schema:
		// connect to the server directly (or through a session pooler),
		// which takes search_path as a start-up parameter.
		if msg := qualify.Check(f.schema); msg != "" {
			return nil, usagef("--schema: %s", msg)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{f.schema}.Sanitize()
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pgclaim-cli"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, connectFailure(&cfg.ConnConfig.Config, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, connectFailure(&cfg.ConnConfig.Config, err)
	}
	return pool, nil
}

// connectFailure explains why connecting failed.
func connectFailure(cc *pgconn.Config, err error) error {
	where := "PostgreSQL at " + describeTarget(cc)
	var pgErr *pgconn.PgError
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return &failure{msg: "interrupted while connecting to " + where, err: err}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &failure{
			msg:  fmt.Sprintf("cannot connect to %s: connection refused", where),
			hint: "is the server running and listening on that address? To use another server, " + urlHint,
			err:  err,
		}
	case errors.As(err, &dnsErr):
		return &failure{
			msg:  fmt.Sprintf("cannot connect to %s: host %q not found", where, dnsErr.Name),
			hint: "check the host name in the URL; " + urlHint,
			err:  err,
		}
	case errors.As(err, &pgErr) && pgErr.Code == "3D000":
		return &failure{
			msg:  fmt.Sprintf("cannot connect to %s: database %q does not exist", where, cc.Database),
			hint: "check the database name in the URL (its path); " + urlHint,
			err:  err,
		}
	case errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000"):
		return &failure{
			msg:  fmt.Sprintf("cannot connect to %s: the server refused the login: %s", where, pgErr.Message),
			hint: "check the user and password in the URL; " + urlHint,
			err:  err,
		}
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return &failure{
			msg:  fmt.Sprintf("cannot connect to %s: timed out", where),
			hint: "is the address reachable (firewall, network)? To use another server, " + urlHint,
			err:  err,
		}
	}
	return &failure{msg: fmt.Sprintf("cannot connect to %s: %v", where, err), hint: urlHint, err: err}
}

// describeTarget names the server and database of cc without the password.
func describeTarget(cc *pgconn.Config) string {
	addr := cc.Host
	if strings.HasPrefix(addr, "/") {
		addr = fmt.Sprintf("socket %s/.s.PGSQL.%d", addr, cc.Port)
	} else {
		addr = net.JoinHostPort(addr, fmt.Sprint(cc.Port))
	}
	return fmt.Sprintf("%s (user %q, database %q)", addr, cc.User, cc.Database)
}

// The columns of pgclaim's tables that the commands read. A table that
// lacks one was changed by hand or comes from a schema this build does not
// know.
var pgclaimColumns = map[string][]string{
	"pgclaim_ticks":      {"job", "fire_at", "holder", "fence", "started_at", "finished_at", "outcome", "error"},
	"pgclaim_locks":      {"name", "holder", "locked_at", "lock_until", "fence"},
	"pgclaim_terms":      {"election", "term", "holder", "method", "started_at", "lease_until", "ended_at", "end_reason"},
	pgclaim.VersionTable: {"version_id", "is_applied", "tstamp"},
	"pgclaim_fence_seq":  nil,
}

const migrateHint = "run 'pgclaim migrate up' (or call pgclaim.Migrate at start-up) to create pgclaim's tables"

// schemaInfo is what the catalog says about some relations.
type schemaInfo struct {
	database string
	exists   map[string]bool
	columns  map[string][]string
}

func loadSchema(ctx context.Context, db dbtx, names []string) (*schemaInfo, error) {
	rows, err := db.Query(ctx, `
SELECT current_database()::text, n.name, c.oid IS NOT NULL,
       coalesce(array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attname IS NOT NULL), '{}')
FROM unnest($1::text[]) AS n(name)
LEFT JOIN pg_catalog.pg_class c ON c.oid = to_regclass(n.name)
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
GROUP BY n.name, c.oid`, names)
	if err != nil {
		return nil, dbFail("reading the catalog", err)
	}
	defer rows.Close()
	si := &schemaInfo{exists: map[string]bool{}, columns: map[string][]string{}}
	for rows.Next() {
		var name string
		var ok bool
		var cols []string
		if err := rows.Scan(&si.database, &name, &ok, &cols); err != nil {
			return nil, dbFail("reading the catalog", err)
		}
		si.exists[name] = ok
		si.columns[name] = cols
	}
	if err := rows.Err(); err != nil {
		return nil, dbFail("reading the catalog", err)
	}
	return si, nil
}

// requireSchema checks that pgclaim's tables named exist with the columns the
// commands read. A database without pgclaim's version table is reported as
// not migrated, with the command that migrates it.
func requireSchema(ctx context.Context, db dbtx, tables ...string) error {
	names := append([]string{pgclaim.VersionTable}, tables...)
	si, err := loadSchema(ctx, db, names)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if si.exists[t] {
			continue
		}
		if !si.exists[pgclaim.VersionTable] {
			return failf(migrateHint, "database %q is not migrated: pgclaim's table %s does not exist", si.database, t)
		}
		return failf("see 'pgclaim migrate status', then run 'pgclaim migrate up'",
			"pgclaim's table %s does not exist in database %q: its migrations are not all applied", t, si.database)
	}
	for _, t := range tables {
		for _, col := range pgclaimColumns[t] {
			if !slices.Contains(si.columns[t], col) {
				return failf("pgclaim's schema in this database does not match this pgclaim (changed by hand, or from another version); see 'pgclaim migrate status'",
					"table %s in database %q has no column %q", t, si.database, col)
			}
		}
	}
	return nil
}

// dbFail wraps a failed statement, with a hint for the SQLSTATEs an operator
// can act on.
func dbFail(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return &failure{msg: what + ": interrupted", err: err}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01": // undefined_table
			return &failure{msg: what + ": " + pgErr.Message, hint: migrateHint + "; or check the table name", err: err}
		case "42703": // undefined_column
			return &failure{msg: what + ": " + pgErr.Message, hint: "check the column names given in the flags", err: err}
		case "42501": // insufficient_privilege
			return &failure{msg: what + ": " + pgErr.Message, hint: "connect as a role allowed to read and write the table", err: err}
		}
	}
	return &failure{msg: what + ": " + err.Error(), err: err}
}
