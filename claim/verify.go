package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// ErrMissingIndex is matched by the warning Worker.Verify and
// Sweeper.Verify return when a partial index they rely on is missing: the
// index on the claim state (Config.From) that batch claims select rows
// through, or the one on the processing state (Config.To) that sweeps
// select through. Without it every batch rescans the rows already finished,
// and a long run slows down as it goes; nothing else goes wrong. Such a
// warning is returned only when the table has no other problem, so an
// error matching ErrMissingIndex never hides one matching ErrInvalid: a
// caller may log it and go on:
//
//	if err := w.Verify(ctx); err != nil && !errors.Is(err, claim.ErrMissingIndex) {
//		return err
//	}
//
// NewWorker and NewSweeper log it at warn level and do not fail.
var ErrMissingIndex = errors.New("claim: missing partial index")

// indexWarning is a missing partial index; it matches ErrMissingIndex.
type indexWarning struct {
	field string
	msg   string
}

func (e *indexWarning) Error() string        { return "claim: " + e.field + ": " + e.msg }
func (e *indexWarning) Is(target error) bool { return target == ErrMissingIndex }

// stateRef is a configured state and the field it comes from.
type stateRef struct {
	field, value string
}

// verifySpec is what a Verify checks beyond the table's columns.
type verifySpec struct {
	// states are checked against the state column's enum labels and
	// CHECK constraints.
	states []stateRef
	// indexed are states that need a partial index (ClaimBatch: From;
	// Sweeper: To); a missing one is a warning.
	indexed []indexNeed
}

// indexNeed is a state that a statement selects rows by.
type indexNeed struct {
	stateRef
	by   string // what selects by it, e.g. "batch claims"
	cols string // the quoted columns of the suggested index
	note string // appended to the suggestion
}

// verifyTimeout bounds the default verification of NewWorker and
// NewSweeper, which take no context.
const verifyTimeout = 10 * time.Second

// verify runs the checks of Claimer.Verify with the From and To states and
// those in extra.
func (c *Claimer[K]) verify(ctx context.Context, extra verifySpec) error {
	extra.states = append([]stateRef{{"Config.From", c.c.from}, {"Config.To", c.c.to}}, extra.states...)
	return c.c.t.verify(ctx, c.db, extra)
}

// Verify checks everything Claimer.Verify checks, and also that the
// worker's Done, Failed and Retry.State states are allowed by the state column
// (its enum labels and its CHECK constraints of the forms
// "col IN (...)", "col = ANY (ARRAY[...])", "col = '...'" and OR or AND
// combinations of them; a constraint of another form is not checked), and
// that the role has the privileges a claim needs: SELECT and UPDATE on the
// table's configured columns (or the whole table), and, with Table.Fence,
// USAGE on pgclaim_fence_seq and EXECUTE on pgclaim_fence(). Any problem is
// an error matching ErrInvalid naming the field (a missing privilege: with
// the GRANT that fixes it). When all that holds, it returns a warning
// matching ErrMissingIndex if no valid partial index restricted to
// Config.From exists (batch claims need it), and nil otherwise. NewWorker
// calls it unless WorkerConfig.SkipVerify is set.
func (w *Worker[K]) Verify(ctx context.Context) error {
	t := w.c.c.t
	return withPrivileges(ctx, w.c.db, t, true, w.c.verify(ctx, verifySpec{
		states: []stateRef{
			{"WorkerConfig.Done", w.cfg.Done},
			{"WorkerConfig.Failed", w.cfg.Failed},
			{"WorkerConfig.Retry.State", w.cfg.Retry.State},
		},
		indexed: []indexNeed{{stateRef: stateRef{"Config.From", w.c.c.from}, by: "batch claims", cols: t.key,
			note: " (index the Config.Order columns)"}},
	}))
}

