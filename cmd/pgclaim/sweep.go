package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/claim"
)

const sweepAbout = `
Moves rows stuck in the processing state (--processing) — their holder died or
hung — to the state given by --to, or back to --retry while the row's attempts
(--attempts) are below --max-attempts. A row is stale when it was claimed longer
ago than --older-than, or, with --lease-until, when its lease has passed (then
--older-than applies to rows without a lease, and may be left out to sweep
expired leases only). Ages use the database's clock.

The sweep is the claim package's sweeper: batches of --batch rows, each one
statement that locks its rows with FOR UPDATE SKIP LOCKED and re-checks state
and staleness on the locked row, so a row finished a moment ago is never
overwritten and sweepers running in the service at the same time never move a
row twice. Progress goes to stderr when there is more than one batch.

--dry-run changes nothing: it counts the rows that would move and lists the
oldest (--show). Without --dry-run the sweep shows the same and asks before
moving anything, unless --yes; when stdin is not a terminal (a script),
there is nobody to ask: pass --yes. Rows that become stale between the
question and the answer are moved too.

A table with a timestamptz column named lease_until (the name the claim
package's docs use for Table.LeaseUntil) has leases: a row claimed long ago
whose holder still renews its lease is not stale. Such a sweep must name the
column with --lease-until, or say --ignore-lease to sweep by claim age alone
and take rows from holders still at work; otherwise it is refused.`

type sweptRowJSON struct {
	Key        string     `json:"key"`
	ClaimedAt  *time.Time `json:"claimed_at"`
	AgeSeconds *float64   `json:"age_seconds,omitempty"`
	ClaimedBy  *string    `json:"claimed_by,omitempty"`
	To         string     `json:"to"`
}

type sweepJSON struct {
	Table      string         `json:"table"`
	Processing string         `json:"processing"`
	To         string         `json:"to"`
	Retry      string         `json:"retry,omitempty"`
	DryRun     bool           `json:"dry_run"`
	Stale      int64          `json:"stale"`          // stale rows found before sweeping
	Moved      int64          `json:"moved"`          // rows moved (0 in a dry run)
	ByState    map[string]int `json:"by_state"`       // per new state: rows moved, or in a dry run rows listed
	Rows       []sweptRowJSON `json:"rows"`           // the first --show rows (to move, or moved)
	Truncated  bool           `json:"rows_truncated"` // more rows than listed
}

