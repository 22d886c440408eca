package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgclaim/pgclaim/internal/grants"
)

func init() {
	register(command{name: "grants", summary: "print the GRANT statements an application role needs", run: runGrants})
}

const grantsAbout = `
Prints the statements that give an application role what pgclaim needs, and
nothing more: USAGE on the schema; SELECT, INSERT, UPDATE, DELETE on
pgclaim's tables (SELECT only on the version and fence tables); USAGE on the
fencing-token sequence; EXECUTE on pgclaim's functions. No CREATE: the role
that runs 'pgclaim migrate up' owns pgclaim's objects.

Run them as that owner, and again after every pgclaim upgrade whose
migrations add an object. With --database-url the schema is the one holding
pgclaim's version table; otherwise --schema (default public). The role also
needs SELECT, UPDATE on the application's claimed tables, which pgclaim does
not know.`

type grantJSON struct {
	Kind       string `json:"kind"`
	Object     string `json:"object"`
	Privileges string `json:"privileges"`
	Why        string `json:"why"`
	Statement  string `json:"statement"`
}

func runGrants(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "grants", "grants --role NAME [--schema NAME] [--database-url URL] [--json]", grantsAbout)
	role := f.String("role", "", "the application's `role`")
	schema := f.String("schema", "", "the `schema` of pgclaim's objects (default: the version table's with --database-url, else public)")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if strings.TrimSpace(*role) == "" {
		return usagef("--role is required: name the application's role")
	}
	if *schema == "" {
		*schema = "public"
		if f.url != "" || e.getenv(envURL) != "" {
			pool, err := f.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var s *string
			if err := pool.QueryRow(ctx, `SELECT n.nspname::text FROM pg_catalog.pg_class c
				JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
				WHERE c.oid = to_regclass('pgclaim_schema_version')`).Scan(&s); err != nil {
				return dbFail("finding pgclaim's schema", err)
			}
			if s == nil {
				return failf(migrateHint, "pgclaim's version table is not on the search path of this database: pgclaim is not migrated there (or name its schema with --schema)")
			}
			*schema = *s
		}
	}
	stmts := grants.Statements(*role, *schema)
	if f.json {
		out := []grantJSON{{Kind: "SCHEMA", Object: *schema, Privileges: "USAGE", Why: "find pgclaim's objects", Statement: stmts[0]}}
		for i, o := range grants.Objects {
			out = append(out, grantJSON{Kind: string(o.Kind), Object: o.Name, Privileges: o.Privileges, Why: o.Why, Statement: stmts[i+1]})
		}
		return writeJSON(e.stdout, out)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- pgclaim: what role %s needs; run as the owner of pgclaim's objects\n", *role)
	for _, s := range stmts {
		b.WriteString(s + "\n")
	}
	_, err = fmt.Fprint(e.stdout, b.String())
	return err
}
