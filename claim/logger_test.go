package claim

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// messages is a slog.Handler that keeps the messages of records at Warn
// and above.
type messages struct {
	mu  sync.Mutex
	got []string
}

func (m *messages) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	m.got = append(m.got, r.Message)
	m.mu.Unlock()
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

func (m *messages) has(msg string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.got {
		if g == msg {
			return true
		}
	}
	return false
}

// TestNilLoggerIsDefault: with no Logger in Config or WorkerConfig,
// warnings reach slog.Default(). Not parallel: it replaces the default
// logger.
func TestNilLoggerIsDefault(t *testing.T) {
	m := &messages{}
	old := slog.Default()
	slog.SetDefault(slog.New(m))
	t.Cleanup(func() { slog.SetDefault(old) })

	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 3)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Finish(ctx, Claim[int64]{Key: cl.Key, Fence: cl.Fence + 1000}, "DONE"); !errors.Is(err, ErrLost) {
		t.Fatalf("finish with a wrong token: %v, want ErrLost", err)
	}
	if !m.has("claim: claim lost") {
		t.Errorf("Config.Logger nil: the lost claim did not reach slog.Default() (got %q)", m.got)
	}

	w, err := NewWorker(c, WorkerConfig[int64]{
		Work: func(context.Context, pgx.Tx, Claim[int64]) error { return errors.New("fails") },
		Done: "DONE", Failed: "FAILED", BatchSize: 5, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if !m.has("claim: worker: work failed") {
		t.Errorf("WorkerConfig.Logger nil: the failed work did not reach slog.Default() (got %q)", m.got)
	}
}
