package qualify

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestRewrite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`SELECT pgclaim_fence()`, `SELECT "s".pgclaim_fence()`},
		{`INSERT INTO pgclaim_ticks (job) VALUES ($1::pgclaim_name)`, `INSERT INTO "s".pgclaim_ticks (job) VALUES ($1::"s".pgclaim_name)`},
		{`SELECT t.fence FROM pgclaim_ticks t, public.pgclaim_locks`, `SELECT t.fence FROM "s".pgclaim_ticks t, public.pgclaim_locks`},
		{`SELECT pg_notify('pgclaim_schedules', 'it''s pgclaim_x')`, `SELECT pg_notify('pgclaim_schedules', 'it''s pgclaim_x')`},
		{`SELECT E'\' pgclaim_x', pgclaim_y`, `SELECT E'\' pgclaim_x', "s".pgclaim_y`},
		{`SELECT "pgclaim_x", $$ pgclaim_x $$, $f$ pgclaim_x $f$, $1`, `SELECT "pgclaim_x", $$ pgclaim_x $$, $f$ pgclaim_x $f$, $1`},
		{"-- pgclaim_x\nSELECT /* pgclaim_x /* nested */ pgclaim_x */ 1 FROM pgclaim_x", "-- pgclaim_x\nSELECT /* pgclaim_x /* nested */ pgclaim_x */ 1 FROM \"s\".pgclaim_x"},
		{`SELECT my_pgclaim_x, pgclaim, xpgclaim_y FROM PGCLAIM_LOCKS`, `SELECT my_pgclaim_x, pgclaim, xpgclaim_y FROM "s".PGCLAIM_LOCKS`},
	} {
		if got := Rewrite(c.in, `"s"`); got != c.want {
			t.Errorf("Rewrite(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{"": true, "tenant_a": true, "_x9": true, "Tenant": false, "9a": false,
		"a-b": false, `a"b`: false, "pg_temp": false, "information_schema": false, strings.Repeat("a", 64): false} {
		if got := Check(name) == ""; got != ok {
			t.Errorf("Check(%q) = %q", name, Check(name))
		}
	}
}

func TestCache(t *testing.T) {
	t.Parallel()
	s := New("a")
	if got := s.SQL("SELECT pgclaim_fence()"); got != `SELECT "a".pgclaim_fence()` {
		t.Fatal(got)
	}
	if got := s.SQL("SELECT pgclaim_fence()"); got != `SELECT "a".pgclaim_fence()` {
		t.Fatal(got)
	}
	var none *Schema
	if got := none.SQL("SELECT pgclaim_fence()"); got != "SELECT pgclaim_fence()" {
		t.Fatal(got)
	}
}

// TestQueriesNameOnlyObjects: every identifier Rewrite qualifies in
// pgclaim's queries is an object its migrations create (an alias named
// pgclaim_… would be qualified too, and break the statement).
func TestQueriesNameOnlyObjects(t *testing.T) {
	t.Parallel()
	objects := map[string]bool{}
	created := regexp.MustCompile(`(?i)CREATE\s+(?:OR\s+REPLACE\s+|UNLOGGED\s+)?(?:TABLE|SEQUENCE|FUNCTION|DOMAIN|TYPE)\s+(?:IF\s+NOT\s+EXISTS\s+)?(pgclaim_\w+)`)
	migs, _ := filepath.Glob("../../sql/migrations/*.sql")
	for _, f := range migs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range created.FindAllStringSubmatch(string(b), -1) {
			objects[strings.ToLower(m[1])] = true
		}
	}
	qualified := regexp.MustCompile(`"s"\.(\w+)`)
	queries, _ := filepath.Glob("../../sql/queries/*.sql")
	if len(migs) == 0 || len(queries) == 0 {
		t.Fatal("no migrations or queries found")
	}
	for _, f := range queries {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range qualified.FindAllStringSubmatch(Rewrite(string(b), `"s"`), -1) {
			if !objects[strings.ToLower(m[1])] {
				t.Errorf("%s: %s is qualified but no migration creates it", filepath.Base(f), m[1])
			}
		}
	}
}