func runSweep(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "sweep",
		"sweep --table T --older-than 24h --to FAILED [--retry PAUSED --max-attempts N --attempts COL] [--dry-run | --yes] [--ignore-lease] [--batch N] [--show N] [column flags] [--json]",
		sweepAbout)
	tf := addTableFlags(f, true)
	olderThan := f.Duration("older-than", 0, "a row claimed longer ago than `DURATION` (e.g. 24h) is stale (required unless --lease-until is set)")
	to := f.String("to", "", "the `STATE` stale rows move to, e.g. FAILED (required)")
	retry := f.String("retry", "", "move stale rows whose attempts remain to this `STATE` instead, e.g. PAUSED")
	maxAttempts := f.Int("max-attempts", 0, "with --retry: a row claimed `N` times moves to --to instead")
	dryRun := f.Bool("dry-run", false, "change nothing: show what would move")
	yes := f.Bool("yes", false, "do not ask for confirmation")
	ignoreLease := f.Bool("ignore-lease", false, "sweep by --older-than alone although the table has a lease column (lease_until): rows under a live lease move too")
	batch := f.Int("batch", 1000, "move at most `N` rows per statement")
	show := f.Int("show", 20, "list `N` of the rows (the oldest first in a dry run)")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	setFlags := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { setFlags[fl.Name] = true })
	for _, name := range []string{"table", "to", "processing"} {
		if err := require(name, f.Lookup(name).Value.String()); err != nil {
			return err
		}
	}
	if !setFlags["older-than"] && tf.leaseUntil == "" {
		return usagef("--older-than is required (or --lease-until, to sweep rows whose lease has passed)")
	}
	if setFlags["older-than"] && *olderThan <= 0 {
		return usagef("--older-than must be positive, got %v", *olderThan)
	}
	if *batch < 1 {
		return usagef("--batch must be at least 1, got %d", *batch)
	}
	if *show < 0 {
		return usagef("--show must not be negative, got %d", *show)
	}
	if *ignoreLease && tf.leaseUntil != "" {
		return usagef("--ignore-lease and --lease-until exclude each other")
	}
	if !*dryRun && !*yes {
		if err := canConfirm(e, "sweep", "--dry-run to see what would move"); err != nil {
			return err
		}
	}

	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The claimer's From is never used by a sweeper; --to differs from
	// --processing (NewSweeper checks), so it does.
	c, err := tf.newClaimer(pool, *to)
	if err != nil {
		return err
	}
	ct, err := checkTable(ctx, pool, tf, true)
	if err != nil {
		return err
	}
	if err := checkStates(ctx, pool, ct, map[string]string{"--processing": tf.processing, "--to": *to, "--retry": *retry}); err != nil {
		return err
	}
	if tf.leaseUntil == "" && !*ignoreLease {
		if err := refuseIgnoredLease(ctx, pool, ct); err != nil {
			return err
		}
	}

	var moved int64
	var shown []sweptRowJSON
	byState := map[string]int{}
	var stale int64
	progress := progressWriter(e.progress, f.json)
	sw, err := claim.NewSweeper(c, claim.SweeperConfig[any]{
		StaleAfter: *olderThan,
		Failed:     *to,
		Retry:      claim.RetryPolicy{State: *retry, MaxAttempts: *maxAttempts},
		BatchSize:  *batch,
		SkipVerify: true, // verifyTypes below, naming flags
		OnSwept: func(_ context.Context, rows []claim.Swept[any]) {
			for _, r := range rows {
				byState[r.State]++
				if len(shown) < *show {
					row := sweptRowJSON{Key: keyString(r.Key), To: r.State}
					if !r.ClaimedAt.IsZero() {
						at := r.ClaimedAt
						row.ClaimedAt = &at
					}
					if tf.claimedBy != "" {
						by := r.ClaimedBy
						row.ClaimedBy = &by
					}
					shown = append(shown, row)
				}
			}
			moved += int64(len(rows))
			if stale > int64(*batch) {
				progress(moved, stale)
			}
		},
	})
	if err != nil {
		return claimError(err, true)
	}
	if err := verifyTypes(ctx, c); err != nil {
		return err
	}

	staleAfterParam := ""
	qargs := []any{tf.processing}
	if *olderThan > 0 {
		staleAfterParam = "$2"
		qargs = append(qargs, micros(*olderThan))
	}
	where := fmt.Sprintf("%s = $1 AND %s", ct.state, ct.stale(staleAfterParam))
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s`, ct.qname, where), qargs...).Scan(&stale); err != nil {
		return dbFail("counting stale rows", err)
	}

	out := sweepJSON{
		Table: ct.qname, Processing: tf.processing, To: *to, Retry: *retry, DryRun: *dryRun,
		Stale: stale, ByState: map[string]int{}, Rows: []sweptRowJSON{},
	}
	if *dryRun || (!*yes && stale > 0) {
		preview := out
		rows, err := previewStale(ctx, pool, ct, where, qargs, *to, *retry, *maxAttempts, *show)
		if err != nil {
			return err
		}
		preview.DryRun, preview.ByState = true, map[string]int{}
		preview.Rows = rows
		preview.Truncated = int64(len(rows)) < stale
		for _, r := range rows {
			preview.ByState[r.To]++
		}
		if *dryRun {
			if f.json {
				return writeJSON(e.stdout, preview)
			}
			return printSweep(e.stdout, preview, tf, "dry run: ")
		}
		if err := printSweep(e.stderr, preview, tf, ""); err != nil {
			return err
		}
		fmt.Fprintln(e.stderr)
		if !confirm(e, "A holder still working on one of these rows loses it (its finish fails). Move them?") {
			return declined("not swept")
		}
	}
	if !*yes && stale == 0 {
		// Nothing to confirm, so nothing is moved: a row that became stale
		// since the count waits for the next sweep.
		if f.json {
			return writeJSON(e.stdout, out)
		}
		return printSweep(e.stdout, out, tf, "")
	}

	_, err = sw.Sweep(ctx)
	progress(-1, 0)
	out.Moved, out.ByState, out.Rows = moved, byState, shown
	if out.Rows == nil {
		out.Rows = []sweptRowJSON{}
	}
	out.Truncated = int64(len(out.Rows)) < moved
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return &failure{msg: fmt.Sprintf("interrupted after moving %s", plural(moved, "row", "rows")), err: err}
		}
		return dbFail(fmt.Sprintf("sweep (after moving %s)", plural(moved, "row", "rows")), err)
	}
	if f.json {
		return writeJSON(e.stdout, out)
	}
	return printSweep(e.stdout, out, tf, "")
}

// previewStale lists the oldest stale rows and the state each would move to.
func previewStale(ctx context.Context, db dbtx, ct *claimedTable, where string, qargs []any, to, retry string, maxAttempts, n int) ([]sweptRowJSON, error) {
	out := []sweptRowJSON{}
	if n == 0 {
		return out, nil
	}
	target := fmt.Sprintf("$%d::text", len(qargs)+1)
	qargs = append(qargs, to)
	if retry != "" {
		target = fmt.Sprintf("CASE WHEN coalesce(%s, 0) < $%d THEN $%d::text ELSE %s END", ct.attempts, len(qargs)+1, len(qargs)+2, target)
		qargs = append(qargs, maxAttempts, retry)
	}
	claimedBy := "NULL::text"
	if ct.claimedBy != "" {
		claimedBy = ct.claimedBy + "::text"
	}
	q := fmt.Sprintf(`
