package chaos

// The schedules' workload: every instance runs package schedule's
// Scheduler over the same one-second schedules; the job writes one attempt
// row when it starts and one effect row when it ends, each through the
// run's fence (see fencedWrite).

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

// Schedule groups, by lock mechanism (as the elections): the direct
// instances run the advisory group with session advisory locks; every
// instance runs the lease group with lease locks (Config.LeaseLocks), the
// only kind that works behind PgBouncer. The lease group exists only when
// some instance is behind PgBouncer.
const (
	schedGroupAdv   = "adv"
	schedGroupLease = "lease"
	schedPrefix     = "chaos-s/"
)

func schedName(group string, i int) string { return fmt.Sprintf("%s%s/%02d", schedPrefix, group, i) }

// schedGroup is the group of a schedule's name.
func schedGroup(name string) string {
	g, _, _ := strings.Cut(strings.TrimPrefix(name, schedPrefix), "/")
	return g
}

// schedSpec is the cron spec of a period of whole seconds.
func schedSpec(period time.Duration) string {
	if period == time.Second {
		return "* * * * * *"
	}
	return fmt.Sprintf("*/%d * * * * *", int(period/time.Second))
}

// schedCap is the catch-up cap: far more instants than any fault leaves
// behind, so catch-up never skips one.
const schedCap = 10000

// definition is the schedules' definition. Catch-up all inside the window
// with a cap no fault reaches: every instant missed during a fault or
// paused runs later. Overlap buffer all: an instant due while a run of its
// schedule is still running (or waits to be taken over) waits for it, so no
// instant is skipped.
// Failed attempts (a write cut by a restart or a terminated backend) are
// retried soon.
func (c workerConfig) definition(name string) schedule.Definition {
	return schedule.Definition{
		Name: name, Spec: schedSpec(c.Period), Version: 1,
		CatchUp: schedule.CatchUpAll, CatchUpWindow: c.Window, CatchUpCap: schedCap,
		Overlap: schedule.OverlapBufferAll,
		Retry:   schedule.RetryPolicy{MaxAttempts: c.SchedAttempts, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond},
		Lease:   c.SchedLease,
	}
}

