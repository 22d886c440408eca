package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgclaim/pgclaim/status/inspect"
)

const claimsAbout = `
Counts the rows of a claimed table per state, and for the rows in the
processing state (--processing) the oldest claim's age and how many are stale:
claimed longer ago than --stale-after, or, with --lease-until, past their
lease (the rule the sweeper applies). Ages use the database's clock.

With --reason COLUMN (the text column saying why a row failed), it also
lists the commonest reasons rows failed, per state, as the worker and the
sweeper record them, with times and fencing tokens left out so that rows
failed for the same cause count together.

Counting reads the whole table; on a very large table it takes a while.`

// The JSON shapes of 'pgclaim claims' are package inspect's.
type (
	stateCountJSON = inspect.StateCount
	claimsJSON     = inspect.Claims
	reasonJSON     = inspect.Reason
)

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

	out, err := inspect.ReadClaims(ctx, pool, ct.inspected(), tf.processing, *staleAfter)
	if err != nil {
		var ie *inspect.Error
		if errors.As(err, &ie) {
			return dbFail(ie.What, ie.Err)
		}
		return err
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
