package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/status/inspect"
)

// tableFlags are the flags naming a claimed table and its columns, shared by
// claims and sweep.
type tableFlags struct {
	table, key, state, claimedAt, claimedBy, leaseUntil, attempts, reason string
	processing                                                            string
}

func addTableFlags(f *flags, withAttempts bool) *tableFlags {
	t := &tableFlags{}
	f.StringVar(&t.table, "table", "", "the claimed `TABLE`, optionally schema-qualified (required)")
	f.StringVar(&t.key, "key", "id", "its key `COLUMN`")
	f.StringVar(&t.state, "state", "status", "its state `COLUMN`")
	f.StringVar(&t.claimedAt, "claimed-at", "claimed_at", "its timestamptz `COLUMN` stamped when a row is claimed")
	f.StringVar(&t.claimedBy, "claimed-by", "", "its `COLUMN` holding the claimer's identity, if any")
	f.StringVar(&t.leaseUntil, "lease-until", "", "its timestamptz lease `COLUMN`, if any: a row whose lease has passed is stale")
	if withAttempts {
		f.StringVar(&t.attempts, "attempts", "", "its attempts `COLUMN`, if any (needed by --retry)")
	}
	f.StringVar(&t.reason, "reason", "", "its text `COLUMN` saying why a row failed, if any (sweep writes it; claims lists the commonest)")
	f.StringVar(&t.processing, "processing", "PROCESSING", "the `STATE` rows are in while claimed")
	return t
}

