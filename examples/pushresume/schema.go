package main

import (
	"context"
	"fmt"
	"path"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/examples/pushresume/migrations"
)

// versionTable records the service's own migrations, beside pgclaim's
// pgclaim_schema_version, so neither set of goose migrations sees the other.
const versionTable = "pushresume_schema_version"

// migrationLockID is the advisory lock key held while the service's own
// migrations run (the bytes "pushrsm" read as a big-endian integer): not
// goose's default key, and not pgclaim's.
const migrationLockID int64 = 0x7075736872736d

// migrate applies pgclaim's migrations and then the service's own, and
// returns the names of the files applied (empty when the schema was up to
// date). Instances call it at start-up; concurrent calls are safe, and each
// migration is applied once. The service's own files are listed only by the
// call that applied them; pgclaim's are listed by every call that found them
// pending, since pgclaim.Migrate does not say which call applied them.
func migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	before, err := pgclaim.MigrationStatus(ctx, pool)
	if err != nil {
		return nil, err
	}
	if err := pgclaim.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range before {
		if !m.Applied {
			applied = append(applied, m.Name)
		}
	}

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, fmt.Errorf("pushresume: migration locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(versionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pushresume: migration provider: %w", err)
	}
	defer p.Close()
	pending, err := p.HasPending(ctx)
	if err != nil {
		return nil, fmt.Errorf("pushresume: migrate: %w", err)
	}
	if !pending {
		return applied, nil
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("pushresume: migrate: %w", err)
	}
	for _, r := range res {
		applied = append(applied, path.Base(r.Source.Path))
	}
	return applied, nil
}
