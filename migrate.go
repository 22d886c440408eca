package pgclaim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

// VersionTable is the table in which pgclaim records its applied migrations.
// It is not goose's default (goose_db_version), so pgclaim's schema versions
// live beside an application's own goose migrations without mixing.
const VersionTable = "pgclaim_schema_version"

// MigrationLockID is the session advisory lock key held while pgclaim's
// migrations run, so that instances starting together apply each migration
// once. It is the ASCII bytes of "pgclaim" read as a big-endian integer; it
// differs from goose's default key, which every goose user shares.
const MigrationLockID int64 = 0x7067636c61696d

// ErrNilPool is returned when a nil pool is passed.
var ErrNilPool = errors.New("pgclaim: pool is nil")

// ErrInvalid is matched (with errors.Is) by every error about bad input to
// this package, such as a MigrateOptions field; the error's text names the
// field.
var ErrInvalid = errors.New("pgclaim: invalid input")

// fieldError reports bad input for one named field. It reads
// "pgclaim: <field>: <msg>" and unwraps to ErrInvalid.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return "pgclaim: " + e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return ErrInvalid }

// Migration is the state of one of pgclaim's migrations in a database.
type Migration struct {
	Version   int64     // the file's numeric prefix
	Name      string    // the file name
	Applied   bool      // whether it has been applied
	AppliedAt time.Time // when it was applied (zero if pending)
}

// Migrate applies every pending pgclaim migration to the database behind
// pool. Concurrent calls from many instances are safe: they serialise on a
// session advisory lock (MigrationLockID) and each migration is applied once.
// When nothing is pending it returns without taking the lock.
//
// Every call then has the database choose the fencing token for what the
// server allows (FenceTimeline, or FenceSequence where the WAL control
// functions are refused, as on Aurora), so call it at every start-up; the
// application's role may call it once the migrations are applied.
//
// With WithSchema, pgclaim's objects (and its version table) live in that
// schema: see WithSchema.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	o, err := options(opts)
	if err != nil {
		return err
	}
	if pool == nil {
		return ErrNilPool
	}
	mpool, closePool, err := o.migrationPool(ctx, pool)
	if err != nil {
		return err
	}
	defer closePool()
	p, closeDB, err := newProviderFS(mpool, migrations.FS, o.versionTable(), MigrationLockID)
	if err != nil {
		return err
	}
	defer closeDB()
	pending, err := p.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("pgclaim: migrate: %w", explainCreate(ctx, pool, o.name, err))
	}
	if pending {
		if _, err := p.Up(ctx); err != nil {
			return fmt.Errorf("pgclaim: migrate: %w", explainCreate(ctx, pool, o.name, err))
		}
	}
	return checkFence(ctx, pool, o.schema)
}

// explainCreate explains err, a failure to find or apply the migrations,
// from the catalog (pgerr.ExplainAt): which privilege the role lacks on
// pgclaim's objects in schema, or CREATE on the schema itself that
// creating them takes, and which are missing; alike in every lc_messages.
func explainCreate(ctx context.Context, pool *pgxpool.Pool, schema string, err error) error {
	return pgerr.ExplainAt(ctx, pool, schema, err, pgerr.Need{Kind: pgerr.Schema, Schema: schema, Privileges: "CREATE", ToCreate: true})
}

// Option is a setting of Migrate and MigrationStatus.
type Option func(*settings)

type settings struct {
	name   string
	schema *qualify.Schema
}

// WithSchema puts pgclaim's objects in the schema name (a lower-case SQL
// identifier), created when missing: its tables, sequence, functions and
// domains, and VersionTable. The migrations run on a session of their own
// whose search_path is that schema alone; give the constructors' Config
// the same Schema, and every statement names the schema: nothing depends
// on the application's search_path, so it works behind PgBouncer in
// transaction mode (migrate over a direct connection: goose holds a
// session advisory lock). Installations in different schemas of one
// database never see each other's rows. The empty name is the default:
// the objects are found through search_path.
func WithSchema(name string) Option {
	return func(s *settings) { s.name = name }
}

