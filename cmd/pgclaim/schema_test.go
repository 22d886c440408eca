package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

// TestSchema: --out writes pgclaim's migration files as embedded; without
// it the Up sections make a schema that creates pgclaim's tables in an
// empty database; a directory of the application's own migrations is
// refused.
func TestSchema(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatal(names, err)
	}

	dir := filepath.Join(t.TempDir(), "db", "pgclaim")
	for range 2 { // again after an upgrade: the same files, rewritten
		r := cli(t, "", "schema", "--out", dir)
		wantCode(t, r, exitOK)
		wantContains(t, "stdout", r.stdout, fmt.Sprintf("wrote %d migrations to %s: 00001_pgclaim_init.sql, ", len(names), dir))
	}
	written, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != len(names) {
		t.Fatalf("%d files written, want %d", len(written), len(names))
	}
	for _, name := range names {
		want, _ := fs.ReadFile(migrations.FS, name)
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: written file differs from the embedded migration (%v)", name, err)
		}
	}
	r := cli(t, "", "schema", "--out", dir, "--json")
	wantCode(t, r, exitOK)
	if out := decodeJSON[schemaJSON](t, r.stdout); out.Dir != dir || len(out.Files) != len(names) || out.Files[0].SQL != "" {
		t.Errorf("--out --json = %+v", out)
	}

	// The application's migrations directory: refused, nothing written.
	app := t.TempDir()
	if err := os.WriteFile(filepath.Join(app, "00001_push_requests.sql"), []byte("-- +goose Up\nSELECT 1;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = cli(t, "", "schema", "--out", app)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		"pgclaim schema: "+app+" holds .sql files that are not pgclaim's migrations: 00001_push_requests.sql\n",
		"hint: write pgclaim's schema to a directory of its own")
	if entries, _ := os.ReadDir(app); len(entries) != 1 {
		t.Errorf("a refused schema wrote into %s: %v", app, entries)
	}

	// stdout: the Up sections, which create pgclaim's schema.
	r = cli(t, "", "schema")
	wantCode(t, r, exitOK)
	if strings.Contains(strings.ToLower(r.stdout), "+goose down") || strings.Contains(r.stdout, "DROP TABLE") {
		t.Errorf("the schema holds Down sections:\n%s", r.stdout)
	}
	for _, name := range names {
		wantContains(t, "schema", r.stdout, "\n-- "+name+"\n")
	}
	db := unmigrated(t)
	exec1(t, db, r.stdout)
	var tables []string
	if err := db.Pool.QueryRow(context.Background(), `SELECT array_agg(tablename::text ORDER BY tablename) FROM pg_tables WHERE tablename LIKE 'pgclaim%'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pgclaim_locks", "pgclaim_terms", "pgclaim_ticks"} {
		if !slices.Contains(tables, want) {
			t.Errorf("the printed schema does not create %s (tables %v)", want, tables)
		}
	}
	r = cli(t, "", "schema", "--json")
	wantCode(t, r, exitOK)
	if out := decodeJSON[schemaJSON](t, r.stdout); len(out.Files) != len(names) || !strings.Contains(out.Files[0].SQL, "CREATE SEQUENCE pgclaim_fence_seq") {
		t.Errorf("--json = %+v", out)
	}

	r = cli(t, "", "schema", "extra")
	wantCode(t, r, exitUsage)
}

// TestSchemaNotify: --notify writes a goose migration whose Up attaches the
// trigger announcing the table's rows and whose Down detaches it; a spec
// without a column or a value is refused.
func TestSchemaNotify(t *testing.T) {
	t.Parallel()
	r := cli(t, "", "schema", "--notify", "items.status=PAUSED")
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "-- +goose Up\nSELECT pgclaim_notify_on('\"items\"'::regclass, 'status', 'PAUSED');",
		"-- +goose Down\nSELECT pgclaim_notify_off('\"items\"'::regclass, 'status', 'PAUSED');")
	up, err := upSection(r.stdout)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.NewDatabase(t)
	exec1(t, db, `CREATE TABLE items (id bigint PRIMARY KEY, status text NOT NULL)`)
	exec1(t, db, up)
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass AND tgname LIKE 'pgclaim_notify_%'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d triggers after the migration's Up, want 2 (%v)", n, err)
	}

	r = cli(t, "", "schema", "--notify", "sales.items.status=PAUSED", "--pgclaim-schema", "pgclaim")
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, `SELECT "pgclaim".pgclaim_notify_on('"sales"."items"'::regclass, 'status', 'PAUSED');`)
	for _, bad := range []string{"items", "items.status", "items.status=", ".status=PAUSED"} {
		r := cli(t, "", "schema", "--notify", bad)
		wantCode(t, r, exitUsage)
		wantContains(t, "stderr", r.stderr, "want TABLE.COLUMN=VALUE")
	}
}