// Verify checks the table against its spec like Claimer.Verify, and that
// Config.To and the sweeper's Failed and Retry.State states are allowed by the
// state column (enum labels and simple CHECK constraints, as for
// Worker.Verify; the claimer's From is not checked, a sweeper does not use
// it). Any problem is an error matching ErrInvalid naming the field. When
// all that holds, it returns a warning matching ErrMissingIndex if no valid
// partial index restricted to Config.To exists (sweeps select through it),
// and nil otherwise. It checks the privileges on the table as
// Worker.Verify does (a sweep takes no fencing token). NewSweeper calls it
// unless SweeperConfig.SkipVerify is set.
func (s *Sweeper[K]) Verify(ctx context.Context) error {
	t := s.c.c.t
	hint := t.claimedAt
	if t.leaseUntil != "" && s.cfg.StaleAfter == 0 {
		hint = t.leaseUntil
	}
	return withPrivileges(ctx, s.c.db, t, false, s.c.c.t.verify(ctx, s.c.db, verifySpec{
		states: []stateRef{
			{"Config.To", s.c.c.to},
			{"SweeperConfig.Failed", s.cfg.Failed},
			{"SweeperConfig.Retry.State", s.cfg.Retry.State},
		},
		indexed: []indexNeed{{stateRef: stateRef{"Config.To", s.c.c.to}, by: "sweeps", cols: hint}},
	}))
}

// withPrivileges returns err, the table's verification, unless it found
// nothing wrong (nil, or only missing indexes): then what the role lacks of
// the privileges on the table and, with fence, on the fence, if anything,
// else err.
func withPrivileges(ctx context.Context, db DBTX, t *table, fence bool, err error) error {
	if err != nil && !errors.Is(err, ErrMissingIndex) || errors.Is(err, ErrInvalid) {
		return err
	}
	if perr := t.verifyPrivileges(ctx, db, fence); perr != nil {
		return perr
	}
	return err
}

// verifyPrivileges asks the catalog whether the current role may do what
// claims, finishes and sweeps do: SELECT the configured columns, UPDATE
// all but the key and, with fence, take a token (USAGE on the sequence,
// EXECUTE on the function). It returns one error per missing privilege,
// naming the GRANT that fixes it.
func (v *table) verifyPrivileges(ctx context.Context, db DBTX, fence bool) error {
	s := v.spec
	var cols []string
	for _, c := range []string{s.Key, s.State, s.ClaimedAt, s.ClaimedBy, s.Fence, s.LeaseUntil, s.Attempts, s.RetryAt, s.Reason} {
		if c != "" {
			cols = append(cols, c)
		}
	}
	seq, fn := v.pgclaim.Object("pgclaim_fence_seq"), v.pgclaim.Object("pgclaim_fence()")
	var role string
	var noSelect, noUpdate []string
	var seqOK, fnOK bool
	err := db.QueryRow(ctx, `
SELECT current_user::text,
       ARRAY(SELECT c FROM unnest($2::text[]) WITH ORDINALITY u(c, i) WHERE NOT has_column_privilege($1::text, c, 'SELECT') ORDER BY i),
       ARRAY(SELECT c FROM unnest($2::text[]) WITH ORDINALITY u(c, i) WHERE i > 1 AND NOT has_column_privilege($1::text, c, 'UPDATE') ORDER BY i),
       CASE WHEN $3::bool THEN has_sequence_privilege($4::text, 'USAGE') OR has_sequence_privilege($4::text, 'UPDATE') ELSE true END,
       CASE WHEN $3::bool THEN has_function_privilege($5::text, 'EXECUTE') ELSE true END`,
		v.qname, cols, fence && s.Fence != "", seq, fn).Scan(&role, &noSelect, &noUpdate, &seqOK, &fnOK)
	if err != nil {
		return fmt.Errorf("claim: Verify: privileges: %w", err)
	}
	r := quote(role)
	var errs []error
	lacks := func(priv string, missing []string, all int) {
		if len(missing) == 0 {
			return
		}
		what, grant := "table "+v.qname, priv
		if len(missing) < all {
			what = "columns " + strings.Join(missing, ", ") + " of table " + v.qname
			quoted := make([]string, len(missing))
			for i, c := range missing {
				quoted[i] = quote(c)
			}
			grant += " (" + strings.Join(quoted, ", ") + ")"
		}
		errs = append(errs, invalid("Table.Name", fmt.Sprintf("role %s lacks %s on %s, which claims need; grant it with: GRANT %s ON TABLE %s TO %s",
			r, priv, what, grant, v.qname, r)))
	}
	lacks("SELECT", noSelect, len(cols))
	lacks("UPDATE", noUpdate, len(cols)-1)
	if !seqOK {
		errs = append(errs, invalid("Table.Fence", fmt.Sprintf("role %s lacks USAGE on sequence %s, from which each claim takes its fencing token; grant it with: GRANT USAGE, SELECT ON SEQUENCE %s TO %s",
			r, seq, seq, r)))
	}
	if !fnOK {
		errs = append(errs, invalid("Table.Fence", fmt.Sprintf("role %s lacks EXECUTE on function %s, which gives each claim its fencing token; grant it with: GRANT EXECUTE ON FUNCTION %s TO %s",
			r, fn, fn, r)))
	}
	return errors.Join(errs...)
}

