package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/internal/qualify"
)

// Table describes the user's table whose rows are claimed. Name, Key, State
// and ClaimedAt are required; the other columns are optional, and features
// that need a missing one return an error naming it (for example Finish
// needs Fence). Names are identifiers, not SQL: they are validated and
// quoted, so mixed case, spaces and quotes are taken literally.
type Table struct {
	// Name is the table, optionally schema-qualified as "schema.table".
	// An unqualified name is resolved through the search_path. A name can
	// hold at most one '.', the schema separator.
	Name string
	// Key is the column that identifies a row; it must be unique
	// (a primary key or a unique index), which Verify checks.
	Key string
	// State is the text (or enum) column holding the row's state.
	State string
	// ClaimedAt is the timestamptz column stamped with database time when
	// a row is claimed. The sweeper measures staleness from it.
	ClaimedAt string
	// ClaimedBy is an optional text column stamped with the claimer's
	// Config.Holder.
	ClaimedBy string
	// Fence is an optional bigint column stamped with a fresh fencing token
	// (Claim.Fence) from pgclaim's sequence at every claim. Finish, Extend
	// and Release need it: they only touch a row whose fence is still the
	// caller's.
	Fence string
	// LeaseUntil is an optional timestamptz column: when a claimer has a
	// Lease, claims set it to now+Lease and Extend pushes it out; the
	// sweeper treats a row whose lease has passed as stale.
	LeaseUntil string
	// Attempts is an optional integer column incremented at every claim;
	// workers and sweepers use it to decide between retry and failure.
	Attempts string
	// RetryAt is an optional timestamptz column holding the earliest
	// database time a row may be claimed again. A row whose RetryAt is in
	// the future is passed over by ClaimBatch, and Claim returns
	// ErrNotClaimed for it; NULL means at once. A Worker or a Sweeper
	// whose RetryPolicy has a Backoff sets it when it moves a failed or
	// stale row to the policy's State; nothing else writes it.
	RetryAt string
	// Reason is an optional text column saying why a row last left the To
	// state other than by success. A Worker writes the error of a failed
	// attempt there (moving the row to Failed or Retry.State) and clears it
	// when work succeeds; a Sweeper writes why it moved a stale row (the
	// holder, fence and attempt of the stale claim, and whether its lease
	// expired or it was claimed too long ago). Claim, Finish, FinishBatch,
	// Extend and Release leave it alone: a caller finishing rows to a
	// failed state by hand writes its own reason in the same transaction.
	Reason string
}

// maxIdentLen is NAMEDATALEN-1: PostgreSQL silently truncates longer names,
// which could make two different names refer to the same column.
const maxIdentLen = 63

// table is a validated Table with its quoted identifiers.
type table struct {
	spec   Table
	schema string // "" when unqualified
	name   string
	qname  string // quoted, possibly schema-qualified
	// pgclaim is the schema of pgclaim's objects (Config.Schema); nil:
	// found through search_path
	pgclaim *qualify.Schema
	// quoted column names; "" when the column is not configured
	key, state, claimedAt, claimedBy, fence, leaseUntil, attempts, retryAt, reason string
}

func checkIdent(field, s string) error {
	switch {
	case s == "":
		return invalid(field, "must not be empty")
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, "must not contain a NUL byte")
	case len(s) > maxIdentLen:
		return invalid(field, fmt.Sprintf("%q is longer than %d bytes", s, maxIdentLen))
	}
	return nil
}

func quote(s string) string { return pgx.Identifier{s}.Sanitize() }

// parseName splits a table name given as field, "table" or "schema.table",
// and returns its parts and its quoted, possibly qualified name.
func parseName(field, full string) (schema, name, qname string, err error) {
	if full == "" {
		return "", "", "", invalid(field, "must not be empty")
	}
	parts := strings.Split(full, ".")
	switch len(parts) {
	case 1:
		name = parts[0]
	case 2:
		schema, name = parts[0], parts[1]
		if err := checkIdent(field+" (schema)", schema); err != nil {
			return "", "", "", err
		}
	default:
		return "", "", "", invalid(field, fmt.Sprintf("%q has more than one '.'; want \"table\" or \"schema.table\"", full))
	}
	if err := checkIdent(field, name); err != nil {
		return "", "", "", err
	}
	if schema != "" {
		return schema, name, pgx.Identifier{schema, name}.Sanitize(), nil
	}
	return "", name, quote(name), nil
}

