package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// TestNilLoggerIsDefault: with no Config.Logger, warnings of the claimer
// and of its worker reach slog.Default(). Not parallel: it replaces the default
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
		t.Errorf("Config.Logger nil: the failed work did not reach slog.Default() (got %q)", m.got)
	}
}

// ctxHandler keeps, for each record at any level, its message and whether
// its context carried ctxKey (see TestHooksContext).
type ctxHandler struct {
	mu  sync.Mutex
	got []string
}

func (h *ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, fmt.Sprintf("%s %v", r.Message, ctx.Value(ctxKey{}) != nil))
	return nil
}
func (h *ctxHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *ctxHandler) WithGroup(string) slog.Handler      { return h }

// TestLogsCarryCallersContext: the records of the claimer, its worker and
// its sweeper are written with the context of the call they are about, as
// the events to Hooks are.
func TestLogsCarryCallersContext(t *testing.T) {
	t.Parallel()
	ctx := context.WithValue(testCtx(t), ctxKey{}, "caller")
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 3)
	h := &ctxHandler{}
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "h", Logger: slog.New(h)})
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
	if err := c.Release(ctx, cl); err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{
		Work: func(context.Context, pgx.Tx, Claim[int64]) error { return errors.New("fails") },
		Done: "DONE", Failed: "FAILED", BatchSize: 5, PollInterval: 10 * time.Millisecond, SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ClaimBatch(ctx, 1); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db.Pool, `INSERT INTO jobs (id, state, claimed_at) VALUES (4, 'PROCESSING', now() - interval '2 hours')`)
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10, SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sw.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	want := []string{"claim: claimed true", "claim: claim lost true", "claim: released true",
		"claim: claimed batch true", "claim: worker: work failed true", "claim: worker: work failed true", "claim: worker: work failed true",
		"claim: swept stale row true"}
	if strings.Join(h.got, "; ") != strings.Join(want, "; ") {
		t.Errorf("records:\n  %s\nwant\n  %s", strings.Join(h.got, "; "), strings.Join(want, "; "))
	}
}
