package main

// pgclaim schedules missed and runs: what a schedule did.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/status/inspect"
)

func runSchedulesMissed(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules missed", "schedules missed NAME [--since T] [--limit N] [--grace DURATION] [--database-url URL] [--json]", `
Lists the missed instants of the schedule NAME, from the database alone: due
by its stored definition after --since (and after its definition's life
began), outside its latest pause, longer ago than --grace, and without a row
— no instance ran, skipped or decided them. When every instance is down this
is where they show. An instance that runs the schedule records each when it
next looks (its catch-up policy decides it); then it is no longer listed here
and counts in 'schedules list' as recorded missed. Oldest first.`)
	sinceS := f.String("since", "", "only instants after `T`")
	limit := f.Int("limit", 100, "list at most `N` instants")
	grace := graceFlag(f)
	var since time.Time
	name, pool, s, err := openNamed(ctx, f, args, grace, func() error {
		if *sinceS != "" {
			var err error
			if since, err = parseWhen("since", *sinceS, time.Now()); err != nil {
				return err
			}
		}
		if *limit < 1 {
			return usagef("--limit must be at least 1, got %d", *limit)
		}
		return checkGrace(*grace)
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	instants, more, err := s.Missed(ctx, name, since, *limit)
	if err != nil {
		return schedFail("listing missed instants of "+name, name, err)
	}
	out := missedJSON{Schedule: name, Since: timePtr(since), GraceSeconds: seconds(*grace), Instants: make([]time.Time, 0, len(instants)), More: more}
	for _, t := range instants {
		out.Instants = append(out.Instants, t.UTC())
	}
	if f.json {
		return writeJSON(e.stdout, out)
	}
	if len(out.Instants) == 0 {
		fmt.Fprintf(e.stdout, "no missed instants of %s\n", name)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s of %s due past the grace of %s and recorded by no instance:\n",
		plural(int64(len(out.Instants)), "missed instant", "missed instants"), name, fmtDur(*grace))
	for _, t := range out.Instants {
		fmt.Fprintf(e.stdout, "  %s\n", fmtTime(t))
	}
	if more {
		fmt.Fprintf(e.stdout, "… and more (raise --limit, or --since %s)\n", out.Instants[len(out.Instants)-1].Format(time.RFC3339Nano))
	}
	return nil
}

func runSchedulesRuns(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules runs", "schedules runs NAME [--limit N] [--database-url URL] [--json]", `
Lists the newest runs of the schedule NAME as its ledger holds them, newest
first: instant (a triggered run's is the trigger's time), kind (scheduled,
triggered, backfill), state (pending, running, retrying, succeeded, failed,
skipped), attempts so far, the latest attempt's holder, when it started and
finished, and why it failed, is retrying or was skipped. Runs deleted by
retention are not listed.`)
	limit := f.Int("limit", 20, "list at most `N` runs")
	name, pool, s, err := openNamed(ctx, f, args, nil, func() error {
		if *limit < 1 {
			return usagef("--limit must be at least 1, got %d", *limit)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	runs, err := s.Runs(ctx, name, *limit)
	if err != nil {
		return schedFail("listing runs of "+name, name, err)
	}
	out := make([]runJSON, 0, len(runs))
	for _, r := range runs {
		out = append(out, inspect.RunOf(r))
	}
	if f.json {
		return writeJSON(e.stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintf(e.stdout, "no runs of %s recorded\n", name)
		return nil
	}
	tb := newTable(e.stdout, "INSTANT", "KIND", "STATE", "ATTEMPT", "HOLDER", "STARTED", "FINISHED", "FLAGS", "REASON")
	for _, r := range out {
		var flags []string
		for _, fl := range []struct {
			on   bool
			name string
		}{{r.Missed, "missed"}, {r.Late, "late"}, {r.Overdue, "overdue"}} {
			if fl.on {
				flags = append(flags, fl.name)
			}
		}
		reason := "-"
		if r.Reason != nil {
			reason = truncate(*r.Reason, 80)
		}
		tb.row(fmtTime(r.Instant), r.Kind, r.State, r.Attempt, strOrDash(r.Holder), fmtTimePtr(r.StartedAt), fmtTimePtr(r.FinishedAt),
			orDash(strings.Join(flags, ",")), reason)
	}
	return tb.flush()
}
