package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/inspect"
	"github.com/pgclaim/pgclaim/schedule"
)

func init() {
	register(command{name: "schedules", summary: "stored schedules: list, pause, resume, trigger, backfill, missed, runs", run: runSchedules})
}

const schedulesAbout = `
Operates the schedules of package schedule (tables pgclaim_schedules and
pgclaim_schedule_runs). Every subcommand takes --database-url and --json.

  list                                  each schedule: spec, zone, version, next due, latest outcome, missed, late, overdue, paused
  pause NAME --note TEXT [--by WHO]     stop new runs of NAME on every instance
  resume NAME                           resume NAME on every instance
  trigger NAME                          record a manual run of NAME now (once, however many operators trigger)
  backfill NAME --from T --to T [--max N] [--yes]
                                        record NAME's instants in (from, to] that the ledger lacks, as runs
                                        (a dry run unless --yes; --max at most 10000 without --above-limit)
  cancel-backfill NAME [--by WHO]       record NAME's backfilled runs that have not started as skipped
  missed NAME [--since T] [--limit N]   instants of NAME that were due and that no instance recorded
  runs NAME [--limit N]                 NAME's newest runs: instant, state, attempt, holder, reason

Times (T) are RFC 3339 (2026-03-01T09:00:00Z, 2026-03-01T10:00:00+01:00), a
date and time without zone, read as UTC (2026-03-01 09:00), a date (UTC
midnight), "now", or now minus or plus a duration (now-24h). Output times are
UTC. Run 'pgclaim schedules SUBCOMMAND -h' for a subcommand's flags.`

// schedulesSubs are the subcommands of "pgclaim schedules".
var schedulesSubs = map[string]func(ctx context.Context, e *env, args []string) error{
	"list":            runSchedulesList,
	"pause":           runSchedulesPause,
	"resume":          runSchedulesResume,
	"trigger":         runSchedulesTrigger,
	"backfill":        runSchedulesBackfill,
	"cancel-backfill": runSchedulesCancelBackfill,
	"missed":          runSchedulesMissed,
	"runs":            runSchedulesRuns,
}

func runSchedules(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("a subcommand is required: list, pause, resume, trigger, backfill, cancel-backfill, missed or runs")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(e.stdout, "Usage: pgclaim schedules SUBCOMMAND [flags]\n\n%s\n", strings.TrimSpace(schedulesAbout))
		return flag.ErrHelp
	}
	sub, ok := schedulesSubs[args[0]]
	if !ok {
		return usagef("unknown subcommand %q: want list, pause, resume, trigger, backfill, cancel-backfill, missed or runs", args[0])
	}
	return sub(ctx, e, args[1:])
}

// The JSON shape of a schedule's status (list, pause, resume) is package
// inspect's.
type (
	scheduleJSON = inspect.Schedule
	lastRunJSON  = inspect.LastRun
	runJSON      = inspect.Run
)

type triggerJSON struct {
	Schedule string    `json:"schedule"`
	Instant  time.Time `json:"instant"`
	Created  bool      `json:"created"` // false: a triggered run was already open; this is it
}

type backfillJSON struct {
	Schedule    string      `json:"schedule"`
	From        time.Time   `json:"from"`
	To          time.Time   `json:"to"`
	Until       time.Time   `json:"until"`   // the effective end: to, or the schedule's frontier
	Clamped     bool        `json:"clamped"` // to was after the frontier
	Cut         int         `json:"cut"`     // instants in (until, to] not backfilled: the scheduler's
	CutMore     bool        `json:"cut_more"`
	DryRun      bool        `json:"dry_run"`
	Instants    []time.Time `json:"instants"` // recorded, or in a dry run would be, oldest first
	Present     int         `json:"present"`  // already in the ledger
	Taken       int         `json:"taken"`    // recorded meanwhile by another backfill
	LeftOut     int         `json:"left_out"` // lacking beyond --max
	LeftOutMore bool        `json:"left_out_more"`
	Paused      bool        `json:"paused"`
}

type missedJSON struct {
	Schedule     string      `json:"schedule"`
	Since        *time.Time  `json:"since"`
	GraceSeconds float64     `json:"grace_seconds"`
	Instants     []time.Time `json:"instants"`
	More         bool        `json:"more"`
}

