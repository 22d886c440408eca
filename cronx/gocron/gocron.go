package gocron

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	gocronv2 "github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/cronx/internal/tick"
	"github.com/pgclaim/pgclaim/gate"
)

// ErrNotLeader is what Elector.IsLeader returns on an instance that does not
// lead: gocron then skips the job there.
var ErrNotLeader = errors.New("gocron: not the leader")

// ErrNoInstant means a job started with no instant of its schedule within
// TaskConfig.MaxDelay before the instance's clock: it started too late, or
// gocron runs it on a schedule other than the one given to NewTask.
var ErrNoInstant = tick.ErrNoInstant

// Locker is a gocron.Locker whose locks are gate lease locks named after the
// job (the key gocron passes), with database-time expiry, keep-alive while
// the job runs, and a fencing token per acquisition.
//
// Unlock keeps the lease held until LeaseConfig.AtLeast after it was
// taken. That is what stops a fast job from running twice: gocron fires the
// same job on every instance when each one's clock reaches the instant, so
// an instance whose clock is late by d fires d after the others; if the
// winner had already unlocked, the late instance would take the lock and
// run the job again. With AtLeast > d it finds the lock still held and
// skips. So AtLeast must exceed the largest clock offset (plus firing delay)
// between instances, and stay below the job's interval minus that offset,
// or the next run finds the previous one's lease.
//
// Those bounds are the difference from NewTask, which keys the tick ledger
// by the scheduled instant and so tolerates any offset below the gate's
// skew tolerance, and never mistakes one tick for the next.
//
// A job that runs longer than LeaseConfig.AtMost keeps its lease through
// the automatic keep-alive; if the lease is lost nonetheless (the database
// was unreachable for AtMost), gocron's job is not told: the Locker cannot
// reach it. Jobs that must stop when exclusion is lost belong in NewTask.
type Locker struct {
	pool *pgxpool.Pool
	cfg  gate.LeaseConfig

	mu     sync.Mutex
	leases map[string]*gate.Lease
}

// NewLocker returns a Locker taking lease locks through pool with cfg.
// cfg.AtMost and cfg.AtLeast are required (see Locker for choosing
// AtLeast).
func NewLocker(pool *pgxpool.Pool, cfg gate.LeaseConfig) (*Locker, error) {
	if pool == nil {
		return nil, tick.Invalid("gocron", "pool", "must not be nil")
	}
	// Let the gate check the options, with a placeholder name.
	if _, err := gate.NewLease(pool, "gocron", cfg); err != nil {
		return nil, err
	}
	if cfg.AtLeast == 0 {
		return nil, tick.Invalid("gocron", "LeaseConfig.AtLeast", "must be set: "+
			"without it a fast job unlocks before an instance whose clock is late fires, and runs twice")
	}
	return &Locker{pool: pool, cfg: cfg, leases: map[string]*gate.Lease{}}, nil
}

// Lock takes the lease named key without waiting. It returns an error
// wrapping gate.ErrHeld when another instance holds it (gocron then skips
// the run).
func (l *Locker) Lock(ctx context.Context, key string) (gocronv2.Lock, error) {
	lease, err := l.lease(key)
	if err != nil {
		return nil, err
	}
	h, err := lease.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	return lock{h}, nil
}

// lease returns the Lease named key, made once per key.
func (l *Locker) lease(key string) (*gate.Lease, error) {
	if key == "" {
		return nil, tick.Invalid("gocron", "key", "must not be empty (name the job with gocron.WithName)")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lease, ok := l.leases[key]; ok {
		return lease, nil
	}
	lease, err := gate.NewLease(l.pool, key, l.cfg)
	if err != nil {
		return nil, err
	}
	l.leases[key] = lease
	return lease, nil
}

// lock is one held lease.
type lock struct{ h *gate.LeaseHandle }

// unlockTimeout bounds Unlock.
const unlockTimeout = 5 * time.Second

// Unlock releases the lease, which stays held until AtLeast after it was
// taken. It returns an error wrapping gate.ErrLockLost when the lease had
// been lost.
//
// gocron unlocks with the job's context, which is already cancelled when
// the scheduler shuts down while the job runs; the release goes ahead
// regardless (for up to five seconds), or the lease would stay held until
// AtMost.
func (k lock) Unlock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	return k.h.Release(ctx)
}

// Elector is a gocron.Elector backed by a gate.Elector: jobs run on the
// leading instance only. Run must be running (on every instance) for the
// instance to campaign.
//
// Leadership says who runs now, not which ticks ran: when leadership moves
// between the instants an old and a new leader fire the same tick (their
// clocks differ), that tick can run on both, or on neither. Jobs that need
// once per tick across a failover belong in NewTask.
type Elector struct {
	e *gate.Elector
}

// NewElector returns an Elector campaigning through e.
func NewElector(e *gate.Elector) (*Elector, error) {
	if e == nil {
		return nil, tick.Invalid("gocron", "e", "must not be nil")
	}
	return &Elector{e: e}, nil
}

