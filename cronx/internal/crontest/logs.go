package crontest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// Logs records what is logged through it, one line per record: its level,
// message and attributes.
type Logs struct {
	mu    sync.Mutex
	lines []string
}

// Handler returns a slog.Handler recording into l.
func (l *Logs) Handler() slog.Handler { return logHandler{l: l} }

// Lines returns the records so far.
func (l *Logs) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// Find returns the first record at level whose text contains every one of
// parts, or "". It ignores the gate's own records (messages starting
// "gate:"): it looks for what an adapter logged.
func (l *Logs) Find(level slog.Level, parts ...string) string {
	for _, line := range l.Lines() {
		if !strings.HasPrefix(line, level.String()+" ") || fromGate(line) {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return line
		}
	}
	return ""
}

// fromGate reports whether a recorded line is one of the gate's own.
func fromGate(line string) bool {
	_, msg, _ := strings.Cut(line, " ")
	return strings.HasPrefix(msg, "gate:")
}

// CaptureDefault makes a new Logs the process's default logger until t
// ends. The default logger is global: call it from a test that is not
// parallel.
func CaptureDefault(t *testing.T) *Logs {
	l := &Logs{}
	prev := slog.Default()
	slog.SetDefault(slog.New(l.Handler()))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return l
}

type logHandler struct {
	l     *Logs
	attrs []slog.Attr
}

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s", a)
		return true
	})
	h.l.mu.Lock()
	h.l.lines = append(h.l.lines, b.String())
	h.l.mu.Unlock()
	return nil
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{l: h.l, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h logHandler) WithGroup(string) slog.Handler { return h }

// EverySecond fires on every whole second.
type EverySecond struct{}

// Next returns the first whole second after t.
func (EverySecond) Next(t time.Time) time.Time { return t.Truncate(time.Second).Add(time.Second) }

// Build builds an adapter's job called name on g for sched, running fn,
// whose clock reads now, with every option at its default but the clock
// and maxDelay (0: the default). It returns what the scheduler calls when
// it fires the job (the function that logs what it cannot return).
type Build func(g *gate.Gate, name string, sched gate.Schedule, fn gate.Func, now func() time.Time, maxDelay time.Duration) (fire func(), err error)

// LogsByDefault checks that an adapter's job built without a Logger
// reports, on the process's default logger, what makes a job silently not
// run: at error level a firing with no instant to run (ErrNoInstant), at
// warn level a tick skipped because a run of an earlier tick still holds
// the job's lock; and nothing at warn or error for a tick that another
// instance ran (the normal skip). It replaces the default logger: call it
// from a test that is not parallel.
func LogsByDefault(t *testing.T, build Build) {
	logs := CaptureDefault(t)
	db := pgtest.NewDatabase(t)
	var mu sync.Mutex
	var skips []gate.Event
	g, err := gate.New(db.Pool, gate.Config{Holder: "a", Hooks: gate.HooksFunc(func(_ context.Context, e gate.Event) {
		if e.Kind == gate.EventSkipped {
			mu.Lock()
			skips = append(skips, e)
			mu.Unlock()
		}
	})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)

	// No instant: a daily job fired hours away from its time of day.
	daily := Daily{At: time.Now().Add(-6 * time.Hour).Truncate(time.Second)}
	fire, err := build(g, "late", daily, func(context.Context, gate.Run) error {
		t.Error("job ran without an instant")
		return nil
	}, time.Now, 0)
	if err != nil {
		t.Fatal(err)
	}
	fire()
	if logs.Find(slog.LevelError, "no scheduled instant", "late") == "" {
		t.Errorf("a firing with no instant to run was not logged at error level on the default logger; logged: %q", logs.Lines())
	}

	// Held: the run of tick T still holds the lock when T+1s fires.
	base := time.Now().Truncate(time.Second).Add(-2 * time.Second)
	var clock atomic.Int64
	clock.Store(base.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	started, release := make(chan struct{}), make(chan struct{})
	var ran []time.Time
	fire, err = build(g, "slow", EverySecond{}, func(_ context.Context, run gate.Run) error {
		mu.Lock()
		ran = append(ran, run.FireAt)
		first := len(ran) == 1
		mu.Unlock()
		if first {
			close(started)
			<-release
		}
		return nil
	}, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fire()
	}()
	<-started
	clock.Store(base.Add(time.Second).UnixNano())
	fire()
	close(release)
	<-done
	if line := logs.Find(slog.LevelWarn, "slow", gate.ErrHeld.Error()); line == "" {
		t.Errorf("a tick skipped because a run of an earlier tick held the job's lock was not logged at warn level; logged: %q", logs.Lines())
	}
	mu.Lock()
	held := false
	for _, e := range skips {
		held = held || (e.Name == "slow" && errors.Is(e.Err, gate.ErrHeld) && e.FireAt.Equal(base.Add(time.Second)))
	}
	mu.Unlock()
	if !held {
		t.Errorf("gate reported no skip with ErrHeld for %s; skips: %v", base.Add(time.Second).Format(time.RFC3339), skips)
	}

	// Taken: another instance fires tick T after it ran: a normal skip.
	g2, err := gate.New(db.NewPool(t), gate.Config{Holder: "b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g2.Close)
	clock.Store(base.UnixNano())
	n := len(logs.Lines())
	fire, err = build(g2, "slow", EverySecond{}, func(context.Context, gate.Run) error {
		t.Error("tick ran twice")
		return nil
	}, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	fire()
	for _, line := range logs.Lines()[n:] {
		if (strings.HasPrefix(line, "WARN ") || strings.HasPrefix(line, "ERROR ")) && !fromGate(line) {
			t.Errorf("a tick another instance ran was logged as a problem: %s", line)
		}
	}
}