SELECT %[1]s::text, %[2]s, extract(epoch FROM statement_timestamp() - %[2]s)::float8, %[3]s, %[4]s
FROM %[5]s WHERE %[6]s
ORDER BY %[2]s NULLS FIRST
LIMIT $%[7]d`, ct.key, ct.claimedAt, claimedBy, target, ct.qname, where, len(qargs)+1)
	qargs = append(qargs, n)
	rows, err := db.Query(ctx, q, qargs...)
	if err != nil {
		return nil, dbFail("listing stale rows", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r sweptRowJSON
		if err := rows.Scan(&r.Key, &r.ClaimedAt, &r.AgeSeconds, &r.ClaimedBy, &r.To); err != nil {
			return nil, dbFail("listing stale rows", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, dbFail("listing stale rows", err)
	}
	return out, nil
}

// printSweep prints a sweep's result, or with out.DryRun what it would
// move, the first line led by lead.
func printSweep(w io.Writer, out sweepJSON, tf *tableFlags, lead string) error {
	dest := out.To
	if out.Retry != "" {
		dest = out.Retry + " or " + out.To
	}
	if out.DryRun {
		fmt.Fprintf(w, "%swould move %s of %s from %s to %s\n", lead,
			plural(out.Stale, "stale row", "stale rows"), out.Table, out.Processing, dest)
	} else {
		fmt.Fprintf(w, "%smoved %s of %s from %s to %s\n", lead,
			plural(out.Moved, "row", "rows"), out.Table, out.Processing, dest)
	}
	if len(out.ByState) > 1 {
		states := make([]string, 0, len(out.ByState))
		for s := range out.ByState {
			states = append(states, s)
		}
		sort.Strings(states)
		parts := make([]string, 0, len(states))
		for _, s := range states {
			parts = append(parts, fmt.Sprintf("%d to %s", out.ByState[s], s))
		}
		suffix := ""
		if out.DryRun {
			suffix = ", among those listed"
		}
		fmt.Fprintf(w, "(%s%s)\n", strings.Join(parts, ", "), suffix)
	}
	if len(out.Rows) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	headers := []string{"KEY", "CLAIMED AT"}
	if out.DryRun {
		headers = append(headers, "AGE")
	}
	if tf.claimedBy != "" {
		headers = append(headers, "CLAIMED BY")
	}
	headers = append(headers, "TO")
	t := newTable(w, headers...)
	for _, r := range out.Rows {
		cells := []any{r.Key, fmtTimePtr(r.ClaimedAt)}
		if out.DryRun {
			age := "-"
			if r.AgeSeconds != nil {
				age = fmtDur(time.Duration(*r.AgeSeconds * float64(time.Second)))
			}
			cells = append(cells, age)
		}
		if tf.claimedBy != "" {
			cells = append(cells, strOrDash(r.ClaimedBy))
		}
		cells = append(cells, r.To)
		t.row(cells...)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if out.Truncated {
		n := out.Stale
		if !out.DryRun {
			n = out.Moved
		}
		fmt.Fprintf(w, "… and %d more\n", n-int64(len(out.Rows)))
	}
	return nil
}

// progressWriter returns a function printing "swept N / ~TOTAL" to w, on one
// line redrawn in place when w is a terminal, else one line per call. A
// negative n ends the line. Nothing is printed when quiet.
func progressWriter(w io.Writer, quiet bool) func(n, total int64) {
	if quiet {
		return func(int64, int64) {}
	}
	tty := false
	if fd, ok := w.(*os.File); ok {
		if st, err := fd.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	printed := false
	return func(n, total int64) {
		switch {
		case n < 0:
			if tty && printed {
				fmt.Fprintln(w)
			}
		case tty:
			fmt.Fprintf(w, "\rswept %d / ~%d", n, total)
			printed = true
		default:
			fmt.Fprintf(w, "swept %d / ~%d\n", n, total)
			printed = true
		}
	}
}

// keyString prints a key scanned by pgx into an interface value.
func keyString(k any) string {
	switch v := k.(type) {
	case [16]byte:
		return fmt.Sprintf("%x-%x-%x-%x-%x", v[0:4], v[4:6], v[6:8], v[8:10], v[10:16])
	case []byte:
		return string(v)
	case nil:
		return "NULL"
	}
	return fmt.Sprint(k)
}
