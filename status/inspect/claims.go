package inspect

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Table names a claimed table's parts as SQL identifiers already validated
// (claim.New) and quoted (pgx.Identifier): QName the table, possibly
// schema-qualified; the columns "" when not configured (State and
// ClaimedAt are required).
type Table struct {
	QName, State, ClaimedAt, LeaseUntil, Reason string
	// EstimateAbove: when the planner's row count of the table
	// (pg_class.reltuples) is at least this, the rows per state and the
	// reasons are estimated from a sample of the table's pages (TABLESAMPLE
	// SYSTEM) instead of counted; the rows in the processing state are
	// still counted. Zero: always counted.
	EstimateAbove int64
}

// sampleRows is about how many rows an estimate reads.
const sampleRows = 50_000

// Stale returns the condition a stale claimed row meets, the same the
// claim package's sweeper applies: its lease has passed, or (without a
// lease) it was claimed more than staleAfterParam microseconds ago.
// staleAfterParam is "" to test leases only.
func (t Table) Stale(staleAfterParam string) string {
	old := fmt.Sprintf("%s < statement_timestamp() - (%s::bigint * interval '1 microsecond')", t.ClaimedAt, staleAfterParam)
	switch {
	case t.LeaseUntil == "":
		return old
	case staleAfterParam == "":
		return t.LeaseUntil + " < statement_timestamp()"
	}
	return fmt.Sprintf("(%[1]s < statement_timestamp() OR (%[1]s IS NULL AND %[2]s))", t.LeaseUntil, old)
}

// StateCount is how many rows are in a state ("NULL" for a NULL state).
type StateCount struct {
	State string `json:"state"`
	Rows  int64  `json:"rows"`
}

// Reason is a failure reason shared by Rows rows in State, with times and
// fencing tokens left out.
type Reason struct {
	State  string `json:"state"`
	Reason string `json:"reason"`
	Rows   int64  `json:"rows"`
}

// Claims is a claimed table's rows per state, its rows in the processing
// state (the oldest claim's age, how many are stale) and, when the table
// has a reason column, its commonest failure reasons.
type Claims struct {
	Table             string       `json:"table"`
	States            []StateCount `json:"states"`
	Processing        string       `json:"processing"`
	ProcessingRows    int64        `json:"processing_rows"`
	OldestClaimedAt   *time.Time   `json:"oldest_claimed_at"`
	OldestAgeSeconds  *float64     `json:"oldest_age_seconds"`
	StaleAfterSeconds float64      `json:"stale_after_seconds"`
	Stale             int64        `json:"stale"`
	Reasons           []Reason     `json:"reasons,omitempty"`
	// Estimated says States and Reasons are estimates (Table.EstimateAbove)
	// scaled from a sample of SamplePercent of the table's pages to its
	// planner row count EstimatedRows; ProcessingRows and Stale are counted.
	Estimated     bool    `json:"estimated"`
	EstimatedRows int64   `json:"estimated_rows,omitempty"`
	SamplePercent float64 `json:"sample_percent,omitempty"`
}

// MaxReasons is how many reasons ReadClaims lists.
const MaxReasons = 10

// ReadClaims counts t's rows per state and reads its rows in the state
// processing: how many, the oldest claim, and how many are stale by the
// sweeper's rule with staleAfter (positive). With t.Reason it lists the
// commonest reasons (at most MaxReasons). It reads the whole table, or,
// with t.EstimateAbove, a sample of a large one.
func ReadClaims(ctx context.Context, db DB, t Table, processing string, staleAfter time.Duration) (Claims, error) {
	out := Claims{
		Table: t.QName, States: []StateCount{}, Processing: processing,
		StaleAfterSeconds: staleAfter.Seconds(),
	}
	from := t.QName
	if t.EstimateAbove > 0 {
		var n float64
		if err := db.QueryRow(ctx, `SELECT reltuples::float8 FROM pg_class WHERE oid = $1::regclass`, t.QName).Scan(&n); err != nil {
			return Claims{}, fail("reading the table's planner row count", err)
		}
		if n >= float64(t.EstimateAbove) {
			out.Estimated, out.EstimatedRows = true, int64(n)
			out.SamplePercent = min(100, max(0.01, 100*sampleRows/n))
			from = fmt.Sprintf("%s TABLESAMPLE SYSTEM (%g)", t.QName, out.SamplePercent)
		}
	}
	rows, err := db.Query(ctx, fmt.Sprintf(
		`SELECT coalesce(%[1]s::text, 'NULL'), count(*) FROM %[2]s GROUP BY 1 ORDER BY 1`, t.State, from))
	if err != nil {
		return Claims{}, fail("counting rows per state", err)
	}
	var sampled int64
	for rows.Next() {
		var s StateCount
		if err := rows.Scan(&s.State, &s.Rows); err != nil {
			rows.Close()
			return Claims{}, fail("counting rows per state", err)
		}
		sampled += s.Rows
		out.States = append(out.States, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Claims{}, fail("counting rows per state", err)
	}
	scale := func(n int64) int64 { return n }
	if out.Estimated && sampled > 0 {
		scale = func(n int64) int64 {
			return int64(math.Round(float64(n) * float64(out.EstimatedRows) / float64(sampled)))
		}
	}
	for i := range out.States {
		out.States[i].Rows = scale(out.States[i].Rows)
	}

	err = db.QueryRow(ctx, fmt.Sprintf(`
SELECT count(*), min(%[1]s),
       extract(epoch FROM statement_timestamp() - min(%[1]s))::float8,
       count(*) FILTER (WHERE %[4]s)
FROM %[2]s WHERE %[3]s = $1`, t.ClaimedAt, t.QName, t.State, t.Stale("$2")),
		processing, staleAfter.Microseconds()).Scan(&out.ProcessingRows, &out.OldestClaimedAt, &out.OldestAgeSeconds, &out.Stale)
	if err != nil {
		return Claims{}, fail("reading rows in "+processing, err)
	}

	if t.Reason != "" {
		if out.Reasons, err = commonReasons(ctx, db, t, from); err != nil {
			return Claims{}, err
		}
		for i := range out.Reasons {
			out.Reasons[i].Rows = scale(out.Reasons[i].Rows)
		}
	}
	return out, nil
}

// commonReasons returns the commonest reasons of the table's rows, per
// state, with timestamps and fencing tokens replaced so that rows failed
// for the same cause group together. from is the table, or a sample of it.
func commonReasons(ctx context.Context, db DB, t Table, from string) ([]Reason, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(`
SELECT coalesce(%[1]s::text, 'NULL'),
       regexp_replace(regexp_replace(%[2]s, ', fence [0-9]+', '', 'g'),
                      '[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9:.]+(Z|[+-][0-9:]+)?', '<time>', 'g') AS reason,
       count(*)
FROM %[3]s WHERE %[2]s IS NOT NULL
GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT %[4]d`, t.State, t.Reason, from, MaxReasons))
	if err != nil {
		return nil, fail("reading reasons", err)
	}
	defer rows.Close()
	out := []Reason{}
	for rows.Next() {
		var r Reason
		if err := rows.Scan(&r.State, &r.Reason, &r.Rows); err != nil {
			return nil, fail("reading reasons", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fail("reading reasons", err)
	}
	return out, nil
}
