package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/examples/pushresume/migrations"
)

// schemaOptions record the service's own migrations beside pgclaim's
// pgclaim_schema_version, so neither set of goose migrations sees the
// other, under an advisory lock key of the service's own (the bytes
// "pushrsm" read as a big-endian integer): not goose's default key, and not
// pgclaim's.
var schemaOptions = pgclaim.MigrateOptions{
	Table:  "pushresume_schema_version",
	LockID: 0x7075736872736d,
}

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
	own, err := pgclaim.MigrateFS(ctx, pool, migrations.FS, schemaOptions)
	if err != nil {
		return nil, err
	}
	for _, m := range own {
		applied = append(applied, m.Name)
	}
	return applied, nil
}
