package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/sql/migrations"
)

func init() {
	register(command{name: "schema", summary: "write pgclaim's migrations, e.g. for an application's sqlc schema", run: runSchema})
}

const schemaAbout = `
Writes pgclaim's schema without touching a database: with --out, its goose
migration files as they are (one per version, the same bytes pgclaim.Migrate
applies); without it, their Up sections in order to stdout, as one plain
SQL schema.

An application whose sqlc queries read pgclaim's tables (the tick ledger,
leases, election terms) adds the written directory to its sqlc schema,
beside its own migrations, and runs this command again after upgrading
pgclaim. Run it from the application's module, so that the version is the
one in its go.mod:

  go run github.com/pgclaim/pgclaim/cmd/pgclaim schema --out db/pgclaim

and in sqlc.yaml:  schema: ["migrations", "db/pgclaim"]

Write to a directory of pgclaim's own: goose applies every file of a
migrations directory, and pgclaim's version numbers would collide with the
application's. A directory holding other .sql files is refused. The files
are never applied from there: pgclaim.Migrate applies its embedded copy.

With --notify TABLE.COLUMN=VALUE it writes instead a goose migration for the
application that attaches the trigger announcing rows of TABLE entering
COLUMN = VALUE (claim workers then claim them at once, not at their next
poll); --pgclaim-schema names pgclaim's schema under pgclaim.WithSchema:

  go tool pgclaim schema --notify push_requests.status=PAUSED > migrations/00002_notify.sql`

type schemaJSON struct {
	Dir   string           `json:"dir,omitempty"`
	Files []schemaFileJSON `json:"files"`
}

type schemaFileJSON struct {
	Name string `json:"name"`
	SQL  string `json:"sql,omitempty"` // without --out: the Up section
}

func runSchema(_ context.Context, e *env, args []string) error {
	f := newFlags(e, "schema", "schema [--out DIR] [--json]", schemaAbout)
	out := f.String("out", "", "write the migration files into `DIR` (created if missing) instead of printing the schema")
	notify := f.String("notify", "", "write the application's migration attaching the trigger that announces rows of `TABLE.COLUMN=VALUE` (TABLE may be schema.table)")
	pgSchema := f.String("pgclaim-schema", "", "with --notify: the `schema` of pgclaim's objects (pgclaim.WithSchema)")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *notify != "" {
		if *out != "" || f.json {
			return usagef("--notify writes one migration to stdout: it takes neither --out nor --json")
		}
		m, err := notifyMigration(*notify, *pgSchema)
		if err != nil {
			return err
		}
		_, err = fmt.Fprint(e.stdout, m)
		return err
	}
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return err
	}
	slices.Sort(names)
	res := schemaJSON{Dir: *out, Files: []schemaFileJSON{}}

	if *out == "" {
		var b strings.Builder
		b.WriteString("-- pgclaim's schema: the Up sections of its migrations, in order.\n")
		b.WriteString("-- Written by 'pgclaim schema'; apply it with pgclaim.Migrate, not by hand.\n")
		for _, name := range names {
			data, err := fs.ReadFile(migrations.FS, name)
			if err != nil {
				return err
			}
			up, err := upSection(string(data))
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			res.Files = append(res.Files, schemaFileJSON{Name: name, SQL: up})
			fmt.Fprintf(&b, "\n-- %s\n%s", name, up)
		}
		if f.json {
			return writeJSON(e.stdout, res)
		}
		_, err := fmt.Fprint(e.stdout, b.String())
		return err
	}

	if err := checkSchemaDir(*out, names); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return &failure{msg: fmt.Sprintf("creating %s: %v", *out, err), err: err}
	}
	for _, name := range names {
		data, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*out, name), data, 0o644); err != nil {
			return &failure{msg: fmt.Sprintf("writing %s: %v", name, err), err: err}
		}
		res.Files = append(res.Files, schemaFileJSON{Name: name})
	}
	if f.json {
		return writeJSON(e.stdout, res)
	}
	fmt.Fprintf(e.stdout, "wrote %s to %s: %s\n", plural(int64(len(names)), "migration", "migrations"), *out, strings.Join(names, ", "))
	return nil
}

// checkSchemaDir refuses a directory holding .sql files that are not
// pgclaim's migrations.
func checkSchemaDir(dir string, ours []string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &failure{msg: fmt.Sprintf("reading %s: %v", dir, err), err: err}
	}
	var others []string
	for _, en := range entries {
		if !en.IsDir() && path.Ext(en.Name()) == ".sql" && !slices.Contains(ours, en.Name()) {
			others = append(others, en.Name())
		}
	}
	if len(others) == 0 {
		return nil
	}
	return failf("write pgclaim's schema to a directory of its own (e.g. db/pgclaim): goose applies every file of a migrations directory, and pgclaim's version numbers would collide with yours",
		"%s holds .sql files that are not pgclaim's migrations: %s", dir, strings.Join(others, ", "))
}

// upSection returns the lines of a goose migration between "-- +goose Up"
// and "-- +goose Down".
func upSection(s string) (string, error) {
	var b strings.Builder
	in := false
	for line := range strings.Lines(s) {
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "-- +goose up":
			in = true
			continue
		case "-- +goose down":
			if !in {
				return "", errors.New("no -- +goose Up before -- +goose Down")
			}
			return strings.TrimRight(b.String(), "\n") + "\n", nil
		}
		if in {
			b.WriteString(line)
		}
	}
	if !in {
		return "", errors.New("no -- +goose Up section")
	}
	return strings.TrimRight(b.String(), "\n") + "\n", nil
}

// notifyMigration returns the goose migration that attaches (and, down,
// detaches) the trigger announcing rows of spec, TABLE.COLUMN=VALUE.
func notifyMigration(spec, pgSchema string) (string, error) {
	target, value, ok := strings.Cut(spec, "=")
	i := strings.LastIndexByte(target, '.')
	if !ok || i <= 0 || i == len(target)-1 || value == "" {
		return "", usagef("--notify: %q: want TABLE.COLUMN=VALUE, e.g. push_requests.status=PAUSED", spec)
	}
	table, column := target[:i], target[i+1:]
	if msg := qualify.Check(pgSchema); msg != "" {
		return "", usagef("--pgclaim-schema: %s", msg)
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", usagef("--notify: table %q: want table or schema.table", table)
	}
	fn := ""
	if pgSchema != "" {
		fn = pgx.Identifier{pgSchema}.Sanitize() + "."
	}
	args := fmt.Sprintf("%s::regclass, %s, %s", sqlString(pgx.Identifier(parts).Sanitize()), sqlString(column), sqlString(value))
	return fmt.Sprintf(`-- Rows of %s entering %s = %s are announced to pgclaim's claim workers,
-- which claim them at once rather than at their next poll: one NOTIFY per
-- statement, at commit, whoever writes the rows. Run as the table's owner,
-- after pgclaim.Migrate (written by 'pgclaim schema --notify %s').

-- +goose Up
SELECT %spgclaim_notify_on(%s);

-- +goose Down
SELECT %spgclaim_notify_off(%s);
`, table, column, sqlString(value), spec, fn, args, fn, args), nil
}

// sqlString quotes s as an SQL string literal.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
