package gate_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// recorder collects events.
type recorder struct {
	mu     sync.Mutex
	events []gate.Event
}

func (r *recorder) Observe(_ context.Context, e gate.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) kinds() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, e := range r.events {
		s = append(s, e.Kind.String())
	}
	return strings.Join(s, " ")
}

func TestHooksAndLogs(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	rec := &recorder{}
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g := newGate(t, db.Pool, "observed", gate.Config{Hooks: rec, Logger: logger})
	at := dbNow(t, db.Pool).Truncate(time.Second)

	if err := g.Once(ctx, "job", at, func(context.Context, gate.Run) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = g.Once(ctx, "job", at, noop)                                                                                 // skipped
	_ = g.Once(ctx, "job", at.Add(time.Second), func(context.Context, gate.Run) error { return errors.New("boom") }) // failed
	_ = g.Once(ctx, "job", at.Add(time.Hour), noop)                                                                  // skew: skipped

	if got, want := rec.kinds(), "acquired finished skipped acquired finished skipped"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	rec.mu.Lock()
	ev := rec.events
	rec.mu.Unlock()
	if e := ev[1]; e.Outcome != gate.OutcomeSucceeded || e.Duration < 20*time.Millisecond || e.Fence == 0 ||
		e.Holder != "observed" || e.Name != "job" || !e.FireAt.Equal(at) || e.Err != nil {
		t.Errorf("finished event %+v", e)
	}
	if e := ev[2]; !errors.Is(e.Err, gate.ErrSkipped) {
		t.Errorf("skip event error %v, want ErrSkipped", e.Err)
	}
	if e := ev[4]; e.Outcome != gate.OutcomeFailed || e.Err == nil || e.Err.Error() != "boom" {
		t.Errorf("failed event %+v", e)
	}
	if e := ev[5]; !errors.Is(e.Err, gate.ErrClockSkew) {
		t.Errorf("skew event error %v, want ErrClockSkew", e.Err)
	}

	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	for _, want := range []string{
		`level=DEBUG msg="gate: acquired" name=job holder=observed`,
		`level=INFO msg="gate: finished" name=job holder=observed`,
		`outcome=succeeded duration=`,
		`level=ERROR msg="gate: finished"`,
		`outcome=failed`,
		`error=boom`,
		`level=DEBUG msg="gate: skipped"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestEventKindString(t *testing.T) {
	t.Parallel()
	for k, want := range map[gate.EventKind]string{
		gate.EventAcquired: "acquired", gate.EventSkipped: "skipped", gate.EventLost: "lost",
		gate.EventFinished: "finished", gate.EventReleased: "released", gate.EventAbandoned: "abandoned",
		gate.EventKind(99): "EventKind(99)",
	} {
		if got := k.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(k), got, want)
		}
	}
}
