package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/pgtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := unmigrated(t)
	all, err := embeddedMigrations()
	if err != nil || len(all) < 2 {
		t.Fatalf("embedded migrations: %v, %v", all, err)
	}
	last := all[len(all)-1].Version

	// status on a database never migrated: everything pending, nothing created.
	r := cli(t, "", "migrate", "status", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	var want strings.Builder
	width := 0
	for _, m := range all {
		width = max(width, len(m.Name))
	}
	fmt.Fprintf(&want, "VERSION  %-*s  STATE    APPLIED AT\n", width, "NAME")
	for _, m := range all {
		fmt.Fprintf(&want, "%-7d  %-*s  pending  -\n", m.Version, width, m.Name)
	}
	fmt.Fprintf(&want, "\ndatabase %q is not migrated: run 'pgclaim migrate up'\n", db.Name)
	if r.stdout != want.String() {
		t.Errorf("status of an unmigrated database:\n%s\nwant:\n%s", r.stdout, want.String())
	}
	var exists bool
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgclaim.VersionTable).Scan(&exists); err != nil || exists {
		t.Fatalf("migrate status created %s (exists=%v, err=%v)", pgclaim.VersionTable, exists, err)
	}
	r = cli(t, "", "migrate", "status", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	st := decodeJSON[struct {
		Database   string          `json:"database"`
		Version    int64           `json:"version"`
		Pending    int             `json:"pending"`
		Migrations []migrationJSON `json:"migrations"`
	}](t, r.stdout)
	if st.Database != db.Name || st.Version != 0 || st.Pending != len(all) || len(st.Migrations) != len(all) || st.Migrations[0].Applied {
		t.Errorf("status JSON = %+v", st)
	}

	// up applies everything, once.
	r = cli(t, "", "migrate", "up", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	want.Reset()
	for _, m := range all {
		fmt.Fprintf(&want, "applied %s\n", m.Name)
	}
	fmt.Fprintf(&want, "database %q is now at version %d\n", db.Name, last)
	if r.stdout != want.String() {
		t.Errorf("migrate up:\n%s\nwant:\n%s", r.stdout, want.String())
	}
	applied, err := pgclaim.MigrationStatus(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range applied {
		if !m.Applied {
			t.Errorf("migration %s not applied after migrate up", m.Name)
		}
	}

	r = cli(t, "", "migrate", "up", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := fmt.Sprintf("nothing to apply: database %q is up to date at version %d\n", db.Name, last); r.stdout != want {
		t.Errorf("second migrate up = %q, want %q", r.stdout, want)
	}
	r = cli(t, "", "migrate", "--json", "up", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	up := decodeJSON[struct {
		Database string          `json:"database"`
		Applied  []migrationJSON `json:"applied"`
		Version  int64           `json:"version"`
	}](t, r.stdout)
	if up.Database != db.Name || len(up.Applied) != 0 || up.Version != last {
		t.Errorf("migrate up JSON = %+v", up)
	}

	r = cli(t, "", "migrate", "status", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "status", r.stdout, "applied  20", fmt.Sprintf("database %q is up to date at version %d", db.Name, last))
	if strings.Contains(r.stdout, "pending") {
		t.Errorf("status after up shows pending migrations:\n%s", r.stdout)
	}
	r = cli(t, "", "migrate", "status", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	st = decodeJSON[struct {
		Database   string          `json:"database"`
		Version    int64           `json:"version"`
		Pending    int             `json:"pending"`
		Migrations []migrationJSON `json:"migrations"`
	}](t, r.stdout)
	if st.Version != last || st.Pending != 0 || len(st.Migrations) != len(all) {
		t.Errorf("status JSON after up = %+v", st)
	}
	for _, m := range st.Migrations {
		if !m.Applied || m.AppliedAt == nil {
			t.Errorf("migration %+v not reported applied", m)
		}
	}
}

func TestMigratePartlyApplied(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	// Forget the migrations after the first, as in a database migrated by
	// an older release: status reports them pending, and other commands say
	// so. (00003, 00006, 00007 and 00012 only change indexes and 00013 adds a column if missing, so all can be applied (00014 and 00015 replace their functions too)
	// again, as can 00005, 00008 and 00011, which replace their functions, 00009 and
	// 00010, which creates only what is missing; 00004's
	// tables are dropped with 00002's.)
	exec1(t, db, `DROP TABLE pgclaim_terms, pgclaim_schedule_runs, pgclaim_schedules`)
	exec1(t, db, `DELETE FROM `+pgclaim.VersionTable+` WHERE version_id >= 2`)
	r := cli(t, "", "migrate", "status", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	all, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	wantContains(t, "status", r.stdout, fmt.Sprintf("has %d pending migrations: run 'pgclaim migrate up'", len(all)-1))
	if !slices.ContainsFunc(strings.Split(r.stdout, "\n"), func(l string) bool {
		return slices.Equal(strings.Fields(l), []string{"2", "00002_pgclaim_terms.sql", "pending", "-"})
	}) {
		t.Errorf("status does not show 00002_pgclaim_terms.sql pending:\n%s", r.stdout)
	}

	r = cli(t, "", "locks", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		fmt.Sprintf("pgclaim locks: pgclaim's table pgclaim_terms does not exist in database %q: its migrations are not all applied", db.Name),
		"hint: see 'pgclaim migrate status', then run 'pgclaim migrate up'")

	r = cli(t, "", "migrate", "up", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := fmt.Sprintf("applied 00002_pgclaim_terms.sql\ndatabase %q is now at version 2\n", db.Name); !strings.HasPrefix(r.stdout, "applied 00002_pgclaim_terms.sql\n") {
		t.Errorf("migrate up = %q, want %q", r.stdout, want)
	}
	wantCode(t, cli(t, "", "locks", "--database-url", db.URL), exitOK)
}

func TestMigrateMissingColumn(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	exec1(t, db, `ALTER TABLE `+pgclaim.VersionTable+` DROP COLUMN tstamp`)
	for _, action := range []string{"status", "up"} {
		r := cli(t, "", "migrate", action, "--database-url", db.URL)
		wantCode(t, r, exitError)
		wantContains(t, "stderr", r.stderr,
			fmt.Sprintf("pgclaim migrate: table %s in database %q has no column \"tstamp\", so pgclaim cannot tell which migrations are applied\n", pgclaim.VersionTable, db.Name),
			"hint: ")
	}
}

// TestMigrateSchema: --schema puts pgclaim's objects in a schema of their
// own, and the other commands find them there.
func TestMigrateSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := unmigrated(t)
	r := cli(t, "", "migrate", "up", "--schema", "jobs", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	var inJobs, inPublic bool
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('jobs.pgclaim_schedules') IS NOT NULL, to_regclass('public.pgclaim_schedules') IS NOT NULL`).
		Scan(&inJobs, &inPublic); err != nil || !inJobs || inPublic {
		t.Fatalf("pgclaim_schedules in jobs %v, in public %v (%v)", inJobs, inPublic, err)
	}
	r = cli(t, "", "migrate", "status", "--json", "--schema", "jobs", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	st := decodeJSON[struct {
		Database   string          `json:"database"`
		Version    int64           `json:"version"`
		Pending    int             `json:"pending"`
		Migrations []migrationJSON `json:"migrations"`
	}](t, r.stdout)
	if st.Pending != 0 || st.Version == 0 {
		t.Errorf("status in jobs: %d pending", st.Pending)
	}
	r = cli(t, "", "schedules", "list", "--schema", "jobs", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	r = cli(t, "", "migrate", "up", "--schema", "Jobs", "--database-url", db.URL)
	wantCode(t, r, exitUsage)
	wantContains(t, "migrate --schema Jobs", r.stderr, "--schema")
}
