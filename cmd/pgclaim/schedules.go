package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status/inspect"
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
