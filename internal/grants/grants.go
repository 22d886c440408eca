package grants

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Kind is a kind of object.
type Kind string

const (
	Table    Kind = "TABLE"
	Sequence Kind = "SEQUENCE"
	Function Kind = "FUNCTION"
)

// Object is one of pgclaim's objects and what the application's role needs
// on it.
type Object struct {
	Kind Kind
	Name string // the table's or sequence's name, or the function's name and argument types
	// Privileges granted: the least the application's statements use.
	Privileges string
	// Why is one line on what the application does with it.
	Why string
}

// DML is what the application's role needs on a table pgclaim writes.
const DML = "SELECT, INSERT, UPDATE, DELETE"

// Objects are pgclaim's objects an application's role uses, in migration
// order. Domains are left out: their USAGE is granted to PUBLIC by default and
// writing a column of a domain type needs none.
var Objects = []Object{
	{Table, "pgclaim_ticks", DML, "tick ledger: claim, finish and prune ticks"},
	{Table, "pgclaim_locks", DML, "lease locks: take, extend and release leases"},
	{Table, "pgclaim_terms", DML, "leadership terms of gate.Elector"},
	{Table, "pgclaim_schedules", DML, "stored schedules: register, pause, resume"},
	{Table, "pgclaim_schedule_runs", DML, "schedule runs: claim, finish, prune"},
	{Table, "pgclaim_fence_mode", "SELECT", "which fencing token is in force (read by doctor)"},
	{Table, "pgclaim_schema_version", "SELECT", "applied migrations (Migrate at start-up, migrate status, doctor)"},
	{Sequence, "pgclaim_fence_seq", "USAGE, SELECT", "fencing tokens (nextval)"},
	{Function, "pgclaim_fence()", "EXECUTE", "a fencing token for every grant"},
	{Function, "pgclaim_raise(text, text)", "EXECUTE", "undoes a tick's claim from inside its statement"},
	{Function, "pgclaim_fence_check()", "EXECUTE", "Migrate at start-up: choose the fence the server allows"},
	{Function, "pgclaim_notify_claimable()", "EXECUTE", "the trigger function of tables attached under migration 00014 (runs as the writer)"},
	{Function, "pgclaim_notify_on(regclass, name, text)", "EXECUTE", "attaches the trigger that announces claimable rows (the table's owner, in its migration)"},
	{Function, "pgclaim_notify_off(regclass, name, text)", "EXECUTE", "detaches it"},
	{Function, "pgclaim_notify_fn(name, text, boolean)", "EXECUTE", "keeps the trigger's function of a column and value (called by the two above)"},
}

// Statements returns the GRANT statements that give role what it needs on
// pgclaim's objects in schema (with USAGE on the schema): run them as the
// owner of pgclaim's objects after every pgclaim upgrade.
func Statements(role, schema string) []string {
	r := pgx.Identifier{role}.Sanitize()
	s := pgx.Identifier{schema}.Sanitize()
	out := []string{fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", s, r)}
	for _, o := range Objects {
		name := o.Name
		args := ""
		if i := strings.IndexByte(name, '('); i >= 0 {
			name, args = name[:i], name[i:]
		}
		out = append(out, fmt.Sprintf("GRANT %s ON %s %s.%s%s TO %s;", o.Privileges, o.Kind, s, pgx.Identifier{name}.Sanitize(), args, r))
	}
	return out
}