// openScheduler connects, checks the schedule tables and returns a
// Scheduler that runs nothing.
func openScheduler(ctx context.Context, f *flags, grace time.Duration) (*pgxpool.Pool, *schedule.Scheduler, error) {
	pool, err := f.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := requireSchema(ctx, pool, "pgclaim_schedules", "pgclaim_schedule_runs"); err != nil {
		pool.Close()
		return nil, nil, err
	}
	s, err := schedule.New(pool, schedule.Config{Holder: "pgclaim-cli", Logger: slog.New(slog.DiscardHandler), Grace: grace})
	if err != nil {
		pool.Close()
		return nil, nil, &failure{msg: err.Error(), err: err}
	}
	return pool, s, nil
}

// openNamed parses args (one positional argument: the schedule's name),
// runs check (if not nil) on the parsed flags, and opens a Scheduler with
// the grace *grace (nil: the default). The caller closes the pool.
func openNamed(ctx context.Context, f *flags, args []string, grace *time.Duration, check func() error) (string, *pgxpool.Pool, *schedule.Scheduler, error) {
	pos, err := f.parse(args)
	if err != nil {
		return "", nil, nil, err
	}
	name, err := scheduleName(pos)
	if err != nil {
		return "", nil, nil, err
	}
	if check != nil {
		if err := check(); err != nil {
			return "", nil, nil, err
		}
	}
	var g time.Duration
	if grace != nil {
		g = *grace
	}
	pool, s, err := openScheduler(ctx, f, g)
	return name, pool, s, err
}

// schedFail explains an error of package schedule about the schedule name.
func schedFail(what, name string, err error) error {
	switch {
	case errors.Is(err, schedule.ErrNotFound):
		return &failure{msg: fmt.Sprintf("no schedule named %q", name), hint: "see 'pgclaim schedules list' for the stored schedules", err: err}
	case errors.Is(err, schedule.ErrInvalid):
		return &failure{msg: err.Error(), err: err}
	}
	return dbFail(what, err)
}

// scheduleName returns the one positional argument, the schedule's name.
func scheduleName(pos []string) (string, error) {
	switch {
	case len(pos) == 0 || pos[0] == "":
		return "", usagef("the schedule's NAME is required")
	case len(pos) > 1:
		return "", usagef("unexpected argument %q", pos[1])
	}
	return pos[0], nil
}