// sweepCommand is the pgclaim sweep command line for this table, with the
// flags that differ from their defaults.
func (t *tableFlags) sweepCommand(olderThan time.Duration, to string) string {
	args := []string{"pgclaim", "sweep", "--table", shellQuote(t.table)}
	for _, c := range []struct{ flag, val, def string }{
		{"--key", t.key, "id"}, {"--state", t.state, "status"}, {"--claimed-at", t.claimedAt, "claimed_at"},
		{"--lease-until", t.leaseUntil, ""}, {"--reason", t.reason, ""}, {"--processing", t.processing, "PROCESSING"},
	} {
		if c.val != c.def {
			args = append(args, c.flag, shellQuote(c.val))
		}
	}
	args = append(args, "--older-than", fmtDur(olderThan), "--to", shellQuote(to), "--dry-run")
	return strings.Join(args, " ")
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-:/") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// spec is the claim.Table the flags describe.
func (t *tableFlags) spec() claim.Table {
	return claim.Table{
		Name: t.table, Key: t.key, State: t.state, ClaimedAt: t.claimedAt,
		ClaimedBy: t.claimedBy, LeaseUntil: t.leaseUntil, Attempts: t.attempts, Reason: t.reason,
	}
}

// flagNames maps the claim package's field names to this command's flags.
var flagNames = strings.NewReplacer(
	"claim: ", "",
	"Table.Name", "--table",
	"Table.Key", "--key",
	"Table.State", "--state",
	"Table.ClaimedAt", "--claimed-at",
	"Table.ClaimedBy", "--claimed-by",
	"Table.LeaseUntil", "--lease-until",
	"Table.Attempts", "--attempts",
	"Table.Reason", "--reason",
	"Config.To", "--processing",
	"SweeperConfig.Failed", "--to",
	"SweeperConfig.Retry.State", "--retry",
	"SweeperConfig.Retry.MaxAttempts", "--max-attempts",
	"SweeperConfig.BatchSize", "--batch",
	"SweeperConfig.StaleAfter", "--older-than",
)

// claimError turns a claim package error into one naming flags. Bad input
// found before touching the database is a usage error.
func claimError(err error, usage bool) error {
	msg := flagNames.Replace(err.Error())
	if usage {
		return &usageError{msg: msg}
	}
	return &failure{msg: msg, err: err}
}

// newClaimer validates the table's identifiers and returns a claimer for rows
// in the processing state. from is the state the claimer would claim from;
// sweeping and counting never use it, so any other state will do.
func (t *tableFlags) newClaimer(db claim.DBTX, from string) (*claim.Claimer[any], error) {
	if from == "" || from == t.processing {
		from = t.processing + " (unused)"
	}
	opts := claim.Config{From: from, To: t.processing}
	if t.leaseUntil != "" {
		// The claimer never claims: a Lease tells claim.NewSweeper that the
		// rows it sweeps were claimed with leases, so that --lease-until
		// without --older-than (expired leases only) is allowed.
		opts.Lease = time.Minute
	}
	c, err := claim.New[any](db, t.spec(), opts)
	if err != nil {
		return nil, claimError(err, true)
	}
	return c, nil
}

// claimedTable is a claimed table checked against the catalog.
type claimedTable struct {
	flags *tableFlags
	qname string // quoted, possibly schema-qualified
	// quoted columns; "" when not configured
	key, state, claimedAt, claimedBy, leaseUntil, attempts, reason string
}

// quoteTable quotes "table" or "schema.table" (claim.Table's rules: at most
// one '.').
func quoteTable(name string) string {
	parts := strings.Split(name, ".")
	return pgx.Identifier(parts).Sanitize()
}

func quoteCol(c string) string {
	if c == "" {
		return ""
	}
	return pgx.Identifier{c}.Sanitize()
}

// checkTable checks that the table and every configured column exist,
// naming the flag of what is missing. Identifiers have been validated by
// claim.New before.
func checkTable(ctx context.Context, db dbtx, t *tableFlags, needKey bool) (*claimedTable, error) {
	ct := &claimedTable{
		flags: t, qname: quoteTable(t.table),
		key: quoteCol(t.key), state: quoteCol(t.state), claimedAt: quoteCol(t.claimedAt),
		claimedBy: quoteCol(t.claimedBy), leaseUntil: quoteCol(t.leaseUntil), attempts: quoteCol(t.attempts),
		reason: quoteCol(t.reason),
	}
	var database string
	var oid *uint32
	var relkind *string
	err := db.QueryRow(ctx, `
SELECT current_database()::text, c.oid, c.relkind::text
FROM (SELECT to_regclass($1) AS oid) r
LEFT JOIN pg_catalog.pg_class c ON c.oid = r.oid`, ct.qname).Scan(&database, &oid, &relkind)
	if err != nil {
		return nil, dbFail("reading the catalog", err)
	}
	if oid == nil {
		hint := "check --table; qualify it as schema.table if it is not in the search_path"
		var migrated bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgclaim.VersionTable).Scan(&migrated); err == nil && !migrated {
			hint += fmt.Sprintf("; database %q has no pgclaim tables either: is the URL the service's database? (if it is, run 'pgclaim migrate up' or start the service once)", database)
		}
		return nil, failf(hint, "table %s (--table) does not exist in database %q", ct.qname, database)
	}
	if *relkind != "r" && *relkind != "p" {
		return nil, failf("--table must name a table", "%s (--table) is not a table (relkind %q)", ct.qname, *relkind)
	}
	var cols []string
	if err := db.QueryRow(ctx, `
SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') FROM pg_catalog.pg_attribute
WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, *oid).Scan(&cols); err != nil {
		return nil, dbFail("reading the catalog", err)
	}
	for _, c := range []struct{ flag, col string }{
		{"--key", t.key}, {"--state", t.state}, {"--claimed-at", t.claimedAt},
		{"--claimed-by", t.claimedBy}, {"--lease-until", t.leaseUntil}, {"--attempts", t.attempts},
		{"--reason", t.reason},
	} {
		if c.flag == "--key" && !needKey {
			continue
		}
		if c.col != "" && !slices.Contains(cols, c.col) {
			return nil, failf(fmt.Sprintf("name the column with %s; the columns of %s are: %s", c.flag, ct.qname, strings.Join(cols, ", ")),
				"table %s has no column %q (%s)", ct.qname, c.col, c.flag)
		}
	}
	return ct, nil
}

// checkStates checks state values given in flags against the state column's
// enum type, if it is one, so a typo fails before anything moves.
func checkStates(ctx context.Context, db dbtx, ct *claimedTable, values map[string]string) error {
	var isEnum bool
	var labels []string
	var typ string
	err := db.QueryRow(ctx, `
SELECT t.typtype = 'e',
       ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder),
       format_type(t.oid, NULL)
FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass($1) AND a.attname = $2`, ct.qname, ct.flags.state).Scan(&isEnum, &labels, &typ)
	if err != nil {
		return dbFail("reading the state column's type", err)
	}
	if !isEnum {
		return nil
	}
	flagOrder := make([]string, 0, len(values))
	for f := range values {
		flagOrder = append(flagOrder, f)
	}
	slices.Sort(flagOrder)
	for _, f := range flagOrder {
		if v := values[f]; v != "" && !slices.Contains(labels, v) {
			return failf(fmt.Sprintf("the values of %s are: %s", typ, strings.Join(labels, ", ")),
				"%s: %q is not a value of the state column's type %s", f, v, typ)
		}
	}
	return nil
}

// leaseColumn is the name the claim package's docs give Table.LeaseUntil's
// column; a table with a timestamptz column of this name has leases.
const leaseColumn = "lease_until"

// refuseIgnoredLease returns an error when the table has a timestamptz
// column named leaseColumn: a sweep by claim age alone would take rows from
// holders that still renew their lease.
func refuseIgnoredLease(ctx context.Context, db dbtx, ct *claimedTable) error {
	var has bool
	if err := db.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass($1) AND attname = $2 AND atttypid = 'timestamptz'::regtype
  AND attnum > 0 AND NOT attisdropped)`, ct.qname, leaseColumn).Scan(&has); err != nil {
		return dbFail("reading the catalog", err)
	}
	if !has {
		return nil
	}
	return failf(fmt.Sprintf("pass --lease-until %s: a row is then stale when its lease has passed (or, without a lease, when claimed longer ago than --older-than); "+
		"or --ignore-lease to sweep by claim age alone, taking rows from holders that still renew their lease", leaseColumn),
		"table %s has a lease column %q (timestamptz) that the sweep would ignore: it would move rows under a live lease", ct.qname, leaseColumn)
}

// inspected is the table as package inspect reads it.
func (ct *claimedTable) inspected() inspect.Table {
	return inspect.Table{QName: ct.qname, State: ct.state, ClaimedAt: ct.claimedAt, LeaseUntil: ct.leaseUntil, Reason: ct.reason}
}

// stale returns the condition a stale claimed row meets, the same the
// claim package's sweeper applies (see inspect.Table.Stale).
func (ct *claimedTable) stale(staleAfterParam string) string {
	return ct.inspected().Stale(staleAfterParam)
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// verifyTypes runs claim's Verify (column types, key uniqueness) and names
// flags in its errors.
func verifyTypes[K any](ctx context.Context, c *claim.Claimer[K]) error {
	if err := c.Verify(ctx); err != nil {
		if errors.Is(err, claim.ErrInvalid) {
			return claimError(err, false)
		}
		return dbFail("checking the table", err)
	}
	return nil
}