func options(opts []Option) (settings, error) {
	var s settings
	for _, o := range opts {
		o(&s)
	}
	if msg := qualify.Check(s.name); msg != "" {
		return s, &fieldError{"WithSchema", msg}
	}
	s.schema = qualify.New(s.name)
	return s, nil
}

func (s settings) versionTable() string {
	if s.name == "" {
		return VersionTable
	}
	return s.name + "." + VersionTable
}

// migrationPool returns pool, or for a schema a small pool of its own on
// the same server whose sessions have that schema alone as search_path,
// after creating the schema if it is missing.
func (s settings) migrationPool(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, func(), error) {
	if s.name == "" {
		return pool, func() {}, nil
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", s.name).Scan(&exists); err != nil {
		return nil, nil, fmt.Errorf("pgclaim: migrate: look for schema %s: %w", s.name, err)
	}
	if !exists {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s.name}.Sanitize()); err != nil {
			return nil, nil, fmt.Errorf("pgclaim: migrate: create schema %s: %w", s.name, pgerr.Explain(err))
		}
	}
	cfg := pool.Config()
	cfg.MinConns, cfg.MaxConns = 0, 2
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{s.name}.Sanitize()
	mp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("pgclaim: migrate: %w", err)
	}
	return mp, mp.Close, nil
}

// The fencing tokens pgclaim_fence() can grant; pgclaim_fence_mode records
// which is in force (see migration 00010).
const (
	// FenceTimeline is the server's WAL timeline * 2^48 + a sequence
	// value: unique and increasing across every primary promotion. It is
	// in force where PUBLIC may execute pg_current_wal_insert_lsn() and
	// pg_walfile_name(pg_lsn).
	FenceTimeline = "timeline"
	// FenceSequence is a constant * 2^48 + a sequence value: unique and
	// increasing on one server and across failovers on shared storage
	// (Aurora, RDS Multi-AZ instances), but not across the promotion of an
	// asynchronous streaming replica. It is in force where the WAL control
	// functions are refused.
	FenceSequence = "sequence"
)

// checkFence has the database choose the fencing token pgclaim_fence()
// grants, for what the server allows now (pgclaim_fence_check(), which
// switches only when needed), at READ COMMITTED so that a check waiting
// for another instance's switch sees it. A standby is left alone: it
// answers no WAL insert location, and grants no token.
func checkFence(ctx context.Context, pool *pgxpool.Pool, schema *qualify.Schema) error {
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, schema.SQL("SELECT CASE WHEN NOT pg_is_in_recovery() THEN pgclaim_fence_check() END"))
		return err
	})
	if err != nil {
		return fmt.Errorf("pgclaim: migrate: choose the fencing token (pgclaim_fence_check()): %w", pgerr.ExplainAt(ctx, pool, schema.Name(), err))
	}
	return nil
}

// MigrationStatus reports every pgclaim migration and whether it has been
// applied to the database behind pool (in the schema WithSchema names),
// oldest first.
func MigrationStatus(ctx context.Context, pool *pgxpool.Pool, opts ...Option) ([]Migration, error) {
	o, err := options(opts)
	if err != nil {
		return nil, err
	}
	p, closeDB, err := newProviderFS(pool, migrations.FS, o.versionTable(), MigrationLockID)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgclaim: migration status: %w", err)
	}
	out := make([]Migration, 0, len(st))
	for _, s := range st {
		out = append(out, Migration{
			Version:   s.Source.Version,
			Name:      path.Base(s.Source.Path),
			Applied:   s.State == goose.StateApplied,
			AppliedAt: s.AppliedAt,
		})
	}
	return out, nil
}