// parseWhen parses a time flag's value (see schedulesAbout); now is the
// host's clock.
func parseWhen(flagName, s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "now"); ok {
		if rest == "" {
			return now, nil
		}
		if d, err := time.ParseDuration(strings.TrimPrefix(rest, "+")); err == nil && (rest[0] == '-' || rest[0] == '+') {
			return now.Add(d), nil
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999", "2006-01-02T15:04", "2006-01-02 15:04", time.DateOnly} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usagef("--%s: %q is not a time: want RFC 3339 (2026-03-01T09:00:00Z), a UTC date and time (2026-03-01 09:00), a date (2026-03-01), now, or now-DURATION (now-24h)", flagName, s)
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func toScheduleJSON(st schedule.Status) scheduleJSON { return inspect.ScheduleOf(st) }

// graceFlag adds --grace, the grace the service's schedulers use.
func graceFlag(f *flags) *time.Duration {
	return f.Duration("grace", 30*time.Second, "an instant due longer ago than `DURATION` without a row is missed: the schedulers' Config.Grace")
}

func checkGrace(g time.Duration) error {
	if g <= 0 {
		return usagef("--grace must be positive, got %v", g)
	}
	return nil
}

const schedulesListAbout = `
Lists every stored schedule: its spec, time zone and definition version, the
instant it comes due next (computed from the stored definition in the
database's time), its latest outcome (the newest run no longer pending: its
instant, state and attempts), its missed instants (rows recorded missed, plus
instants due longer ago than --grace that no instance recorded; shown "N+"
when the count stopped at 1000), its open runs, the newest instant whose run retention (or Prune) deleted
("DELETED TO"; instants up to it are never run again), how long its finished runs are
kept ("KEPT", as the last retention pass of a running scheduler applied it; "-" before one
ran), and its pause (note,
by whom, since when).`

func runSchedulesList(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules list", "schedules list [--grace DURATION] [--database-url URL] [--json]", schedulesListAbout)
	grace := graceFlag(f)
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if err := checkGrace(*grace); err != nil {
		return err
	}
	pool, s, err := openScheduler(ctx, f, *grace)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := s.List(ctx)
	if err != nil {
		return dbFail("listing schedules", err)
	}
	out := make([]scheduleJSON, 0, len(all))
	for _, st := range all {
		out = append(out, toScheduleJSON(st))
	}
	if f.json {
		return writeJSON(e.stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintln(e.stdout, "no schedules stored")
		return nil
	}
	tb := newTable(e.stdout, "NAME", "SPEC", "ZONE", "VERSION", "NEXT DUE", "LAST RUN", "STATE", "ATTEMPT", "MISSED", "LATE", "OVERDUE", "OPEN", "DELETED TO", "KEPT", "PAUSED")
	for _, st := range out {
		last, state, attempt := "-", "-", "-"
		if l := st.Last; l != nil {
			last, state, attempt = fmtTime(l.Instant), l.State, fmt.Sprint(l.Attempt)
			if l.Kind != "scheduled" {
				last += " (" + l.Kind + ")"
			}
		}
		missed := fmt.Sprint(st.Missed)
		if st.MissedMore {
			missed += "+"
		}
		tb.row(st.Name, st.Spec, st.TimeZone, st.Version, fmtTimePtr(st.NextDue), last, state, attempt, missed, st.Late, st.Overdue, st.OpenRuns, fmtTimePtr(st.PrunedUntil), orDash(inspect.RetentionText(st.Retention)), pausedCell(st))
	}
	return tb.flush()
}

func pausedCell(st scheduleJSON) string {
	if !st.Paused {
		return "-"
	}
	s := "since " + fmtTimePtr(st.PausedAt)
	if st.PausedBy != nil {
		s += " by " + *st.PausedBy
	}
	if st.PausedNote != nil {
		s += ": " + truncate(*st.PausedNote, 60)
	}
	return s
}

func runSchedulesPause(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules pause", "schedules pause NAME --note TEXT [--by WHO] [--database-url URL] [--json]", `
Pauses the schedule NAME: no new run of it starts on any instance (a run
already running finishes); instants that come due meanwhile are decided at
resume by its catch-up policy. The note and who paused are stored with the
time. Pausing a paused schedule replaces its note and keeps its pause time.`)
	note := f.String("note", "", "why the schedule is paused (`TEXT`, required)")
	by := f.String("by", "", "who pauses it (`WHO`; default: $USER)")
	name, pool, s, err := openNamed(ctx, f, args, nil, func() error { return require("note", strings.TrimSpace(*note)) })
	if err != nil {
		return err
	}
	defer pool.Close()
	if *by == "" {
		*by = e.getenv("USER")
	}
	if err := s.Pause(ctx, name, *note, *by); err != nil {
		return schedFail("pausing "+name, name, err)
	}
	st, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	if f.json {
		return writeJSON(e.stdout, toScheduleJSON(st))
	}
	fmt.Fprintf(e.stdout, "paused %s %s\n", name, pausedCell(toScheduleJSON(st)))
	return nil
}

func runSchedulesResume(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules resume", "schedules resume NAME [--database-url URL] [--json]", `
Resumes the paused schedule NAME on every instance. The instants that came
due while it was paused are decided by its catch-up policy. Resuming a
schedule that is not paused changes nothing.`)
	name, pool, s, err := openNamed(ctx, f, args, nil, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	if err := s.Resume(ctx, name); err != nil {
		return schedFail("resuming "+name, name, err)
	}
	st, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	if f.json {
		return writeJSON(e.stdout, toScheduleJSON(st))
	}
	if !before.Paused {
		fmt.Fprintf(e.stdout, "%s was not paused: nothing changed\n", name)
		return nil
	}
	fmt.Fprintf(e.stdout, "resumed %s (paused since %s); next due %s\n", name, fmtTime(before.PausedAt), fmtTime(st.NextDue))
	return nil
}

func runSchedulesTrigger(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules trigger", "schedules trigger NAME [--database-url URL] [--json]", `
Records a run of kind triggered of the schedule NAME at the database's time,
which an instance running the schedule runs once. While a triggered run of
NAME is still open, that one is reported instead ("already open") and none is
added: two operators triggering together get one run. A triggered run waits
while the schedule is paused.`)
	name, pool, s, err := openNamed(ctx, f, args, nil, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	at, created, err := s.Trigger(ctx, name)
	if err != nil {
		return schedFail("triggering "+name, name, err)
	}
	if f.json {
		return writeJSON(e.stdout, triggerJSON{Schedule: name, Instant: at.UTC(), Created: created})
	}
	if created {
		fmt.Fprintf(e.stdout, "triggered %s: run %s created\n", name, fmtTime(at))
	} else {
		fmt.Fprintf(e.stdout, "%s: triggered run %s already open: not triggered again\n", name, fmtTime(at))
	}
	return nil
}

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
