package schedule

import (
	"context"
	"log/slog"
	"strconv"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventStarted: an attempt of a run started on this instance.
	EventStarted EventKind = iota + 1
	// EventFinished: an attempt ended and its outcome was recorded: State
	// is "succeeded", "retrying" (Err is the attempt's error) or "failed"
	// (Reason says why).
	EventFinished
	// EventSkipped: an instant was recorded skipped; Reason says why.
	EventSkipped
	// EventMissed: an instant that was due (not paused, inside the
	// definition's life) had no row after its grace (Config.Grace); its
	// catch-up policy then decided it (State "pending" or "skipped").
	EventMissed
	// EventLost: an attempt lost its exclusivity, or its completion was
	// refused because another instance had taken the run over (a stale
	// fence), or its outcome could not be recorded at all (the run, left
	// running, is then taken over as a dead holder's). Err wraps ErrLost
	// (and the database's error, for an outcome not recorded).
	EventLost
	// EventTakenOver: a run whose holder had died (session or lease gone)
	// was taken over by this instance as the next attempt, or recorded
	// failed when it had no attempts left. Reason names the dead holder.
	EventTakenOver
	// EventFollowed: Register found a stored definition different from
	// the one given, with an equal or higher version, and follows it.
	EventFollowed
	// EventLate: a run's first attempt started more than the schedule's
	// LateAfter after its instant; Duration is how long after. The run's
	// row is marked late.
	EventLate
	// EventOverdue: an attempt has been running longer than the
	// schedule's ExpectedDuration (reported once per attempt; Duration is
	// the expected duration). The run's row is marked overdue.
	EventOverdue
	// EventRefused: the database refused this instance a connection (too
	// many clients, SQLSTATE 53300; starting up or shutting down, 57P03):
	// it backs off, with jitter, for Duration before looking at the
	// schedule again, and reports this once per episode (then at most
	// every 10 s, Reason saying how many refusals since the first). Instants due meanwhile
	// are recorded when it looks again: on time within Config.Grace, after
	// that missed and decided by the catch-up policy. Err is the refusal.
	EventRefused
)

// String returns the kind's name: "started", "finished", "skipped",
// "missed", "lost", "taken over", "followed", "late", "overdue" or
// "refused".
func (k EventKind) String() string {
	switch k {
	case EventStarted:
		return "started"
	case EventFinished:
		return "finished"
	case EventSkipped:
		return "skipped"
	case EventMissed:
		return "missed"
	case EventLost:
		return "lost"
	case EventTakenOver:
		return "taken over"
	case EventFollowed:
		return "followed"
	case EventLate:
		return "late"
	case EventOverdue:
		return "overdue"
	case EventRefused:
		return "refused"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one observation reported to Hooks and logged.
type Event struct {
	Kind     EventKind
	Schedule string
	Instant  time.Time // the run's instant; zero for EventFollowed
	RunKind  string    // "scheduled", "triggered" or "backfill"
	Attempt  int
	Fence    int64
	Holder   string        // this instance
	State    string        // the run's state after the event, where one was written
	Duration time.Duration // how long the attempt ran (EventFinished), how long after its instant it started by database time (EventStarted), how late it started (EventLate), its expected duration (EventOverdue), the back-off (EventRefused)
	// Reason says why (skipped, failed, taken over, followed). The reason
	// of an EventSkipped begins with the policy that decided it:
	// "overlap: " (the overlap policy), "missed: " (the catch-up policy,
	// for an instant missed) or "paused: " (an instant due while paused).
	Reason string
	Err    error // the attempt's error, or one wrapping ErrLost
}

// Hooks receives events for metrics and tracing. Observe may be called
// from several goroutines at once and must not block. ctx is the context
// of the call the event belongs to (Run's for the scheduler's work).
type Hooks interface {
	Observe(ctx context.Context, e Event)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f HooksFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

type noHooks struct{}

func (noHooks) Observe(context.Context, Event) {}

// emit reports e to the hooks and logs it: started at debug, finished at
// info (retrying at warn, failed at error), skipped at info, missed, lost,
// taken over, followed, late and overdue at warn.
func (s *Scheduler) emit(ctx context.Context, e Event) {
	s.hooks.Observe(ctx, e)
	s.logEvent(ctx, e, eventLevel(e))
}

// eventLevel is the level emit logs e at.
func eventLevel(e Event) slog.Level {
	level := slog.LevelInfo
	switch e.Kind {
	case EventStarted:
		level = slog.LevelDebug
	case EventMissed, EventLost, EventTakenOver, EventFollowed, EventLate, EventOverdue, EventRefused:
		level = slog.LevelWarn
	case EventFinished:
		switch e.State {
		case stateRetrying:
			level = slog.LevelWarn
		case stateFailed:
			level = slog.LevelError
		}
	}
	return level
}

// logEvent logs e at level.
func (s *Scheduler) logEvent(ctx context.Context, e Event, level slog.Level) {
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("schedule", e.Schedule))
	if !e.Instant.IsZero() {
		attrs = append(attrs, slog.Time("instant", e.Instant), slog.String("kind", e.RunKind))
	}
	if e.Attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
	}
	if e.Fence != 0 {
		attrs = append(attrs, slog.Int64("fence", e.Fence))
	}
	attrs = append(attrs, slog.String("holder", e.Holder))
	if e.State != "" {
		attrs = append(attrs, slog.String("state", e.State))
	}
	if e.Kind == EventFinished || e.Kind == EventLate || e.Kind == EventOverdue {
		attrs = append(attrs, slog.Duration("duration", e.Duration))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", e.Reason))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	s.log.LogAttrs(ctx, level, "schedule: "+e.Kind.String(), attrs...)
}

// emitRecorded reports the events of instants recorded together — missed
// ones decided by the catch-up policy, instants skipped by a policy — to
// the hooks one by one, and logs them as one line: after a downtime a
// line per instant would bury what matters. The line (at warn when any
// was missed, else at info) counts the missed and the skipped instants,
// names the first and the last and the first skip's reason; each
// instant's own line is logged at debug.
func (s *Scheduler) emitRecorded(ctx context.Context, evs []Event) {
	if len(evs) == 1 {
		s.emit(ctx, evs[0])
		return
	}
	var missed, skipped int
	var first, last time.Time
	var reason string
	for _, e := range evs {
		s.hooks.Observe(ctx, e)
		s.logEvent(ctx, e, slog.LevelDebug)
		switch e.Kind {
		case EventMissed:
			missed++
		case EventSkipped:
			skipped++
			if reason == "" {
				reason = e.Reason
			}
		}
		if first.IsZero() || e.Instant.Before(first) {
			first = e.Instant
		}
		if e.Instant.After(last) {
			last = e.Instant
		}
	}
	if len(evs) == 0 {
		return
	}
	level, msg := slog.LevelInfo, "schedule: skipped"
	if missed > 0 {
		level, msg = slog.LevelWarn, "schedule: missed"
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("schedule", evs[0].Schedule), slog.Int("missed", missed), slog.Int("skipped", skipped),
		slog.Time("first", first), slog.Time("last", last), slog.String("holder", evs[0].Holder),
	}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", reason))
	}
	attrs = append(attrs, slog.String("detail", "each instant is logged at debug level"))
	s.log.LogAttrs(ctx, level, msg, attrs...)
}
