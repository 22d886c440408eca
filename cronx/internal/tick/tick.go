package tick

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/gate"
)

// ErrNoInstant means a job started with no instant of its schedule within
// MaxDelay before the instance's clock: it was started late, or by a
// schedule other than the one given to the adapter.
var ErrNoInstant = errors.New("cronx: no scheduled instant within MaxDelay before now")

// Invalid returns an error for bad input in field, reading
// "<pkg>: <field>: <msg>" and wrapping gate.ErrInvalid.
func Invalid(pkg, field, msg string) error {
	return &fieldError{pkg: pkg, field: field, msg: msg}
}

// InvalidCause is Invalid with cause's message; the error wraps both
// gate.ErrInvalid and cause.
func InvalidCause(pkg, field string, cause error) error {
	return &fieldError{pkg: pkg, field: field, msg: strings.ReplaceAll(cause.Error(), "\n", ": "), cause: cause}
}

type fieldError struct {
	pkg, field, msg string
	cause           error
}

func (e *fieldError) Error() string { return e.pkg + ": " + e.field + ": " + e.msg }

func (e *fieldError) Unwrap() []error {
	if e.cause == nil {
		return []error{gate.ErrInvalid}
	}
	return []error{gate.ErrInvalid, e.cause}
}

// Check validates a job's name, schedule and maximum delay for package pkg
// and returns the delay to use: maxDelay, or fallback when maxDelay is zero.
// Adapters pass the gate's skew tolerance as fallback: a run that starts
// later than that after its instant would be refused by the gate's skew
// check anyway. now is the instance's clock.
//
// The schedule must be a calendar: its instants fixed in time, not counted
// from when something started. That is what lets every instance name the
// same instant. It is probed once: with a = Next(now), Next(a-1ns) must be a
// again. A schedule like robfig/cron's "@every 90s" (each instant 90s after
// the previous fire, counted from each instance's start) fails the probe.
func Check(pkg, name string, sched gate.Schedule, maxDelay, fallback time.Duration, now time.Time) (time.Duration, error) {
	if name == "" {
		return 0, Invalid(pkg, "name", "must not be empty")
	}
	if sched == nil {
		return 0, Invalid(pkg, "sched", "must not be nil")
	}
	if maxDelay < 0 {
		return 0, Invalid(pkg, "MaxDelay", "must not be negative")
	}
	if maxDelay == 0 {
		maxDelay = fallback
	}
	a := sched.Next(now)
	if a.IsZero() {
		return 0, Invalid(pkg, "sched", "has no instant after now")
	}
	if !a.After(now) {
		return 0, Invalid(pkg, "sched", fmt.Sprintf("Next(now) is not after now (Next(%s) = %s)",
			now.Format(time.RFC3339Nano), a.Format(time.RFC3339Nano)))
	}
	if b := sched.Next(a.Add(-time.Nanosecond)); !b.Equal(a) {
		return 0, Invalid(pkg, "sched", fmt.Sprintf(
			"instants are not fixed in time (Next(%s) = %s, but Next of 1ns earlier = %s); "+
				"an interval counted from each instance's start (like @every) gives every instance "+
				"different instants: use a calendar spec", now.Format(time.RFC3339Nano),
			a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano)))
	}
	return maxDelay, nil
}

// InLocation returns sched read in loc: its Next is given its argument in
// loc, as a cron library whose location is loc gives it, and returns the
// instant that yields. A schedule whose instants depend on the location of
// Next's argument (robfig/cron's spec without CRON_TZ) then names the same
// instants on every instance, whatever the host's time.Local.
func InLocation(sched gate.Schedule, loc *time.Location) gate.Schedule {
	return zoned{sched: sched, loc: loc}
}

type zoned struct {
	sched gate.Schedule
	loc   *time.Location
}

func (z zoned) Next(t time.Time) time.Time { return z.sched.Next(t.In(z.loc)) }

// Latest returns the last instant of sched in (now-maxDelay, now]: the
// instant a cron library fired the job for, if it started the job at most
// maxDelay late. A cron library starts a job once its clock has reached the
// instant, so an instance whose clock is ahead or behind fires earlier or
// later in real time but computes the same instant; the firing delay
// (scheduler wake-up, goroutine start) only has to stay below the gap
// between instants and below maxDelay.
//
// The window is searched backwards by doubling from 1ms, so the cost grows
// with the logarithm of the delay, not with how many instants maxDelay
// could hold.
func Latest(sched gate.Schedule, now time.Time, maxDelay time.Duration) (time.Time, error) {
	if maxDelay <= 0 {
		return time.Time{}, fmt.Errorf("%w (MaxDelay %s)", ErrNoInstant, maxDelay)
	}
	w := min(time.Millisecond, maxDelay)
	for {
		if x := sched.Next(now.Add(-w)); !x.IsZero() && !x.After(now) {
			for {
				n := sched.Next(x)
				if n.IsZero() || n.After(now) {
					return x, nil
				}
				if !n.After(x) {
					return time.Time{}, fmt.Errorf("cronx: schedule does not advance: Next(%s) = %s",
						x.Format(time.RFC3339Nano), n.Format(time.RFC3339Nano))
				}
				x = n
			}
		}
		if w == maxDelay {
			return time.Time{}, fmt.Errorf("%w (%s before %s)", ErrNoInstant, maxDelay, now.Format(time.RFC3339Nano))
		}
		if w > maxDelay/2 {
			w = maxDelay
		} else {
			w *= 2
		}
	}
}

