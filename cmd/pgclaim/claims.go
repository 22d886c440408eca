package main

import (
	"context"
	"fmt"
	"time"
)

const claimsAbout = `
Counts the rows of a claimed table per state, and for the rows in the
processing state (--processing) the oldest claim's age and how many are stale:
claimed longer ago than --stale-after, or, with --lease-until, past their
lease (the rule the sweeper applies). Ages use the database's clock.

With --reason, it also lists the commonest reasons rows failed, per state, as
the worker and the sweeper record them, with times and fencing tokens left out
so that rows failed for the same cause count together.

Counting reads the whole table; on a very large table it takes a while.`

type stateCountJSON struct {
	State string `json:"state"`
	Rows  int64  `json:"rows"`
}

type claimsJSON struct {
	Table             string           `json:"table"`
	States            []stateCountJSON `json:"states"`
	Processing        string           `json:"processing"`
	ProcessingRows    int64            `json:"processing_rows"`
	OldestClaimedAt   *time.Time       `json:"oldest_claimed_at"`
	OldestAgeSeconds  *float64         `json:"oldest_age_seconds"`
	StaleAfterSeconds float64          `json:"stale_after_seconds"`
	Stale             int64            `json:"stale"`
	Reasons           []reasonJSON     `json:"reasons,omitempty"`
}

type reasonJSON struct {
	State  string `json:"state"`
	Reason string `json:"reason"`
	Rows   int64  `json:"rows"`
}

// maxReasons is how many reasons claims lists.
const maxReasons = 10

func runClaims(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "claims",
		"claims --table T [--state status] [--claimed-at claimed_at] [--lease-until COL] [--reason COL] [--processing PROCESSING] [--stale-after 24h] [--json]",
		claimsAbout)
	tf := addTableFlags(f, false)
	staleAfter := f.Duration("stale-after", 24*time.Hour, "a row claimed longer ago than `DURATION` is stale")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if err := require("table", tf.table); err != nil {
		return err
	}
	if err := require("processing", tf.processing); err != nil {
		return err
	}
	if *staleAfter <= 0 {
		return usagef("--stale-after must be positive, got %v", *staleAfter)
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := tf.newClaimer(pool, ""); err != nil {
		return err
	}
	ct, err := checkTable(ctx, pool, tf, false)
	if err != nil {
		return err
	}
	if err := checkStates(ctx, pool, ct, map[string]string{"--processing": tf.processing}); err != nil {
		return err
	}

	out := claimsJSON{
		Table: ct.qname, States: []stateCountJSON{}, Processing: tf.processing,
		StaleAfterSeconds: seconds(*staleAfter),
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(
		`SELECT coalesce(%[1]s::text, 'NULL'), count(*) FROM %[2]s GROUP BY 1 ORDER BY 1`, ct.state, ct.qname))
	if err != nil {
		return dbFail("counting rows per state", err)
	}
	for rows.Next() {
		var s stateCountJSON
		if err := rows.Scan(&s.State, &s.Rows); err != nil {
			rows.Close()
			return dbFail("counting rows per state", err)
		}
		out.States = append(out.States, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return dbFail("counting rows per state", err)
	}

	err = pool.QueryRow(ctx, fmt.Sprintf(`
SELECT count(*), min(%[1]s),
       extract(epoch FROM statement_timestamp() - min(%[1]s))::float8,
       count(*) FILTER (WHERE %[4]s)
FROM %[2]s WHERE %[3]s = $1`, ct.claimedAt, ct.qname, ct.state, ct.stale("$2")),
		tf.processing, micros(*staleAfter)).Scan(&out.ProcessingRows, &out.OldestClaimedAt, &out.OldestAgeSeconds, &out.Stale)
	if err != nil {
		return dbFail("reading rows in "+tf.processing, err)
	}

	if ct.reason != "" {
		if out.Reasons, err = commonReasons(ctx, pool, ct); err != nil {
			return err
		}
	}

	if f.json {
		return writeJSON(e.stdout, out)
	}
	fmt.Fprintf(e.stdout, "table %s, state column %s\n\n", ct.qname, ct.state)
	t := newTable(e.stdout, "STATE", "ROWS")
	for _, s := range out.States {
		t.row(s.State, s.Rows)
	}
	if len(out.States) == 0 {
		t.row("(no rows)", 0)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(out.Reasons) > 0 {
		fmt.Fprintln(e.stdout)
		t := newTable(e.stdout, "STATE", "ROWS", "REASON (commonest first; times and fences left out)")
		for _, r := range out.Reasons {
			t.row(r.State, r.Rows, r.Reason)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(e.stdout)
	if out.ProcessingRows == 0 {
		fmt.Fprintf(e.stdout, "%s: no rows\n", tf.processing)
		return nil
	}
	oldest := "no claimed_at set"
	if out.OldestClaimedAt != nil && out.OldestAgeSeconds != nil {
		oldest = fmt.Sprintf("oldest claimed %s ago (%s)",
			fmtDur(time.Duration(*out.OldestAgeSeconds*float64(time.Second))), fmtTime(*out.OldestClaimedAt))
	}
	rule := "claimed more than " + fmtDur(*staleAfter) + " ago"
	if ct.leaseUntil != "" {
		rule = "lease passed, or no lease and " + rule
	}
	fmt.Fprintf(e.stdout, "%s: %s, %s; %d stale (%s)\n",
		tf.processing, plural(out.ProcessingRows, "row", "rows"), oldest, out.Stale, rule)
	if out.Stale > 0 {
		fmt.Fprintf(e.stdout, "see what a sweep would move: %s\n", tf.sweepCommand(*staleAfter, "FAILED"))
	}
	return nil
}

// commonReasons returns the commonest reasons of the table's rows, per
// state, with timestamps and fencing tokens replaced so that rows failed
// for the same cause group together.
func commonReasons(ctx context.Context, db dbtx, ct *claimedTable) ([]reasonJSON, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(`
SELECT coalesce(%[1]s::text, 'NULL'),
       regexp_replace(regexp_replace(%[2]s, ', fence [0-9]+', '', 'g'),
                      '[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9:.]+(Z|[+-][0-9:]+)?', '<time>', 'g') AS reason,
       count(*)
FROM %[3]s WHERE %[2]s IS NOT NULL
GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT %[4]d`, ct.state, ct.reason, ct.qname, maxReasons))
	if err != nil {
		return nil, dbFail("reading reasons", err)
	}
	defer rows.Close()
	out := []reasonJSON{}
	for rows.Next() {
		var r reasonJSON
		if err := rows.Scan(&r.State, &r.Reason, &r.Rows); err != nil {
			return nil, dbFail("reading reasons", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, dbFail("reading reasons", err)
	}
	return out, nil
}