func (t Table) validate() (*table, error) {
	v := &table{spec: t}
	var err error
	if v.schema, v.name, v.qname, err = parseName("Table.Name", t.Name); err != nil {
		return nil, err
	}

	cols := []struct {
		field    string
		val      string
		required bool
		dst      *string
	}{
		{"Table.Key", t.Key, true, &v.key},
		{"Table.State", t.State, true, &v.state},
		{"Table.ClaimedAt", t.ClaimedAt, true, &v.claimedAt},
		{"Table.ClaimedBy", t.ClaimedBy, false, &v.claimedBy},
		{"Table.Fence", t.Fence, false, &v.fence},
		{"Table.LeaseUntil", t.LeaseUntil, false, &v.leaseUntil},
		{"Table.Attempts", t.Attempts, false, &v.attempts},
		{"Table.RetryAt", t.RetryAt, false, &v.retryAt},
		{"Table.Reason", t.Reason, false, &v.reason},
	}
	seen := map[string]string{}
	for _, c := range cols {
		if c.val == "" && !c.required {
			continue
		}
		if err := checkIdent(c.field, c.val); err != nil {
			return nil, err
		}
		if other, ok := seen[c.val]; ok {
			return nil, invalid(c.field, fmt.Sprintf("column %q is already used by %s", c.val, other))
		}
		seen[c.val] = c.field
		*c.dst = quote(c.val)
	}
	return v, nil
}

// needs returns an error naming field when the optional column is missing.
func (v *table) needs(field, col, by string) error {
	if col == "" {
		return invalid(field, "must be set: "+by+" needs it")
	}
	return nil
}

// columnInfo is what Verify learns about one column.
type columnInfo struct {
	typ      string // format_type, e.g. "timestamp with time zone"
	oid      uint32
	category string // pg_type.typcategory
	typtype  string // pg_type.typtype ('e' for enums)
	attnum   int16
}

const (
	oidInt2        = 21
	oidInt4        = 23
	oidInt8        = 20
	oidTimestamptz = 1184
	oidText        = 25
)

