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
are never applied from there: pgclaim.Migrate applies its embedded copy.`

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
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
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
