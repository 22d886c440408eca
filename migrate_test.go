package pgclaim_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

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

// appMigrations are an application's own migrations, as MigrateFS sees
// them (in an application, an embed.FS).
var appMigrations = fstest.MapFS{
	"00001_push_requests.sql": {Data: []byte("-- +goose Up\nCREATE TABLE push_requests (id bigint PRIMARY KEY, status text NOT NULL);\n-- +goose Down\nDROP TABLE push_requests;\n")},
	"00002_sent_pushes.sql":   {Data: []byte("-- +goose Up\nCREATE TABLE sent_pushes (push_id bigint PRIMARY KEY);\n-- +goose Down\nDROP TABLE sent_pushes;\n")},
}

var appOpts = pgclaim.MigrateOptions{Table: "app_schema_version", LockID: 0x617070}

// Instances starting together apply the application's migrations once,
// recorded in the application's own table, and report which call applied
// which.
func TestMigrateFSConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	const instances = 6
	start := make(chan struct{})
	applied := make([][]pgclaim.Migration, instances)
	errs := make([]error, instances)
	var wg sync.WaitGroup
	for i := range instances {
		pool := db.NewPool(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			applied[i], errs[i] = pgclaim.MigrateFS(ctx, pool, appMigrations, appOpts)
		}()
	}
	close(start)
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		for _, m := range applied[i] {
			seen[m.Name]++
			if !m.Applied || m.AppliedAt.IsZero() || m.Version < 1 {
				t.Errorf("instance %d reports %+v", i, m)
			}
		}
	}
	if len(seen) != 2 || seen["00001_push_requests.sql"] != 1 || seen["00002_sent_pushes.sql"] != 1 {
		t.Errorf("applied, across instances: %v; want each file once", seen)
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM app_schema_version WHERE version_id > 0`).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("app_schema_version: %d rows (%v), want 2", rows, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schema_version WHERE version_id > 0`).Scan(&rows); err != nil || rows != migrationFiles(t) {
		t.Fatalf("pgclaim_schema_version: %d rows (%v), want %d", rows, err, migrationFiles(t))
	}
	again, err := pgclaim.MigrateFS(ctx, db.Pool, appMigrations, appOpts)
	if err != nil || len(again) != 0 {
		t.Fatalf("second start-up: %v, %v; want nothing applied", again, err)
	}
	// pgclaim's status is its own.
	st, err := pgclaim.MigrationStatus(ctx, db.Pool)
	if err != nil || len(st) != migrationFiles(t) {
		t.Fatalf("pgclaim status: %v, %v", st, err)
	}

	// A schema-qualified version table.
	exec := func(sql string) {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE SCHEMA other`)
	other := fstest.MapFS{"00001_x.sql": {Data: []byte("-- +goose Up\nCREATE TABLE other.x (id int);\n-- +goose Down\nDROP TABLE other.x;\n")}}
	got, err := pgclaim.MigrateFS(ctx, db.Pool, other, pgclaim.MigrateOptions{Table: "other.schema_version", LockID: 0x6f74686572})
	if err != nil || len(got) != 1 || got[0].Name != "00001_x.sql" {
		t.Fatalf("schema-qualified table: %v, %v", got, err)
	}
	exec(`SELECT 1 FROM other.schema_version`)
}

func TestMigrateFSOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		opts pgclaim.MigrateOptions
		want string
	}{
		{pgclaim.MigrateOptions{LockID: 1}, "pgclaim: MigrateOptions.Table: must not be empty"},
		{pgclaim.MigrateOptions{Table: "App_Versions", LockID: 1}, `pgclaim: MigrateOptions.Table: "App_Versions" is not a lower-case SQL identifier`},
		{pgclaim.MigrateOptions{Table: "v; DROP TABLE x", LockID: 1}, "pgclaim: MigrateOptions.Table: "},
		{pgclaim.MigrateOptions{Table: "a.b.c", LockID: 1}, "pgclaim: MigrateOptions.Table: "},
		{pgclaim.MigrateOptions{Table: pgclaim.VersionTable, LockID: 1}, "pgclaim: MigrateOptions.Table: must not be pgclaim_schema_version"},
		{pgclaim.MigrateOptions{Table: "public.pgclaim_schema_version", LockID: 1}, "pgclaim: MigrateOptions.Table: must not be pgclaim_schema_version"},
		{pgclaim.MigrateOptions{Table: "app_versions"}, "pgclaim: MigrateOptions.LockID: must not be zero"},
		{pgclaim.MigrateOptions{Table: "app_versions", LockID: pgclaim.MigrationLockID}, "pgclaim: MigrateOptions.LockID: must differ from MigrationLockID"},
		{pgclaim.MigrateOptions{Table: "app_versions", LockID: lock.DefaultLockID}, "pgclaim: MigrateOptions.LockID: must differ from goose's default key"},
	} {
		// Options are checked before the pool.
		_, err := pgclaim.MigrateFS(ctx, nil, appMigrations, c.opts)
		if !errors.Is(err, pgclaim.ErrInvalid) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q (ErrInvalid)", c.opts, err, c.want)
		}
	}
	if _, err := pgclaim.MigrateFS(ctx, nil, nil, appOpts); !errors.Is(err, pgclaim.ErrInvalid) || !strings.Contains(err.Error(), "fsys") {
		t.Errorf("nil fsys: %v", err)
	}
	if _, err := pgclaim.MigrateFS(ctx, nil, appMigrations, appOpts); !errors.Is(err, pgclaim.ErrNilPool) {
		t.Errorf("nil pool: %v", err)
	}
}