// MigrateOptions say where MigrateFS records an application's own
// migrations and which lock serialises them. Both fields are required:
// goose's defaults are shared by every goose user in the database.
type MigrateOptions struct {
	// Table is the table recording the versions applied from the
	// application's migrations: a lower-case SQL identifier, optionally
	// schema-qualified ("app.schema_version"). It is created on first use.
	// It must not be VersionTable, pgclaim's own. An application whose
	// migrations goose has so far recorded in goose's default table passes
	// "goose_db_version" to keep its history.
	Table string
	// LockID is the session advisory lock key held while the migrations
	// run, so that instances starting together apply each one once. It
	// must not be zero, MigrationLockID, or goose's default key
	// (lock.DefaultLockID, which every goose user shares): pick a constant
	// of your own, for example your service's name's bytes read as an
	// integer.
	LockID int64
}

// identRE is what goose can be given as a table name: it writes the name
// into its SQL unquoted, so only plain lower-case identifiers are safe.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$`)

func (o MigrateOptions) validate() error {
	switch {
	case o.Table == "":
		return &fieldError{"MigrateOptions.Table", "must not be empty: name the table recording your migrations' versions"}
	case !identRE.MatchString(o.Table):
		return &fieldError{"MigrateOptions.Table", fmt.Sprintf("%q is not a lower-case SQL identifier (letters, digits, '_'; at most 63; optionally schema.table)", o.Table)}
	case o.Table == VersionTable || strings.HasSuffix(o.Table, "."+VersionTable):
		return &fieldError{"MigrateOptions.Table", fmt.Sprintf("must not be %s, pgclaim's own version table", VersionTable)}
	case o.LockID == 0:
		return &fieldError{"MigrateOptions.LockID", "must not be zero: pick a key of your own"}
	case o.LockID == MigrationLockID:
		return &fieldError{"MigrateOptions.LockID", "must differ from MigrationLockID, pgclaim's own key"}
	case o.LockID == lock.DefaultLockID:
		return &fieldError{"MigrateOptions.LockID", "must differ from goose's default key, which every goose user shares"}
	}
	return nil
}

// MigrateFS applies every pending goose migration in fsys (files at its
// root, named like goose's NNNNN_name.sql; use fs.Sub for a directory) to
// the database behind pool, recording versions in opts.Table. It is
// pgclaim.Migrate for an application's own migrations: call it at start-up
// in every instance, after Migrate. Concurrent calls are safe: they
// serialise on the session advisory lock opts.LockID, waiting up to ten
// minutes for another instance's migrations, and each migration is applied
// once. When nothing is pending it returns without taking the lock.
//
// It returns the migrations this call applied, oldest first (none when the
// schema was up to date or another instance applied them). A migration
// that fails ends the call with an error naming it; those applied before
// it stay applied.
func MigrateFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, opts MigrateOptions) ([]Migration, error) {
	if fsys == nil {
		return nil, &fieldError{"MigrateFS", "fsys must not be nil"}
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	p, closeDB, err := newProviderFS(pool, fsys, opts.Table, opts.LockID)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	pending, err := p.HasPending(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgclaim: migrate %s: %w", opts.Table, err)
	}
	if !pending {
		return []Migration{}, nil
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgclaim: migrate %s: %w", opts.Table, err)
	}
	out := make([]Migration, 0, len(res))
	if len(res) == 0 {
		return out, nil
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgclaim: migrate %s: %w", opts.Table, err)
	}
	at := make(map[int64]time.Time, len(st))
	for _, s := range st {
		at[s.Source.Version] = s.AppliedAt
	}
	for _, r := range res {
		out = append(out, Migration{
			Version:   r.Source.Version,
			Name:      path.Base(r.Source.Path),
			Applied:   true,
			AppliedAt: at[r.Source.Version],
		})
	}
	return out, nil
}

func newProviderFS(pool *pgxpool.Pool, fsys fs.FS, table string, lockID int64) (*goose.Provider, func(), error) {
	if pool == nil {
		return nil, nil, ErrNilPool
	}
	// Retry the lock every second for up to ten minutes: a long migration in
	// another instance is waited for, not failed.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, nil, fmt.Errorf("pgclaim: migration locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(table),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("pgclaim: migration provider: %w", err)
	}
	return p, func() { _ = p.Close() }, nil
}
