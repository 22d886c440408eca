package pgerr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/internal/grants"
)

// The SQLSTATEs ExplainAt asks the catalog about, besides
// InsufficientPrivilege.
const (
	UndefinedTable  = "42P01"
	UndefinedSchema = "3F000"
)

// Schema is the Kind of a Need on a schema (USAGE, CREATE).
const Schema grants.Kind = "SCHEMA"

// Querier is what ExplainAt asks the catalog on: *pgxpool.Pool, *pgx.Conn,
// pgx.Tx and the DBTX interfaces of pgclaim's packages all satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Need is a privilege a call needs on an object of the application's, such
// as the table a claimer claims rows of, or on a schema.
type Need struct {
	Kind grants.Kind // grants.Table, grants.Sequence, grants.Function or Schema
	// Schema is the object's schema; "" finds it through search_path (for
	// Kind Schema: current_schema()).
	Schema string
	// Name is the table's or sequence's name, or the function's name and
	// argument types ("f(text, bigint)"); empty for Kind Schema.
	Name string
	// Privileges are what the call needs, e.g. "SELECT, UPDATE".
	Privileges string
	// ToCreate says the call needs Privileges only to create pgclaim's
	// objects (CREATE on the schema, for Migrate): they are named only
	// when some of pgclaim's objects are missing.
	ToCreate bool
}

// ExplainAt is Explain that asks the server rather than reading its
// message, so that it explains alike in every lc_messages. On a refused
// privilege (SQLSTATE 42501), an undefined table (42P01) or an undefined
// schema (3F000) it runs one catalog query on q as the refused role:
// current_user's privileges on pgclaim's objects (grants.Objects, in
// schema, or through search_path when schema is empty) and on needs. It
// returns an error reading "<err>: the role <r> lacks <privilege> on
// <object>[, ...]; grant it with: GRANT ...; GRANT ...", saying also which
// of pgclaim's tables or which schema does not exist, that wraps err (and,
// for a privilege, a *PrivilegeError). When the query fails, or finds
// nothing lacking, it returns Explain(err). Any other error is returned
// as it is; so is one explained already.
func ExplainAt(ctx context.Context, q Querier, schema string, err error, needs ...Need) error {
	return ExplainUsing(ctx, q, schema, err, nil, needs...)
}

// ExplainUsing is ExplainAt for a call that uses only some of pgclaim's
// objects: uses names them as grants.Objects does ("pgclaim_fence()",
// "pgclaim_fence_seq"), so that the explanation names what that call
// lacks and nothing else; nil means all of them.
func ExplainUsing(ctx context.Context, q Querier, schema string, err error, uses []string, needs ...Need) error {
	var pe *pgconn.PgError
	if q == nil || !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case InsufficientPrivilege, UndefinedTable, UndefinedSchema:
	default:
		return err
	}
	var done *PrivilegeError
	var cat *catalogError
	if errors.As(err, &done) || errors.As(err, &cat) {
		return err
	}
	objs := grants.Objects
	if uses != nil {
		objs = nil
		for _, o := range grants.Objects {
			if slices.Contains(uses, o.Name) {
				objs = append(objs, o)
			}
		}
	}
	f, qerr := lookUp(ctx, q, schema, objs, needs)
	if qerr != nil {
		return Explain(err)
	}
	e := f.explain(err, pe)
	if e == nil {
		return Explain(err)
	}
	return e
}