// IsLeader returns nil when this instance leads, and an error wrapping
// ErrNotLeader otherwise.
func (e *Elector) IsLeader(context.Context) error {
	if e.e.IsLeader() {
		return nil
	}
	return fmt.Errorf("%w: election %q", ErrNotLeader, e.e.Name())
}

// Run campaigns until ctx ends: it waits for leadership, holds it while it
// lasts, and campaigns again when it is lost. When ctx ends it gives up
// leadership, so a standby takes over at once, and returns ctx's error.
// Call it in a goroutine next to the scheduler.
func (e *Elector) Run(ctx context.Context) error {
	return e.e.Run(ctx, func(lead context.Context, _ gate.Run) error {
		<-lead.Done()
		return nil
	})
}

// TaskConfig configures NewTask and NewJob. The zero value is ready to use.
type TaskConfig struct {
	// Context is the parent of every run's context, as in robfig.Config:
	// its values reach the job, and cancelling it (at shutdown) cancels
	// the runs in progress. A run's context is also cancelled when the one
	// gocron hands the task is (the job removed, the scheduler shut down).
	// Default: context.Background().
	Context context.Context

	// Logger receives what the task reports besides returning it to
	// gocron (whose job listeners and logger are optional). At error
	// level: a failed job, a lost lock, a clock outside the gate's skew
	// tolerance, an unreachable database, and ErrNoInstant (the task fired
	// with no instant to run for: it will not run until its schedule or
	// clock is fixed). At warn level: a tick skipped because a run still
	// holds the job's lock (gate.ErrHeld: an earlier tick's run lasting
	// longer than the period, or an Exclusive run). A tick another
	// instance ran is the normal outcome, logged at debug level. Default:
	// slog.Default(); silence it with a discarding logger
	// (slog.New(slog.DiscardHandler)).
	Logger *slog.Logger

	// Location is the location sched.Next is given times in. A schedule
	// from CronSchedule carries the scheduler's location and ignores it;
	// set it for a schedule of your own whose Next depends on the location
	// of its argument, to the scheduler's (gocron.WithLocation). Default:
	// UTC, never the host's time.Local.
	Location *time.Location

	// MaxDelay is how late after its scheduled instant a run may start and
	// still count for it. Default: the gate's skew tolerance
	// (gate.Gate.SkewTolerance), since a run that starts later than that
	// after its instant is refused by the gate anyway. Negative is an
	// error.
	MaxDelay time.Duration

	// now reads the instance's clock; tests set it to simulate skew.
	now func() time.Time
}

// NewTask returns a gocron.Task running fn for the job called name, once per
// instant of sched across all instances, through g (gate.Gate.Once). When
// gocron starts the task, it works out the instant the job fired for — the
// last instant of sched at or before the instance's clock — and the first
// instance to record it in the tick ledger runs fn; the others skip.
//
// sched must be the schedule gocron runs the job on: for
// gocron.CronJob(crontab, withSeconds) use CronSchedule with the same
// arguments and the scheduler's location (gocron.WithLocation). It must be
// a calendar (instants fixed in time); gocron.DurationJob intervals count
// from each instance's start and have no instants instances agree on — use
// the Locker for them.
//
// The task returns nil when the tick was skipped, and otherwise what
// gate.Gate.Once returns (fn's error, gate.ErrClockSkew, gate.ErrLockLost,
// ErrNoInstant …), which gocron hands to the job's AfterJobRunsWithError
// listener; it also logs them to TaskConfig.Logger (see there). Leave the
// job out of a scheduler-wide Locker
// (gocron.WithDisabledDistributedJobLocker): the ledger and the advisory
// lock already decide.
func NewTask(g *gate.Gate, name string, sched gate.Schedule, fn gate.Func, cfg TaskConfig) (gocronv2.Task, error) {
	j, err := NewJob(g, name, sched, fn, cfg)
	if err != nil {
		return nil, err
	}
	return j.Task(), nil
}

// Job is a job run through the tick ledger: what NewTask builds, with the
// methods a test or a start-up needs besides the gocron.Task.
type Job struct {
	g        *gate.Gate
	name     string
	sched    gate.Schedule // read in TaskConfig.Location
	fn       gate.Func
	parent   context.Context
	maxDelay time.Duration
	log      *slog.Logger
	now      func() time.Time
}

// NewJob returns the Job NewTask makes a gocron.Task of (see NewTask for
// the arguments): schedule Task with gocron, and fire it for a chosen
// instant with RunAt.
func NewJob(g *gate.Gate, name string, sched gate.Schedule, fn gate.Func, cfg TaskConfig) (*Job, error) {
	if g == nil {
		return nil, tick.Invalid("gocron", "g", "must not be nil")
	}
	if fn == nil {
		return nil, tick.Invalid("gocron", "fn", "must not be nil")
	}
	now := cfg.now
	if now == nil {
		now = time.Now
	}
	maxDelay, err := tick.Check("gocron", name, sched, cfg.MaxDelay, g.SkewTolerance(), now())
	if err != nil {
		return nil, err
	}
	loc := cfg.Location
	if loc == nil {
		loc = time.UTC
	}
	return &Job{g: g, name: name, sched: tick.InLocation(sched, loc), fn: fn, parent: cfg.Context,
		maxDelay: maxDelay, log: tick.Logger(cfg.Logger), now: now}, nil
}

