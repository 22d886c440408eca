package claim

// Checking states against the catalog: the state column's enum labels
// and CHECK constraints, and the partial indexes restricted to a state.

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

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