// catalogQuery finds each need's object (explicitly in its schema, or the
// first of search_path's schemas that has it) and answers which of its
// privileges current_user lacks, whether the role may use its schema, and
// whether pgclaim's schema exists. The privilege functions take the
// object's oid, so they answer even without USAGE on its schema.
const catalogQuery = `WITH path AS (
	SELECT n.oid AS nsp, min(p.pos) AS pos
	FROM unnest(string_to_array(current_setting('search_path'), ',')) WITH ORDINALITY AS p(name, pos)
	JOIN pg_namespace n ON n.nspname = CASE WHEN btrim(p.name) IN ('"$user"', '$user') THEN current_user::text
		ELSE btrim(btrim(p.name), '"') END
	GROUP BY n.oid
), need AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS u(kind, schema, name, args, privs, ord)
), found AS (
	SELECT need.*, o.oid, o.nsp, o.nspname FROM need LEFT JOIN LATERAL (
		SELECT c.oid, n.oid AS nsp, n.nspname, coalesce(path.pos, 0) AS pos
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN path ON path.nsp = n.oid
		WHERE need.kind IN ('TABLE', 'SEQUENCE') AND c.relname = need.name
			AND (n.nspname = need.schema OR need.schema = '' AND path.nsp IS NOT NULL)
		UNION ALL
		SELECT p.oid, n.oid, n.nspname, coalesce(path.pos, 0)
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace LEFT JOIN path ON path.nsp = n.oid
		WHERE need.kind = 'FUNCTION' AND p.proname = need.name AND oidvectortypes(p.proargtypes) = need.args
			AND (n.nspname = need.schema OR need.schema = '' AND path.nsp IS NOT NULL)
		UNION ALL
		SELECT n.oid, n.oid, n.nspname, 0 FROM pg_namespace n
		WHERE need.kind = 'SCHEMA' AND n.nspname = coalesce(nullif(need.schema, ''), current_schema())
		ORDER BY 4 LIMIT 1
	) o ON true
)
SELECT current_user::text, $6 = '' OR EXISTS (SELECT FROM pg_namespace WHERE nspname = $6),
	coalesce(current_schema(), ''), current_setting('search_path'),
	coalesce(json_agg(json_build_object(
		'kind', kind, 'schema', coalesce(nspname, schema), 'name', name, 'args', args, 'found', oid IS NOT NULL,
		'usage', nsp IS NULL OR kind = 'SCHEMA' OR has_schema_privilege(nsp, 'USAGE'),
		'lacks', (SELECT coalesce(array_agg(priv ORDER BY i), '{}') FROM unnest(string_to_array(privs, ', ')) WITH ORDINALITY AS x(priv, i)
			WHERE oid IS NOT NULL AND NOT CASE kind
				WHEN 'TABLE' THEN has_table_privilege(oid, priv)
				WHEN 'SEQUENCE' THEN has_sequence_privilege(oid, priv)
				WHEN 'FUNCTION' THEN has_function_privilege(oid, priv)
				ELSE has_schema_privilege(oid, priv) END)
	) ORDER BY ord), '[]')::text
FROM found`

// object is one need as the catalog answered it.
type object struct {
	Kind    grants.Kind `json:"kind"`
	Schema  string      `json:"schema"` // where it was found; else as asked
	Name    string      `json:"name"`
	Args    string      `json:"args"`
	Found   bool        `json:"found"`
	Usage   bool        `json:"usage"` // the role may use its schema
	Lacks   []string    `json:"lacks"`
	pgclaim bool
	create  bool // Need.ToCreate
}

// findings are the catalog's answer.
type findings struct {
	role          string
	schema        string // pgclaim's, as given
	schemaExists  bool
	currentSchema string
	searchPath    string
	objects       []object
}

func lookUp(ctx context.Context, q Querier, schema string, objs []grants.Object, needs []Need) (*findings, error) {
	var kinds, schemas, names, args, privs []string
	add := func(k grants.Kind, s, name, p string) {
		a := ""
		if i := strings.IndexByte(name, '('); i >= 0 && k == grants.Function {
			name, a = name[:i], strings.TrimSuffix(name[i+1:], ")")
		}
		kinds, schemas, names, args, privs = append(kinds, string(k)), append(schemas, s), append(names, name), append(args, a), append(privs, p)
	}
	for _, o := range objs {
		add(o.Kind, schema, o.Name, o.Privileges)
	}
	add(Schema, schema, "", "USAGE")
	for _, n := range needs {
		add(n.Kind, n.Schema, n.Name, n.Privileges)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	f := &findings{schema: schema}
	var js string
	if err := q.QueryRow(ctx, catalogQuery, kinds, schemas, names, args, privs, schema).Scan(&f.role, &f.schemaExists, &f.currentSchema, &f.searchPath, &js); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(js), &f.objects); err != nil {
		return nil, err
	}
	if len(f.objects) != len(kinds) {
		return nil, fmt.Errorf("pgerr: the catalog answered %d objects, not %d", len(f.objects), len(kinds))
	}
	for i := range objs {
		f.objects[i].pgclaim = true
	}
	f.objects[len(objs)].pgclaim = true
	for i, n := range needs {
		f.objects[len(objs)+1+i].create = n.ToCreate
	}
	return f, nil
}