// verifyOnNew runs verify for a constructor and returns what it found
// wrong with the table or the states (an error matching ErrInvalid). A
// missing partial index (ErrMissingIndex) is logged at warn level, and so
// is a failure to ask the database at all (it is unreachable, or slower
// than verifyTimeout): the constructor does not fail for those, and the
// statements that later run into the same trouble report it as before.
func verifyOnNew(ctor string, c *core, verify func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), verifyTimeout)
	defer cancel()
	err := verify(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalid):
		return err
	case errors.Is(err, ErrMissingIndex):
		c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: "+ctor+": missing partial index",
			slog.String("table", c.t.qname), slog.Any("warning", err)))
	default:
		c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: "+ctor+": could not verify the table and states",
			slog.String("table", c.t.qname), slog.Any("error", err)))
	}
	return nil
}

// stateType is what verifyStates learns about the state column's type.
type stateType struct {
	name     string   // format_type of the column's own type
	labels   []string // enum labels of the base type; nil when not an enum
	enumName string
	bpchar   bool     // base type is char(n): trailing blanks do not count
	domains  []uint32 // the domains between the column's type and its base
}

const oidBpchar = 1042

// verifyStates checks every configured state against the state column's
// enum labels and the CHECK constraints it understands (see allowedStates);
// it returns one error per rejected state.
func (v *table) verifyStates(ctx context.Context, db DBTX, rel uint32, col columnInfo, states []stateRef) ([]error, error) {
	var st stateType
	// The column's type, then the domains under it down to the base type.
	rows, err := db.Query(ctx, `
WITH RECURSIVE chain AS (
  SELECT t.oid, t.typtype, t.typbasetype, 0 AS depth FROM pg_catalog.pg_type t WHERE t.oid = $1
  UNION ALL
  SELECT t.oid, t.typtype, t.typbasetype, c.depth + 1
  FROM pg_catalog.pg_type t JOIN chain c ON t.oid = c.typbasetype
  WHERE c.typtype = 'd' AND c.depth < 32
)
SELECT c.oid, c.typtype::text, format_type(c.oid, NULL),
       ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e WHERE e.enumtypid = c.oid ORDER BY e.enumsortorder)
FROM chain c ORDER BY c.depth`, col.oid)
	if err != nil {
		return nil, err
	}
	first := true
	for rows.Next() {
		var oid uint32
		var typtype, name string
		var labels []string
		if err := rows.Scan(&oid, &typtype, &name, &labels); err != nil {
			rows.Close()
			return nil, err
		}
		if first {
			st.name, first = name, false
		}
		switch typtype {
		case "d":
			st.domains = append(st.domains, oid)
		case "e":
			st.labels, st.enumName = labels, name
		}
		st.bpchar = oid == oidBpchar
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	// The CHECK constraints: the table's that involve the state column
	// (conkey), and the domains'. A domain's expression calls the value
	// VALUE.
	type check struct{ name, expr, col string }
	var checks []check
	rows, err = db.Query(ctx, `
SELECT c.conname::text, pg_get_expr(c.conbin, c.conrelid), c.contypid <> 0
FROM pg_catalog.pg_constraint c
WHERE c.contype = 'c' AND c.conbin IS NOT NULL
  AND ((c.conrelid = $1 AND $2::int2 = ANY (c.conkey)) OR c.contypid = ANY ($3::oid[]))
ORDER BY c.contypid <> 0, c.conname`, rel, col.attnum, st.domains)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var ck check
		var domain bool
		if err := rows.Scan(&ck.name, &ck.expr, &domain); err != nil {
			rows.Close()
			return nil, err
		}
		ck.col = v.spec.State
		if domain {
			ck.col = "VALUE"
		}
		checks = append(checks, ck)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	norm := func(s string) string {
		if st.bpchar {
			return strings.TrimRight(s, " ")
		}
		return s
	}
	var errs []error
	for _, s := range states {
		if s.value == "" {
			continue
		}
		if st.labels != nil && !slices.Contains(st.labels, s.value) {
			errs = append(errs, invalid(s.field, fmt.Sprintf("state %q is not a label of enum %s, the type of column %q (labels: %s)",
				s.value, st.enumName, v.spec.State, strings.Join(st.labels, ", "))))
			continue
		}
		for _, ck := range checks {
			allowed, ok := allowedStates(ck.expr, ck.col)
			if !ok || slices.ContainsFunc(allowed, func(a string) bool { return norm(a) == norm(s.value) }) {
				continue
			}
			on := fmt.Sprintf("of table %s", v.qname)
			if ck.col == "VALUE" {
				on = "of domain " + st.name
			}
			errs = append(errs, invalid(s.field, fmt.Sprintf("state %q is rejected by CHECK constraint %s %s on column %q (allowed: %s)",
				s.value, quote(ck.name), on, v.spec.State, strings.Join(allowed, ", "))))
			break
		}
	}
	return errs, nil
}

// verifyIndexes returns a warning for each state in spec.indexed that no
// valid partial index of the table is restricted to.
func (v *table) verifyIndexes(ctx context.Context, db DBTX, rel uint32, spec verifySpec) ([]error, error) {
	if len(spec.indexed) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, `
SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_catalog.pg_index i
WHERE i.indrelid = $1 AND i.indpred IS NOT NULL AND i.indisvalid`, rel)
	if err != nil {
		return nil, err
	}
	var preds []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return nil, err
		}
		preds = append(preds, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var warns []error
	for _, s := range spec.indexed {
		found := false
		for _, p := range preds {
			if allowed, ok := allowedStates(p, v.spec.State); ok && slices.Contains(allowed, s.value) {
				found = true
				break
			}
		}
		if !found {
			warns = append(warns, &indexWarning{field: s.field, msg: fmt.Sprintf(
				"no partial index of %s is restricted to state %q: %s rescan the rows already finished and slow down as they go; for example CREATE INDEX ON %s (%s) WHERE %s = '%s'%s",
				v.qname, s.value, s.by, v.qname, s.cols, v.state, strings.ReplaceAll(s.value, "'", "''"), s.note)})
		}
	}
	return warns, nil
}

