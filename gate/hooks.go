package gate

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// emit reports e to the hooks and writes one log record for it, both with
// ctx (the caller's; for background work, the acquiring call's values): acquired and skipped at debug level
// (a tick skipped because its job's lock is held at warn), finished at info
// (error when the job failed), abandoned at warn, lost at error.
func (o *instance) emit(ctx context.Context, e Event) {
	o.Hooks.Observe(ctx, e)
	level := slog.LevelDebug
	switch e.Kind {
	case EventLost:
		level = slog.LevelError
	case EventAbandoned:
		level = slog.LevelWarn
	case EventSkipped:
		if errors.Is(e.Err, errLockBusy) {
			level = slog.LevelWarn
		}
	case EventFinished, EventReleased:
		level = slog.LevelInfo
		if e.Outcome != "" && e.Outcome != OutcomeSucceeded {
			level = slog.LevelError
		}
	}
	if !o.Logger.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("name", e.Name), slog.String("holder", e.Holder))
	if !e.FireAt.IsZero() {
		attrs = append(attrs, slog.Time("fire_at", e.FireAt))
	}
	if e.Fence != 0 {
		attrs = append(attrs, slog.Int64("fence", e.Fence))
	}
	if e.Kind == EventFinished || e.Kind == EventReleased {
		if e.Outcome != "" {
			attrs = append(attrs, slog.String("outcome", string(e.Outcome)))
		}
		attrs = append(attrs, slog.Duration("duration", e.Duration))
	}
	if e.Kind == EventSkipped && errors.Is(e.Err, errLockBusy) {
		attrs = append(attrs, slog.String("held_by", e.HeldBy))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	o.Logger.LogAttrs(ctx, level, "gate: "+e.Kind.String(), attrs...)
}

// finished builds the EventFinished for run.
func finished(run Run, out Outcome, d time.Duration, err error) Event {
	return Event{
		Kind: EventFinished, Name: run.Name, FireAt: run.FireAt, Holder: run.Holder,
		Fence: run.Fence, Outcome: out, Duration: d, Err: err,
	}
}
