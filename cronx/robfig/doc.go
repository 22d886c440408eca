// Package robfig runs robfig/cron v3 jobs through a pgclaim gate, so that a
// job scheduled on every instance of a service runs once per scheduled
// instant across all of them.
//
// Every instance builds the same cron (same spec, same job name) and wraps
// the job with NewJob or Wrap. When the cron fires, the job works out which
// instant it fired for from the schedule — the last instant of the schedule
// at or before the instance's clock — and hands it to gate.Gate.Once: the
// first instance to record that (name, instant) in the tick ledger runs the
// job, holding the job's advisory lock; the others skip. An instance whose
// clock is ahead or behind fires earlier or later in real time, but names
// the same instant, because the cron fires by the same clock the instant is
// read from.
//
// robfig/cron reads a spec without CRON_TZ= in the cron's location
// (cron.WithLocation), so the job must be told that location
// (Config.Location, e.g. c.Location()): it then names the instants the
// cron fires for whatever the host's time.Local, and every instance names
// the same ones.
//
// The schedule must be a calendar (a cron spec such as "0 9 * * *" or
// "*/10 * * * * *"): instants fixed in time. "@every" intervals count from
// each instance's start, so no two instances agree on an instant; NewJob and
// Wrap refuse them (all but "@every 1s", which fires on every whole second).
//
// Job.RunAt fires the job for a chosen instant through the same gate, without
// waiting for the clock: that is how a test runs the 09:00 job.
//
// A job must start within Config.MaxDelay of its instant, and before the
// next instant of its schedule; a job that starts later is counted for a
// later instant or refused with ErrNoInstant. Keep the cron's jobs short or
// let them run on their own goroutines (robfig/cron does), and keep the
// machines' clocks within the gate's skew tolerance of the database.
package robfig