// allowedStates reads a boolean expression as PostgreSQL deparses it
// (pg_get_expr) and returns the values it allows for column col, with
// ok = false when it cannot tell. It understands comparisons of the column
// (possibly cast) with string literals, "col = 'x'" and
// "col = ANY (ARRAY['x', ...])" (which is how "col IN (...)" is stored),
// joined by OR (the union) and AND (the intersection of the parts it
// understands; the others only narrow it further). Everything else, such
// as NOT, <>, functions or E” literals, is not understood: a value it
// does not list is then not known to be rejected.
func allowedStates(expr, col string) ([]string, bool) {
	e := stripParens(strings.TrimSpace(expr))
	if parts := splitTop(e, " OR "); len(parts) > 1 {
		var all []string
		for _, p := range parts {
			vals, ok := allowedStates(p, col)
			if !ok {
				return nil, false
			}
			for _, v := range vals {
				if !slices.Contains(all, v) {
					all = append(all, v)
				}
			}
		}
		return all, true
	}
	if parts := splitTop(e, " AND "); len(parts) > 1 {
		var set []string
		known := false
		for _, p := range parts {
			vals, ok := allowedStates(p, col)
			if !ok {
				continue
			}
			if !known {
				set, known = vals, true
				continue
			}
			set = slices.DeleteFunc(set, func(v string) bool { return !slices.Contains(vals, v) })
		}
		return set, known
	}
	sides := splitTop(e, " = ")
	if len(sides) != 2 || !isColumn(sides[0], col) {
		return nil, false
	}
	rhs := stripParens(sides[1])
	if arr, ok := strings.CutPrefix(rhs, "ANY "); ok {
		arr = stripCasts(arr)
		inner, ok := strings.CutPrefix(arr, "ARRAY[")
		if !ok || !strings.HasSuffix(inner, "]") {
			return nil, false
		}
		var vals []string
		for _, item := range splitTop(inner[:len(inner)-1], ", ") {
			v, ok := literal(item)
			if !ok {
				return nil, false
			}
			vals = append(vals, v)
		}
		return vals, true
	}
	v, ok := literal(rhs)
	if !ok {
		return nil, false
	}
	return []string{v}, true
}

