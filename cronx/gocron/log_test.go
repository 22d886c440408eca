package gocron

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/cronx/internal/crontest"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestLogsByDefault: without TaskConfig.Logger, a firing with no instant
// is an error and a tick skipped behind a slow run a warning on the
// default logger (see crontest.LogsByDefault). Not parallel: it replaces
// the default logger.
func TestLogsByDefault(t *testing.T) {
	crontest.LogsByDefault(t, func(g *gate.Gate, name string, sched gate.Schedule, fn gate.Func, now func() time.Time, maxDelay time.Duration) (func(), error) {
		f, err := taskFunc(g, name, sched, fn, TaskConfig{MaxDelay: maxDelay, now: now})
		if err != nil {
			return nil, err
		}
		return func() { _ = f(context.Background()) }, nil
	})
}

type ctxKey struct{}

// TestTaskContextAndLogger: a run's context carries TaskConfig.Context's
// values and ends with it or with gocron's; an explicit Logger gets what
// the default would have.
func TestTaskContextAndLogger(t *testing.T) {
	t.Parallel()
	g, err := gate.New(pgtest.Pool(t), gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	logs := &crontest.Logs{}
	for _, c := range []struct {
		name       string
		cancelOurs bool
	}{{"parent cancelled", true}, {"gocron's cancelled", false}} {
		parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "request-scope"))
		gocronCtx, cancelGocron := context.WithCancel(context.Background())
		started := make(chan struct{})
		var value any
		var cause error
		f, err := taskFunc(g, "ctx-"+strings.ReplaceAll(c.name, " ", "-"), crontest.EverySecond{}, func(ctx context.Context, run gate.Run) error {
			value = ctx.Value(ctxKey{})
			close(started)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		}, TaskConfig{Context: parent, Logger: slog.New(logs.Handler())})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- f(gocronCtx) }()
		<-started
		if c.cancelOurs {
			cancelParent()
		} else {
			cancelGocron()
		}
		err = <-done
		cancelParent()
		cancelGocron()
		if value != "request-scope" {
			t.Errorf("%s: the run's context carries %v, want TaskConfig.Context's value", c.name, value)
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(cause, context.Canceled) {
			t.Errorf("%s: task returned %v (cause %v), want context.Canceled", c.name, err, cause)
		}
		if logs.Find(slog.LevelError, "run failed", "ctx-") == "" {
			t.Errorf("%s: the cancelled run was not logged at error level on TaskConfig.Logger; logged: %q", c.name, logs.Lines())
		}
	}
}