// explain returns err explained by f, or nil when f finds nothing missing.
func (f *findings) explain(err error, pe *pgconn.PgError) error {
	role := ident(f.role)
	var lacks, stmts, notes []string
	seen := map[string]bool{}
	lack := func(what, grant string) {
		if !seen[what] {
			seen[what] = true
			lacks = append(lacks, what)
			stmts = append(stmts, grant)
		}
	}
	var missing []string
	for _, o := range f.objects {
		if !o.Found && o.pgclaim && o.Kind != Schema {
			missing = append(missing, o.Name)
		}
	}
	for _, o := range f.objects {
		if o.create && len(missing) == 0 {
			continue
		}
		s := ident(o.Schema)
		switch {
		case o.Kind == Schema && !o.Found && o.pgclaim && f.schema == "":
			// no schema to create in: the search_path names none that exists
			notes = append(notes, fmt.Sprintf("no schema of search_path (%s) exists", f.searchPath))
		case o.Kind == Schema && !o.Found:
			notes = append(notes, fmt.Sprintf("the schema %s does not exist", s))
		case !o.Found && o.pgclaim:
		case !o.Found:
			where := "on search_path (" + f.searchPath + ")"
			if o.Schema != "" {
				where = "in schema " + s
			}
			notes = append(notes, fmt.Sprintf("the %s %s does not exist %s", strings.ToLower(string(o.Kind)), o.Name, where))
		}
		if o.Found && !o.Usage {
			lack("USAGE on schema "+o.Schema, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", s, role))
		}
		if !o.Found || len(o.Lacks) == 0 {
			continue
		}
		p := strings.Join(o.Lacks, ", ")
		switch o.Kind {
		case Schema:
			lack(p+" on schema "+o.Schema, fmt.Sprintf("GRANT %s ON SCHEMA %s TO %s", p, s, role))
		case grants.Function:
			lack(fmt.Sprintf("%s on function %s.%s(%s)", p, o.Schema, o.Name, o.Args),
				fmt.Sprintf("GRANT %s ON FUNCTION %s.%s(%s) TO %s", p, s, ident(o.Name), o.Args, role))
		default:
			if o.Kind == grants.Sequence && slicesHas(o.Lacks, "USAGE") && !slicesHas(o.Lacks, "SELECT") {
				p = "USAGE, SELECT" // what grants.Statements grants
			}
			kind := strings.ToLower(string(o.Kind))
			lack(fmt.Sprintf("%s on %s %s.%s", strings.Join(o.Lacks, ", "), kind, o.Schema, o.Name),
				fmt.Sprintf("GRANT %s ON %s %s.%s TO %s", p, o.Kind, s, ident(o.Name), role))
		}
	}
	if len(missing) > 0 && f.schemaExists {
		where := "on search_path (" + f.searchPath + ")"
		if f.schema != "" {
			where = "in schema " + ident(f.schema)
		}
		notes = append(notes, fmt.Sprintf("pgclaim's tables are missing %s (%s): run pgclaim.Migrate / pgclaim migrate up", where, strings.Join(missing, ", ")))
	}
	if len(lacks) == 0 && len(notes) == 0 {
		return nil
	}
	e := &catalogError{err: err, role: f.role, notes: notes}
	switch {
	case len(lacks) > 0:
		e.p = &PrivilegeError{
			Privilege: strings.Join(lacks, ", "),
			Grant:     "grant it with: " + strings.Join(stmts, "; ") + "; " + GrantsHint,
			Err:       pe,
		}
	case pe.Code == InsufficientPrivilege:
		// A privilege the catalog was not asked about: what the message says.
		e.p = Privilege(pe)
	}
	return e
}

// plainRE is an identifier SQL reads the same unquoted.
var plainRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// reserved are key words that cannot be a name unquoted, among those a
// table or a role may well be called.
var reserved = map[string]bool{"user": true, "order": true, "group": true, "table": true, "select": true, "all": true,
	"default": true, "check": true, "column": true, "limit": true, "offset": true, "where": true, "from": true, "to": true,
	"grant": true, "primary": true, "references": true, "unique": true, "constraint": true, "current_user": true}

// ident is name as SQL reads it in a GRANT: as it is when plain, quoted
// otherwise.
func ident(name string) string {
	if plainRE.MatchString(name) && !reserved[name] {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

func slicesHas(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// catalogError is err explained by the catalog.
type catalogError struct {
	err   error
	role  string
	p     *PrivilegeError // nil when no privilege is lacking
	notes []string        // objects that do not exist
}

func (e *catalogError) Error() string {
	var b strings.Builder
	b.WriteString(e.err.Error())
	switch {
	case e.p != nil && e.p.Privilege != "":
		fmt.Fprintf(&b, ": the role %s lacks %s; %s", e.role, e.p.Privilege, e.p.Grant)
	case e.p != nil:
		fmt.Fprintf(&b, ": the role %s: %s", e.role, e.p.Grant)
	}
	for i, n := range e.notes {
		if i == 0 && e.p == nil {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(n)
	}
	return b.String()
}

func (e *catalogError) Unwrap() []error {
	if e.p == nil {
		return []error{e.err}
	}
	return []error{e.err, e.p}
}
