package main

// pgclaim schedules backfill and cancel-backfill.

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

func runSchedulesBackfill(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules backfill", "schedules backfill NAME --from T --to T [--max N] [--yes] [--database-url URL] [--json]", `
Records the instants of the schedule NAME's stored spec in (--from, --to]
that the ledger lacks as pending runs of kind backfill: an instance running
the schedule runs each once, oldest first, with its retry policy. Each
instant is recorded once even when two backfills overlap; an instant already
in the ledger (run, skipped, triggered or backfilled) is left as it is. At
most --max instants, the oldest; the others are counted. --max is at most
10000 unless --above-limit is given: each instant recorded is a run the
schedule's live instants queue behind ('pgclaim schedules cancel-backfill'
undoes a backfill that has not run yet). The range is cut
back to the schedule's frontier, the newest instant its scheduler has
recorded: the later ones are the scheduler's, which decides missed ones by
the catch-up policy.

Without --yes this is a dry run: it shows what it would record and changes
nothing.`)
	fromS := f.String("from", "", "the range's start `T`, exclusive (required)")
	toS := f.String("to", "", "the range's end `T`, inclusive (required)")
	maxN := f.Int("max", 100, "record at most `N` instants, the oldest")
	yes := f.Bool("yes", false, "record them (without it: a dry run)")
	above := f.Bool("above-limit", false, fmt.Sprintf("allow --max above %d", schedule.BackfillLimit))
	var from, to time.Time
	name, pool, s, err := openNamed(ctx, f, args, nil, func() error {
		for _, fl := range []string{"from", "to"} {
			if err := require(fl, f.Lookup(fl).Value.String()); err != nil {
				return err
			}
		}
		now := time.Now()
		var err error
		if from, err = parseWhen("from", *fromS, now); err != nil {
			return err
		}
		if to, err = parseWhen("to", *toS, now); err != nil {
			return err
		}
		if !from.Before(to) {
			return usagef("--from must be before --to, got --from %s --to %s", fmtTime(from), fmtTime(to))
		}
		if *maxN < 1 {
			return usagef("--max must be at least 1, got %d", *maxN)
		}
		if *maxN > schedule.BackfillLimit && !*above {
			return usagef("--max %d is above the limit of %d: backfill in steps, or add --above-limit", *maxN, schedule.BackfillLimit)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	res, err := s.Backfill(ctx, name, schedule.BackfillOptions{From: from, To: to, Max: *maxN, DryRun: !*yes, AboveLimit: *above})
	if err != nil {
		return schedFail("backfilling "+name, name, err)
	}
	out := backfillJSON{
		Schedule: name, From: from.UTC(), To: to.UTC(), Until: res.Until.UTC(), Clamped: res.Clamped, Cut: res.Cut, CutMore: res.CutMore, DryRun: !*yes,
		Instants: make([]time.Time, 0, len(res.Instants)), Present: res.Present, Taken: res.Taken,
		LeftOut: res.LeftOut, LeftOutMore: res.LeftOutMore, Paused: st.Paused,
	}
	for _, t := range res.Instants {
		out.Instants = append(out.Instants, t.UTC())
	}
	if f.json {
		return writeJSON(e.stdout, out)
	}
	return printBackfill(e.stdout, out)
}

type cancelBackfillJSON struct {
	Schedule  string     `json:"schedule"`
	Cancelled int        `json:"cancelled"`
	First     *time.Time `json:"first"`
	Last      *time.Time `json:"last"`
}

func runSchedulesCancelBackfill(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules cancel-backfill", "schedules cancel-backfill NAME [--by WHO] [--database-url URL] [--json]", `
Cancels the backfill of the schedule NAME: its backfilled runs that have not
started (pending) are recorded skipped, with the reason "backfill cancelled
by WHO"; a later backfill of the same range leaves them alone. Backfilled
runs already running or retrying finish as any run.`)
	by := f.String("by", "", "who cancels it (`WHO`; default: $USER)")
	name, pool, s, err := openNamed(ctx, f, args, nil, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *by == "" {
		*by = e.getenv("USER")
	}
	res, err := s.CancelBackfill(ctx, name, *by)
	if err != nil {
		return schedFail("cancelling the backfill of "+name, name, err)
	}
	if f.json {
		out := cancelBackfillJSON{Schedule: name, Cancelled: res.Cancelled}
		if res.Cancelled > 0 {
			first, last := res.First.UTC(), res.Last.UTC()
			out.First, out.Last = &first, &last
		}
		return writeJSON(e.stdout, out)
	}
	if res.Cancelled == 0 {
		fmt.Fprintf(e.stdout, "%s has no backfilled run waiting: nothing cancelled\n", name)
		return nil
	}
	fmt.Fprintf(e.stdout, "cancelled %s of %s (%s to %s): recorded skipped\n", plural(int64(res.Cancelled), "backfilled run", "backfilled runs"), name, fmtTime(res.First), fmtTime(res.Last))
	return nil
}

func printBackfill(w io.Writer, out backfillJSON) error {
	n := int64(len(out.Instants))
	rng := fmt.Sprintf("(%s, %s]", fmtTime(out.From), fmtTime(out.Until))
	if out.DryRun {
		fmt.Fprintf(w, "dry run: would record %s of %s in %s as backfill runs\n", plural(n, "instant", "instants"), out.Schedule, rng)
	} else {
		fmt.Fprintf(w, "recorded %s of %s in %s as backfill runs\n", plural(n, "instant", "instants"), out.Schedule, rng)
	}
	for _, t := range out.Instants {
		fmt.Fprintf(w, "  %s\n", fmtTime(t))
	}
	if out.Present > 0 {
		fmt.Fprintf(w, "%s already in the ledger: left as they are\n", plural(int64(out.Present), "instant", "instants"))
	}
	if out.Taken > 0 {
		fmt.Fprintf(w, "%s recorded meanwhile by another backfill\n", plural(int64(out.Taken), "instant", "instants"))
	}
	if out.LeftOut > 0 {
		more := ""
		if out.LeftOutMore {
			more = " (at least)"
		}
		fmt.Fprintf(w, "%s%s more lacking beyond --max: backfill again to record them\n", plural(int64(out.LeftOut), "instant", "instants"), more)
	}
	if out.Clamped {
		more := ""
		if out.CutMore {
			more = " (at least)"
		}
		fmt.Fprintf(w, "%s%s in (%s, %s] are the scheduler's (it records them as they come due; catch-up decides missed ones): not backfilled\n",
			plural(int64(out.Cut), "instant", "instants"), more, fmtTime(out.Until), fmtTime(out.To))
	}
	switch {
	case out.DryRun && n > 0:
		fmt.Fprintln(w, "nothing recorded: pass --yes to record them")
	case !out.DryRun && n > 0 && out.Paused:
		fmt.Fprintf(w, "%s is paused: the runs wait for 'pgclaim schedules resume %s'\n", out.Schedule, out.Schedule)
	case !out.DryRun && n > 0:
		fmt.Fprintln(w, "an instance running the schedule runs each once, oldest first")
	}
	return nil
}