// scanTop calls f at each byte of s outside quotes, parentheses and
// brackets; f returns false to stop.
func scanTop(s string, f func(i int) bool) {
	depth := 0
	var q byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case q != 0:
			if ch == q {
				q = 0 // a doubled quote closes and reopens: same result
			}
		case ch == '\'' || ch == '"':
			q = ch
		case ch == '(' || ch == '[':
			depth++
		case ch == ')' || ch == ']':
			depth--
		case depth == 0:
			if !f(i) {
				return
			}
		}
	}
}

// splitTop splits s at each sep outside quotes and brackets.
func splitTop(s, sep string) []string {
	var parts []string
	last := 0
	scanTop(s, func(i int) bool {
		if i >= last && strings.HasPrefix(s[i:], sep) {
			parts = append(parts, s[last:i])
			last = i + len(sep)
		}
		return true
	})
	return append(parts, s[last:])
}

// stripParens removes parentheses around the whole of s.
func stripParens(s string) string {
	for len(s) >= 2 && s[0] == '(' && s[len(s)-1] == ')' {
		// The first '(' must close at the very end.
		depth, closes := 0, -1
		var q byte
		for i := 0; i < len(s) && closes < 0; i++ {
			switch ch := s[i]; {
			case q != 0:
				if ch == q {
					q = 0
				}
			case ch == '\'' || ch == '"':
				q = ch
			case ch == '(':
				depth++
			case ch == ')':
				depth--
				if depth == 0 {
					closes = i
				}
			}
		}
		if closes != len(s)-1 {
			return s
		}
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	return s
}

// stripCasts removes parentheses and trailing "::type" casts around s.
func stripCasts(s string) string {
	for {
		s = stripParens(s)
		cut := -1
		scanTop(s, func(i int) bool {
			if strings.HasPrefix(s[i:], "::") {
				cut = i
			}
			return true
		})
		if cut <= 0 {
			return s
		}
		s = strings.TrimSpace(s[:cut])
	}
}

// isColumn reports whether s, stripped of parentheses and casts, is the
// identifier col as deparsed (quoted when it needs to be).
func isColumn(s, col string) bool {
	s = stripCasts(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`) == col
	}
	return s == col
}

// literal returns the value of a standard string literal, possibly cast.
func literal(s string) (string, bool) {
	s = stripCasts(s)
	if len(s) < 2 || s[0] != '\'' || s[len(s)-1] != '\'' {
		return "", false
	}
	inner := s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		if inner[i] == '\'' {
			if i+1 >= len(inner) || inner[i+1] != '\'' {
				return "", false // two literals, or not a literal at all
			}
			i++
		}
		b.WriteByte(inner[i])
	}
	return b.String(), true
}