// startSchedules registers every schedule of the instance's groups (before
// it says READY) and returns the schedulers to run.
func (w *worker) startSchedules(ctx context.Context) ([]*schedule.Scheduler, error) {
	var out []*schedule.Scheduler
	hooks := schedule.HooksFunc(w.observe)
	for _, g := range w.cfg.SchedGroups {
		s, err := schedule.New(w.pool, schedule.Config{
			Holder: w.holder, Logger: w.log, Hooks: hooks, LeaseLocks: g == schedGroupLease, PollInterval: w.cfg.SchedPoll,
		})
		if err != nil {
			return nil, err
		}
		for i := 0; i < w.cfg.Schedules; i++ {
			name := schedName(g, i)
			for {
				err := s.Register(ctx, w.cfg.definition(name), w.schedJob)
				if err == nil {
					break
				}
				if errors.Is(err, schedule.ErrInvalid) {
					return nil, err
				}
				w.log.Warn("register schedule; retrying", "schedule", name, "error", err)
				if !sleepCtx(ctx, 200*time.Millisecond) {
					return nil, ctx.Err()
				}
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// runScheduler runs s until ctx ends.
func (w *worker) runScheduler(ctx context.Context, s *schedule.Scheduler) {
	for ctx.Err() == nil {
		err := s.Run(ctx)
		if ctx.Err() == nil {
			w.log.Warn("scheduler stopped; running it again", "error", err)
			sleepCtx(ctx, 500*time.Millisecond)
		}
	}
}

// schedEvent is an event the instance records in chaos_sched_events.
type schedEvent struct {
	kind, schedule, detail string
	instant                time.Time
	attempt                int
	fence                  int64
}

// observe records the scheduler's lost, taken-over and missed events
// (without blocking: one dropped when the buffer is full is counted), and
// with Acks reports each success the scheduler recorded.
func (w *worker) observe(_ context.Context, e schedule.Event) {
	var detail string
	switch e.Kind {
	case schedule.EventFinished:
		if w.cfg.Acks && e.State == "succeeded" {
			w.say(fmt.Sprintf("%s %s %s %d %d", msgAckRun, w.holder, e.Schedule, e.Instant.UnixMicro(), e.Fence))
		}
		return
	case schedule.EventLost:
		if e.Err != nil {
			detail = e.Err.Error()
		}
	case schedule.EventTakenOver, schedule.EventMissed:
		detail = e.Reason
	default:
		return
	}
	w.record(schedEvent{kind: e.Kind.String(), schedule: e.Schedule, detail: detail, instant: e.Instant, attempt: e.Attempt, fence: e.Fence})
}

func (w *worker) record(ev schedEvent) {
	select {
	case w.events <- ev:
	default:
		w.dropped.Add(1)
	}
}

// writeEvents writes the recorded events until ctx ends.
func (w *worker) writeEvents(ctx context.Context) {
	for {
		var ev schedEvent
		select {
		case <-ctx.Done():
			if n := w.dropped.Load(); n > 0 {
				w.log.Warn("schedule events dropped (buffer full)", "count", n)
			}
			return
		case ev = <-w.events:
		}
		var instant any
		if !ev.instant.IsZero() {
			instant = ev.instant
		}
		for try := 0; try < 20 && ctx.Err() == nil; try++ {
			_, err := w.pool.Exec(ctx, `INSERT INTO chaos_sched_events (kind, schedule, instant, attempt, fence, instance, detail)
				VALUES ($1, $2, $3, $4, $5, $6, $7)`, ev.kind, ev.schedule, instant, ev.attempt, ev.fence, w.holder, ev.detail)
			if err == nil {
				break
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
	}
}

// errStale is the job's error when the fence refused one of its writes.
var errStale = errors.New("chaos: the run's fence is stale or its lease expired: write refused")

// schedJob is the schedules' job: record the attempt, work for a while (so
// that kills, pauses and terminations land inside runs), record the
// effect. Both writes go through the run's fence.
func (w *worker) schedJob(ctx context.Context, run schedule.Run) error {
	w.say(msgRunStart)
	defer w.say(msgRunEnd)
	if err := w.fencedWrite(ctx, "chaos_sched_attempts", run); err != nil {
		return err
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d/%d", w.cfg.Seed, run.Schedule, run.Instant.UnixMicro(), run.Attempt)
	work := time.Duration(h.Sum64() % uint64(w.cfg.SchedWork+1))
	if w.cfg.Broken == BrokenNoSchedFence {
		// Nor does it heed its context: it writes whatever happened.
		time.Sleep(work)
	} else if !sleepCtx(ctx, work) {
		return context.Cause(ctx)
	}
	return w.fencedWrite(ctx, "chaos_sched_effects", run)
}

// fencedWrite inserts the attempt's row into table only while the run row
// holds the attempt's fence, is running and its lease has not expired —
// one statement that locks the run row FOR SHARE, so a takeover (which
// updates the row) is ordered before or after it. A write it refuses is
// recorded as a "refused" event: that attempt was a zombie, and nothing of
// it counts.
//
// The lease is compared with clock_timestamp(), not now(): a write sent
// just before its process was SIGSTOPped can wait at the server for the
// run row's lock (held by a renewal whose commit the stop delayed); the
// row is re-checked when the lock is released, and by then the lease has
// expired. now() would be the statement's start, before the stop.
//
// So the checker can count the effect whose fence is the succeeded
// attempt's, and see that no attempt wrote anything after the next one
// started. (Recording everything and letting the checker pick the
// finished row's fence would hide a zombie's late write behind the count.)
func (w *worker) fencedWrite(ctx context.Context, table string, run schedule.Run) error {
	if w.cfg.Broken == BrokenNoSchedFence {
		_, err := w.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO `+table+` (schedule, instant, attempt, fence, instance) VALUES ($1, $2, $3, $4, $5)`,
			run.Schedule, run.Instant, run.Attempt, run.Fence, w.holder)
		return err
	}
	tag, err := w.pool.Exec(ctx, `INSERT INTO `+table+` (schedule, instant, attempt, fence, instance)
		SELECT $1::text, $2::timestamptz, $3::int, $4::bigint, $5::text
		WHERE EXISTS (
			SELECT 1 FROM pgclaim_schedule_runs
			WHERE schedule = $1::text AND instant = $2::timestamptz AND fence = $4::bigint
			  AND state = 'running' AND lease_until > clock_timestamp()
			FOR SHARE)`, run.Schedule, run.Instant, run.Attempt, run.Fence, w.holder)
	if err != nil {
		return fmt.Errorf("%s: %w", table, err)
	}
	if tag.RowsAffected() == 0 {
		w.record(schedEvent{kind: "refused", schedule: run.Schedule, instant: run.Instant, attempt: run.Attempt, fence: run.Fence, detail: table})
		return errStale
	}
	return nil
}

// noLedgerLoop is the BrokenNoLedger worker: every instance runs
// every instant of every schedule itself, with no ledger and no fence.
func (w *worker) noLedgerLoop(ctx context.Context) {
	p := periodic{ms: w.cfg.Period.Milliseconds()}
	for {
		next := p.Next(w.now())
		if !sleepCtx(ctx, next.Sub(w.now())) {
			return
		}
		for _, g := range w.cfg.SchedGroups {
			for i := 0; i < w.cfg.Schedules; i++ {
				for _, table := range []string{"chaos_sched_attempts", "chaos_sched_effects"} {
					_, _ = w.pool.Exec(ctx, `INSERT INTO `+table+` (schedule, instant, attempt, fence, instance) VALUES ($1, $2, 1, 0, $3)`,
						schedName(g, i), next, w.holder)
				}
			}
		}
	}
}

// periodic is a schedule of every period, aligned to the Unix epoch.
type periodic struct{ ms int64 }

// Next returns the first instant strictly after t.
func (p periodic) Next(t time.Time) time.Time {
	ms := t.UnixMilli()
	return time.UnixMilli(ms - mod(ms, p.ms) + p.ms)
}

func mod(a, b int64) int64 { return ((a % b) + b) % b }
