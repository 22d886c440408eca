package main

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

const migrateAbout = `
migrate up applies every pending pgclaim migration (safe while instances run
and while other instances migrate at start-up: they serialise on an advisory
lock). migrate status lists pgclaim's migrations and whether each is applied;
it changes nothing, even in a database never migrated.

pgclaim records its versions in its own table, ` + pgclaim.VersionTable + `,
beside any goose table of the application.`

type migrationJSON struct {
	Version   int64      `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at"`
}

func runMigrate(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "migrate", "migrate up|status [--database-url URL] [--json]", migrateAbout)
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing action: want 'up' or 'status'")
	}
	if len(pos) > 1 {
		return usagef("unexpected argument %q", pos[1])
	}
	action := pos[0]
	if action != "up" && action != "status" {
		return usagef("unknown action %q: want 'up' or 'status'", action)
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	before, database, err := migrationState(ctx, pool, f.schema)
	if err != nil {
		return err
	}
	if action == "status" {
		return printMigrationStatus(f, database, before)
	}

	if err := pgclaim.Migrate(ctx, pool, pgclaim.WithSchema(f.schema)); err != nil {
		return dbFail("migrate up", err)
	}
	after, _, err := migrationState(ctx, pool, f.schema)
	if err != nil {
		return err
	}
	var applied []migrationJSON
	for _, m := range after {
		i := slices.IndexFunc(before, func(b pgclaim.Migration) bool { return b.Version == m.Version })
		if m.Applied && (i < 0 || !before[i].Applied) {
			applied = append(applied, toMigrationJSON(m))
		}
	}
	version := currentVersion(after)
	if f.json {
		if applied == nil {
			applied = []migrationJSON{}
		}
		return writeJSON(e.stdout, struct {
			Database string          `json:"database"`
			Applied  []migrationJSON `json:"applied"`
			Version  int64           `json:"version"`
		}{database, applied, version})
	}
	if len(applied) == 0 {
		fmt.Fprintf(e.stdout, "nothing to apply: database %q is up to date at version %d\n", database, version)
		return nil
	}
	for _, m := range applied {
		fmt.Fprintf(e.stdout, "applied %s\n", m.Name)
	}
	fmt.Fprintf(e.stdout, "database %q is now at version %d\n", database, version)
	return nil
}

func toMigrationJSON(m pgclaim.Migration) migrationJSON {
	j := migrationJSON{Version: m.Version, Name: m.Name, Applied: m.Applied}
	if m.Applied && !m.AppliedAt.IsZero() {
		t := m.AppliedAt
		j.AppliedAt = &t
	}
	return j
}

func currentVersion(ms []pgclaim.Migration) int64 {
	var v int64
	for _, m := range ms {
		if m.Applied && m.Version > v {
			v = m.Version
		}
	}
	return v
}

// migrationState reports pgclaim's migrations in the database. In a
// database without pgclaim's version table every migration is pending, and
// the table is not created (pgclaim.MigrationStatus would create it).
func migrationState(ctx context.Context, pool *pgxpool.Pool, schema string) ([]pgclaim.Migration, string, error) {
	si, err := loadSchema(ctx, pool, []string{pgclaim.VersionTable})
	if err != nil {
		return nil, "", err
	}
	if !si.exists[pgclaim.VersionTable] {
		ms, err := embeddedMigrations()
		return ms, si.database, err
	}
	for _, col := range pgclaimColumns[pgclaim.VersionTable] {
		if !slices.Contains(si.columns[pgclaim.VersionTable], col) {
			return nil, "", failf("the table was changed by hand, or is not a goose version table; restore it from a backup or fix it by hand",
				"table %s in database %q has no column %q, so pgclaim cannot tell which migrations are applied",
				pgclaim.VersionTable, si.database, col)
		}
	}
	ms, err := pgclaim.MigrationStatus(ctx, pool, pgclaim.WithSchema(schema))
	if err != nil {
		return nil, "", dbFail("migration status", err)
	}
	return ms, si.database, nil
}

// embeddedMigrations lists the migrations built into this pgclaim, all
// pending.
func embeddedMigrations() ([]pgclaim.Migration, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, err
	}
	var out []pgclaim.Migration
	for _, ent := range entries {
		name := ent.Name()
		if ent.IsDir() || path.Ext(name) != ".sql" {
			continue
		}
		prefix, _, _ := strings.Cut(name, "_")
		v, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, pgclaim.Migration{Version: v, Name: name})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

func printMigrationStatus(f *flags, database string, ms []pgclaim.Migration) error {
	pending := 0
	for _, m := range ms {
		if !m.Applied {
			pending++
		}
	}
	if f.json {
		list := make([]migrationJSON, 0, len(ms))
		for _, m := range ms {
			list = append(list, toMigrationJSON(m))
		}
		return writeJSON(f.e.stdout, struct {
			Database   string          `json:"database"`
			Version    int64           `json:"version"`
			Pending    int             `json:"pending"`
			Migrations []migrationJSON `json:"migrations"`
		}{database, currentVersion(ms), pending, list})
	}
	t := newTable(f.e.stdout, "VERSION", "NAME", "STATE", "APPLIED AT")
	for _, m := range ms {
		state, at := "pending", "-"
		if m.Applied {
			state, at = "applied", fmtTime(m.AppliedAt)
		}
		t.row(m.Version, m.Name, state, at)
	}
	if err := t.flush(); err != nil {
		return err
	}
	switch {
	case pending == len(ms):
		fmt.Fprintf(f.e.stdout, "\ndatabase %q is not migrated: run 'pgclaim migrate up'\n", database)
	case pending > 0:
		fmt.Fprintf(f.e.stdout, "\ndatabase %q has %s: run 'pgclaim migrate up'\n", database, plural(int64(pending), "pending migration", "pending migrations"))
	default:
		fmt.Fprintf(f.e.stdout, "\ndatabase %q is up to date at version %d\n", database, currentVersion(ms))
	}
	return nil
}