// verify checks the table against the database and returns every problem
// found, each naming the field it concerns: the columns, then the states
// of spec. When there is none, it returns the warnings about missing
// partial indexes for spec.indexed (matching ErrMissingIndex), if any.
func (v *table) verify(ctx context.Context, db DBTX, spec verifySpec) error {
	var oid *uint32
	var relkind *string
	err := db.QueryRow(ctx,
		`SELECT c.oid, c.relkind::text FROM pg_catalog.pg_class c WHERE c.oid = to_regclass($1)`,
		v.qname).Scan(&oid, &relkind)
	if errors.Is(err, pgx.ErrNoRows) {
		return invalid("Table.Name", fmt.Sprintf("table %s does not exist (or is not visible in search_path)", v.qname))
	}
	if err != nil {
		return fmt.Errorf("claim: Verify: %w", err)
	}
	if relkind != nil && *relkind != "r" && *relkind != "p" {
		return invalid("Table.Name", fmt.Sprintf("%s is not a table (relkind %q)", v.qname, *relkind))
	}

	rows, err := db.Query(ctx, `
SELECT a.attname, format_type(a.atttypid, NULL), a.atttypid, t.typcategory::text, t.typtype::text, a.attnum
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`, *oid)
	if err != nil {
		return fmt.Errorf("claim: Verify: %w", err)
	}
	cols := map[string]columnInfo{}
	for rows.Next() {
		var name string
		var ci columnInfo
		if err := rows.Scan(&name, &ci.typ, &ci.oid, &ci.category, &ci.typtype, &ci.attnum); err != nil {
			rows.Close()
			return fmt.Errorf("claim: Verify: %w", err)
		}
		cols[name] = ci
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("claim: Verify: %w", err)
	}

	var errs []error
	check := func(field, col string, ok func(columnInfo) bool, want string) {
		if col == "" {
			return
		}
		ci, found := cols[col]
		if !found {
			errs = append(errs, invalid(field, fmt.Sprintf("column %q not found in table %s", col, v.qname)))
			return
		}
		if ok != nil && !ok(ci) {
			errs = append(errs, invalid(field, fmt.Sprintf("column %q has type %s; want %s", col, ci.typ, want)))
		}
	}
	isText := func(ci columnInfo) bool { return ci.category == "S" || ci.typtype == "e" }
	isTimestamptz := func(ci columnInfo) bool { return ci.oid == oidTimestamptz }
	isInt := func(ci columnInfo) bool { return ci.oid == oidInt2 || ci.oid == oidInt4 || ci.oid == oidInt8 }

	s := v.spec
	check("Table.Key", s.Key, nil, "")
	if ci, ok := cols[s.State]; ok && ci.typtype == "d" && ci.category == "E" {
		// PostgreSQL cannot compare a domain over an enum with a
		// parameter ("operator does not exist"), which every claim does.
		errs = append(errs, invalid("Table.State", fmt.Sprintf("column %q has type %s, a domain over an enum, which cannot be compared with a parameter; use the enum itself (or text with a CHECK constraint)", s.State, ci.typ)))
	} else {
		check("Table.State", s.State, isText, "text, varchar, char or an enum")
	}
	stateOK := len(errs) == 0
	check("Table.ClaimedAt", s.ClaimedAt, isTimestamptz, "timestamp with time zone")
	check("Table.ClaimedBy", s.ClaimedBy, func(ci columnInfo) bool { return ci.category == "S" }, "text or varchar")
	check("Table.Fence", s.Fence, func(ci columnInfo) bool { return ci.oid == oidInt8 }, "bigint")
	check("Table.LeaseUntil", s.LeaseUntil, isTimestamptz, "timestamp with time zone")
	check("Table.Attempts", s.Attempts, isInt, "smallint, integer or bigint")
	check("Table.RetryAt", s.RetryAt, isTimestamptz, "timestamp with time zone")
	check("Table.Reason", s.Reason, func(ci columnInfo) bool { return ci.oid == oidText }, "text")

	if ki, ok := cols[s.Key]; ok {
		var unique bool
		err := db.QueryRow(ctx, `
SELECT EXISTS (
  SELECT 1 FROM pg_catalog.pg_index i
  WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL
    AND i.indnkeyatts = 1 AND i.indkey[0] = $2)`, *oid, ki.attnum).Scan(&unique)
		if err != nil {
			return fmt.Errorf("claim: Verify: %w", err)
		}
		if !unique {
			errs = append(errs, invalid("Table.Key", fmt.Sprintf("column %q has no primary key or unique index of its own", s.Key)))
		}
	}
	if s.Fence != "" {
		var seq, fn *string
		if err := db.QueryRow(ctx, `SELECT to_regclass($1)::text, to_regprocedure($2)::text`,
			v.pgclaim.Object("pgclaim_fence_seq"), v.pgclaim.Object("pgclaim_fence()")).Scan(&seq, &fn); err != nil {
			return fmt.Errorf("claim: Verify: %w", err)
		}
		if seq == nil {
			errs = append(errs, invalid("Table.Fence", "sequence "+v.pgclaim.Object("pgclaim_fence_seq")+" not found: apply pgclaim's migrations (pgclaim.Migrate)"))
		}
		if fn == nil {
			errs = append(errs, invalid("Table.Fence", "function "+v.pgclaim.Object("pgclaim_fence()")+" not found: apply pgclaim's migrations (pgclaim.Migrate)"))
		}
	}
	if stateOK {
		bad, err := v.verifyStates(ctx, db, *oid, cols[s.State], spec.states)
		if err != nil {
			return fmt.Errorf("claim: Verify: %w", err)
		}
		errs = append(errs, bad...)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	warns, err := v.verifyIndexes(ctx, db, *oid, spec)
	if err != nil {
		return fmt.Errorf("claim: Verify: %w", err)
	}
	return errors.Join(warns...)
}
