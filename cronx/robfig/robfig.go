package robfig

import (
	"context"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/internal/tick"
	"github.com/pgclaim/pgclaim/gate"
)

// ErrNoInstant means a job was started with no instant of its schedule
// within Config.MaxDelay before the instance's clock: it started too late,
// or the cron runs it on a schedule other than the one given to NewJob or
// Wrap.
var ErrNoInstant = tick.ErrNoInstant

// Config configures a Job. The zero value is ready to use.
type Config struct {
	// Context is the parent of every run's context: cancel it at shutdown
	// to cancel the runs in progress (cron.Cron.Stop only stops firing).
	// Default: context.Background().
	Context context.Context

	// Location is the location the cron reads the schedule in: the one
	// given to cron.WithLocation, which c.Location() returns (time.Local for
	// a cron made without it). robfig/cron reads a spec without a CRON_TZ=
	// (or TZ=) prefix in the cron's location, so the same spec names other
	// instants in another location; the job reads it the same way to find
	// the instant it was fired for, and never the host's time.Local unless
	// given it here.
	//
	// Required when the schedule is such a spec (a *cron.SpecSchedule
	// without a location of its own): NewJob and Wrap refuse it without
	// Location. A spec with CRON_TZ= names its instants itself and ignores
	// Location. Another cron.Schedule is given times in Location (default
	// UTC): set it when its Next depends on the location of its argument.
	//
	// time.Local is the host's zone: pass it only when every instance runs
	// in the same zone, or instances in different zones fire and claim
	// different instants, and the job runs once for each.
	Location *time.Location

	// MaxDelay is how late after its scheduled instant a run may start and
	// still count for it. Default: the gate's skew tolerance
	// (gate.Gate.SkewTolerance), since a run that starts later than that
	// after its instant is refused by the gate anyway. Negative is an
	// error.
	MaxDelay time.Duration

	// Logger receives what Run cannot return. At error level: a failed
	// job, a lost lock, a clock outside the gate's skew tolerance, an
	// unreachable database, and ErrNoInstant (the job fired with no
	// instant to run for: it will not run until its schedule, Location or
	// clock is fixed). At warn level: a tick skipped because a run still
	// holds the job's lock (gate.ErrHeld: an earlier tick's run lasting
	// longer than the period, or an Exclusive run). A tick another
	// instance ran is the normal outcome, logged at debug level. The gate
	// reports skips to its own Logger and Hooks as well. Default:
	// slog.Default(); silence it with a discarding logger
	// (slog.New(slog.DiscardHandler)).
	Logger *slog.Logger

	// now reads the instance's clock; tests set it to simulate skew.
	now func() time.Time
}

// Job is a cron.Job that runs a gate.Func once per scheduled instant across
// all instances. Schedule it with the same schedule it was built with, on
// a cron whose location is Config.Location:
//
//	c.Schedule(sched, job)
type Job struct {
	g        *gate.Gate
	name     string
	sched    cron.Schedule // read in Config.Location
	fn       gate.Func
	ctx      context.Context
	maxDelay time.Duration
	log      *slog.Logger
	now      func() time.Time
}

// NewJob returns a Job running fn for the job called name, whose instants
// are those of sched, through g. fn's gate.Run carries the instant
// (Run.FireAt) and the run's fencing token (Run.Fence).
func NewJob(g *gate.Gate, name string, sched cron.Schedule, fn gate.Func, cfg Config) (*Job, error) {
	if g == nil {
		return nil, tick.Invalid("robfig", "g", "must not be nil")
	}
	if fn == nil {
		return nil, tick.Invalid("robfig", "fn", "must not be nil")
	}
	now := cfg.now
	if now == nil {
		now = time.Now
	}
	maxDelay, err := tick.Check("robfig", name, sched, cfg.MaxDelay, g.SkewTolerance(), now())
	if err != nil {
		return nil, err
	}
	loc := cfg.Location
	if loc == nil {
		if s, ok := sched.(*cron.SpecSchedule); ok && s.Location == time.Local {
			return nil, tick.Invalid("robfig", "Location", "must be set for a spec without CRON_TZ: "+
				"robfig/cron reads it in the cron's location, so pass that (the one given to cron.WithLocation, "+
				"or time.Local for a cron without it, when every instance runs in the same zone), "+
				"or prefix the spec with CRON_TZ=")
		}
		loc = time.UTC
	}
	sched = tick.InLocation(sched, loc)
	ctx := cfg.Context
	if ctx == nil {
		ctx = context.Background()
	}
	return &Job{g: g, name: name, sched: sched, fn: fn, ctx: ctx, maxDelay: maxDelay, log: tick.Logger(cfg.Logger), now: now}, nil
}

// Wrap returns a cron.JobWrapper running the job it wraps through g, as the
// job called name with the instants of sched (see NewJob). Use one wrapper
// per job: every job it wraps shares name, and so its ticks.
//
// The wrapped cron.Job sees neither a context nor the run's fencing token;
// when it should stop on a lost lock or use the fencing token, use NewJob.
func Wrap(g *gate.Gate, name string, sched cron.Schedule, cfg Config) (cron.JobWrapper, error) {
	noop := func(context.Context, gate.Run) error { return nil }
	base, err := NewJob(g, name, sched, noop, cfg)
	if err != nil {
		return nil, err
	}
	return func(inner cron.Job) cron.Job {
		j := *base
		j.fn = func(context.Context, gate.Run) error {
			inner.Run()
			return nil
		}
		return &j
	}, nil
}

// Name returns the job's name, its key in the tick ledger.
func (j *Job) Name() string { return j.name }

// Run implements cron.Job: it runs the job for the instant the cron fired
// for, unless another instance has claimed that instant. What it cannot
// return goes to Config.Logger (see there).
func (j *Job) Run() {
	tick.Report(j.ctx, j.log, "robfig", j.name, j.fire(j.ctx))
}

// fire runs the job for the instant the clock says it was fired for.
func (j *Job) fire(ctx context.Context) error {
	return tick.Fire(ctx, j.g, j.name, j.sched, j.now(), j.maxDelay, j.fn)
}

// RunAt runs the job for instant as if the cron had fired it for that
// instant, without waiting for the clock to reach it: a test fires the
// 09:00 job for the instant it chooses. The run goes through the gate
// exactly as a fired one (gate.Gate.Once): it runs unless some instance
// has run that tick, holds the job's lock, is recorded in the tick ledger,
// and its context is ctx. It logs nothing: the caller has the error.
//
// instant must be an instant of the schedule (read in Config.Location),
// or RunAt returns an error wrapping gate.ErrInvalid. The gate refuses an
// instant further from database time than its skew tolerance
// (gate.ErrClockSkew): a test firing an instant far from now builds its
// gate with a gate.Config.SkewTolerance that covers it. RunAt returns what
// gate.Gate.Once returns, an error wrapping gate.ErrSkipped when the tick
// has run already.
func (j *Job) RunAt(ctx context.Context, instant time.Time) error {
	return tick.RunAt(ctx, "robfig", j.g, j.name, j.sched, instant, j.fn)
}

// CatchUp runs the job for the latest instant within window before database
// time that no instance has run (see gate.Gate.CatchUp), once across all
// instances. Call it at start-up, before or after starting the cron. It
// returns an error wrapping gate.ErrSkipped when there is nothing to catch
// up or another instance did it.
func (j *Job) CatchUp(ctx context.Context, window time.Duration) error {
	return j.g.CatchUp(ctx, j.name, j.sched, window, j.fn)
}
