package pgclaim_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

var empty = pgtest.Template{Name: "empty", Unmigrated: true}

func migrationFiles(t *testing.T) int {
	t.Helper()
	files, err := migrations.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if len(f.Name()) > 4 && f.Name()[len(f.Name())-4:] == ".sql" {
			n++
		}
	}
	return n
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabaseFrom(t, empty)
	const instances = 8
	pools := make([]*pgxpool.Pool, instances)
	for i := range pools {
		pools[i] = db.NewPool(t)
	}
	start := make(chan struct{})
	errs := make([]error, instances)
	var wg sync.WaitGroup
	for i := range pools {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			errs[i] = pgclaim.Migrate(ctx, pools[i])
		}(i)
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("instance %d: %v", i, err)
		}
	}
	var applied, distinct int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT version_id)
		FROM pgclaim_schema_version WHERE version_id > 0`).Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if want := migrationFiles(t); applied != want || distinct != want {
		t.Fatalf("version rows %d (distinct %d), want each of %d migrations applied exactly once", applied, distinct, want)
	}
	st, err := pgclaim.MigrationStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st {
		if !m.Applied || m.AppliedAt.IsZero() {
			t.Errorf("migration %d %s not reported applied", m.Version, m.Name)
		}
	}
}

func TestMigrationStatusPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabaseFrom(t, empty)
	st, err := pgclaim.MigrationStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != migrationFiles(t) {
		t.Fatalf("status lists %d migrations, want %d", len(st), migrationFiles(t))
	}
	for _, m := range st {
		if m.Applied {
			t.Errorf("migration %s reported applied on an empty database", m.Name)
		}
	}
	if st[0].Version != 1 || st[0].Name != "00001_pgclaim_init.sql" {
		t.Errorf("first migration %d %q", st[0].Version, st[0].Name)
	}
	if err := pgclaim.Migrate(ctx, nil); !errors.Is(err, pgclaim.ErrNilPool) {
		t.Errorf("nil pool: got %v", err)
	}
}

// An application with its own goose migrations (goose's default version
// table) and pgclaim's migrations in one database: neither sees the other's.
func TestVersionTableCoexistsWithGoose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabaseFrom(t, empty)
	appFS := fstest.MapFS{
		"00001_app.sql": {Data: []byte("-- +goose Up\nCREATE TABLE app_things (id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE app_things;\n")},
		"00002_app.sql": {Data: []byte("-- +goose Up\nALTER TABLE app_things ADD COLUMN note text;\n-- +goose Down\nALTER TABLE app_things DROP COLUMN note;\n")},
		"00003_app.sql": {Data: []byte("-- +goose Up\nCREATE INDEX ON app_things (note);\n-- +goose Down\nSELECT 1;\n")},
	}
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	app, err := goose.NewProvider(goose.DialectPostgres, sqlDB, appFS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	// Running both again changes nothing.
	if _, err := app.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	var appMax, appRows, ours int
	if err := db.Pool.QueryRow(ctx, `SELECT max(version_id), count(*) FILTER (WHERE version_id > 0) FROM goose_db_version`).Scan(&appMax, &appRows); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schema_version WHERE version_id > 0`).Scan(&ours); err != nil {
		t.Fatal(err)
	}
	if appMax != 3 || appRows != 3 {
		t.Fatalf("goose_db_version: max %d rows %d, want 3 and 3", appMax, appRows)
	}
	if ours != migrationFiles(t) {
		t.Fatalf("pgclaim_schema_version: %d rows, want %d", ours, migrationFiles(t))
	}
	cur, err := app.GetDBVersion(ctx)
	if err != nil || cur != 3 {
		t.Fatalf("application's goose version %d, %v; want 3", cur, err)
	}
}
