package pgclaim

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

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
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	p, closeDB, err := newProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	pending, err := p.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("pgclaim: migrate: %w", err)
	}
	if !pending {
		return nil
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgclaim: migrate: %w", err)
	}
	return nil
}

// MigrationStatus reports every pgclaim migration and whether it has been
// applied to the database behind pool, oldest first.
func MigrationStatus(ctx context.Context, pool *pgxpool.Pool) ([]Migration, error) {
	p, closeDB, err := newProvider(pool)
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

func newProvider(pool *pgxpool.Pool) (*goose.Provider, func(), error) {
	if pool == nil {
		return nil, nil, ErrNilPool
	}
	// Retry the lock every second for up to ten minutes: a long migration in
	// another instance is waited for, not failed.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(MigrationLockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, nil, fmt.Errorf("pgclaim: migration locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("pgclaim: migration provider: %w", err)
	}
	return p, func() { _ = p.Close() }, nil
}