// Report logs to log with ctx, the firing's context, for package pkg, what
// a firing of the job called name that ended with err means for the people
// running it; it is the adapters' one logging path:
//
//   - a skip because the job's lock is held by another run (gate.ErrHeld:
//     a run of an earlier tick still running, an Exclusive run) at warn
//     level: the tick is not run anywhere, and keeps not running while
//     that run lasts;
//   - any other skip (the tick ran on another instance: the normal
//     outcome on every instance but one) at debug level;
//   - every other error at error level: a failed or lost run, a clock
//     outside the gate's tolerance, an unreachable database, and
//     ErrNoInstant, which repeats at every firing until the schedule,
//     location or clock is fixed.
func Report(ctx context.Context, log *slog.Logger, pkg, name string, err error) {
	if err == nil {
		return
	}
	level, msg := slog.LevelError, pkg+": run failed"
	switch {
	case errors.Is(err, gate.ErrHeld):
		level, msg = slog.LevelWarn, pkg+": tick skipped: the job's lock is held by another run (an earlier tick's run still running?)"
	case errors.Is(err, gate.ErrSkipped):
		level, msg = slog.LevelDebug, pkg+": tick skipped"
	case errors.Is(err, ErrNoInstant):
		msg = pkg + ": job not run: no scheduled instant to run it for (is the job fired on another schedule, " +
			"or in another location than the one it was given?)"
	}
	log.LogAttrs(ctx, level, msg, slog.String("name", name), slog.String("error", err.Error()))
}

// Logger returns log, or slog.Default() when log is nil.
func Logger(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.Default()
	}
	return log
}

// Once runs fn through g.Once for the tick (name, at), trying once more
// when the job's lock was held elsewhere (gate.ErrHeld). Instances firing
// the same tick within a moment of each other meet that way: the first
// holds the lock for its run, and its claim of the tick may not be visible
// yet when the second looks, so the second is told the lock is held rather
// than that the tick is taken. The second attempt sees the claim and skips
// as taken; an ErrHeld it returns means a run of another tick (or an
// Exclusive run) holds the lock. When the lock was freed in between, the
// tick runs now: it had not run anywhere.
func Once(ctx context.Context, g *gate.Gate, name string, at time.Time, fn gate.Func) error {
	err := g.Once(ctx, name, at, fn)
	if errors.Is(err, gate.ErrHeld) {
		err = g.Once(ctx, name, at, fn)
	}
	return err
}

// Fire runs fn through g for the job called name, for the last instant of
// sched at or before now (see Latest): what both adapters do when their
// scheduler fires the job.
func Fire(ctx context.Context, g *gate.Gate, name string, sched gate.Schedule, now time.Time, maxDelay time.Duration, fn gate.Func) error {
	at, err := Latest(sched, now, maxDelay)
	if err != nil {
		return err
	}
	return Once(ctx, g, name, at, fn)
}

// RunAt runs fn through g for the job called name, for instant, which must
// be an instant of sched (an error for package pkg naming "instant"
// otherwise): the adapters' RunAt.
func RunAt(ctx context.Context, pkg string, g *gate.Gate, name string, sched gate.Schedule, instant time.Time, fn gate.Func) error {
	if err := IsInstant(pkg, sched, instant); err != nil {
		return err
	}
	return Once(ctx, g, name, instant, fn)
}

// IsInstant returns nil when instant is an instant of sched, and otherwise
// an error for package pkg naming the field "instant" and wrapping
// gate.ErrInvalid.
func IsInstant(pkg string, sched gate.Schedule, instant time.Time) error {
	if instant.IsZero() {
		return Invalid(pkg, "instant", "must not be zero")
	}
	if next := sched.Next(instant.Add(-time.Nanosecond)); !next.Equal(instant) {
		return Invalid(pkg, "instant", fmt.Sprintf("%s is not an instant of the schedule (the first one at or after it is %s)",
			instant.Format(time.RFC3339Nano), next.Format(time.RFC3339Nano)))
	}
	return nil
}