// Name returns the job's name, its key in the tick ledger.
func (j *Job) Name() string { return j.name }

// Task returns the gocron.Task that runs the job when gocron fires it (see
// NewTask). Give it to the scheduler with the job's schedule:
//
//	s.NewJob(gocron.CronJob(crontab, withSeconds), job.Task())
func (j *Job) Task() gocronv2.Task { return gocronv2.NewTask(j.run) }

// run is the task's function: it runs the job for the instant gocron fired
// it for, logs what it reports, and returns it but a skip.
func (j *Job) run(ctx context.Context) error {
	if j.parent != nil {
		// Runs get parent's values and end with either context.
		run, cancel := context.WithCancelCause(j.parent)
		defer cancel(nil)
		defer context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })()
		ctx = run
	}
	err := j.fire(ctx)
	tick.Report(ctx, j.log, "gocron", j.name, err)
	if errors.Is(err, gate.ErrSkipped) {
		return nil
	}
	return err
}

// fire runs the job for the last instant of its schedule at or before the
// instance's clock.
func (j *Job) fire(ctx context.Context) error {
	return tick.Fire(ctx, j.g, j.name, j.sched, j.now(), j.maxDelay, j.fn)
}

// RunAt runs the job for instant as if gocron had fired it for that
// instant, without waiting for the clock to reach it: a test fires the
// 09:00 job for the instant it chooses. The run goes through the gate
// exactly as a fired one (gate.Gate.Once): it runs unless some instance
// has run that tick, holds the job's lock, is recorded in the tick ledger,
// and its context is ctx. It logs nothing: the caller has the error.
//
// instant must be an instant of the schedule (read in its location), or
// RunAt returns an error wrapping gate.ErrInvalid. The gate refuses an
// instant further from database time than its skew tolerance
// (gate.ErrClockSkew): a test firing an instant far from now builds its
// gate with a gate.Config.SkewTolerance that covers it. RunAt returns what
// gate.Gate.Once returns, an error wrapping gate.ErrSkipped when the tick
// has run already.
func (j *Job) RunAt(ctx context.Context, instant time.Time) error {
	return tick.RunAt(ctx, "gocron", j.g, j.name, j.sched, instant, j.fn)
}

// taskFunc returns the function NewTask hands to gocron.
func taskFunc(g *gate.Gate, name string, sched gate.Schedule, fn gate.Func, cfg TaskConfig) (func(context.Context) error, error) {
	j, err := NewJob(g, name, sched, fn, cfg)
	if err != nil {
		return nil, err
	}
	return j.run, nil
}

// CronSchedule returns the schedule gocron.CronJob(crontab, withSeconds)
// follows in a scheduler whose location is loc, parsed the way gocron
// parses it. A "TZ=" or "CRON_TZ=" prefix in crontab overrides loc, as in
// gocron.
//
// loc must be the scheduler's location: the one given to
// gocron.WithLocation, or time.Local for a scheduler without it. gocron
// reads a crontab without a prefix in that location, so the same crontab
// names other instants in another one, and a task reading it elsewhere
// finds no instant to run (ErrNoInstant). loc may be nil only when crontab
// has the prefix; otherwise CronSchedule refuses it rather than guess the
// host's zone. Pass time.Local only when every instance runs in the same
// zone, or instances in different zones fire and claim different instants,
// and the job runs once for each.
//
// gocron skips the repeated wall-clock instant of a daylight-saving
// fall-back, which this schedule still yields; the task then never fires
// for it, so nothing runs twice. Under
// gocron.DaylightSavingsTimeRunAfterTransition gocron fires at a moment
// this schedule does not contain, and that run fails with ErrNoInstant.
func CronSchedule(crontab string, withSeconds bool, loc *time.Location) (gate.Schedule, error) {
	if crontab == "" {
		return nil, tick.Invalid("gocron", "crontab", "must not be empty")
	}
	if loc == nil {
		if !strings.HasPrefix(crontab, "TZ=") && !strings.HasPrefix(crontab, "CRON_TZ=") {
			return nil, tick.Invalid("gocron", "loc", "must not be nil for a crontab without CRON_TZ: "+
				"gocron reads it in the scheduler's location, so pass that (the one given to gocron.WithLocation, "+
				"or time.Local for a scheduler without it, when every instance runs in the same zone), "+
				"or prefix the crontab with CRON_TZ=")
		}
		loc = time.UTC // unused: the prefix names the location
	}
	c := gocronv2.NewDefaultCron(withSeconds)
	if err := c.IsValid(crontab, loc, time.Now()); err != nil {
		return nil, tick.InvalidCause("gocron", "crontab", err)
	}
	return c, nil
}
