package gate_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

type ctxKey struct{}

// ctxHandler records each record's level, message and attributes, and the
// ctxKey value of the context it was logged with.
type ctxHandler struct {
	mu   *sync.Mutex
	recs *[]string
}

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h ctxHandler) WithGroup(string) slog.Handler            { return h }
func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.Key + "=" + a.Value.String()); return true })
	if v, ok := ctx.Value(ctxKey{}).(string); ok {
		b.WriteString(" ctx=" + v)
	}
	h.mu.Lock()
	*h.recs = append(*h.recs, b.String())
	h.mu.Unlock()
	return nil
}

// A run of the 12:00 tick holds the job's lock past 12:01: the 12:01 tick is
// skipped on every instance. The skip is reported: an EventSkipped whose
// error wraps ErrHeld and names the run holding the lock, and a warning
// naming the job, the instant and that holder, logged with the caller's
// context.
func TestOnceSkipBehindLongRunReported(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	var (
		mu     sync.Mutex
		recs   []string
		events []gate.Event
	)
	hooks := gate.HooksFunc(func(_ context.Context, e gate.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	slow := newGate(t, db.Pool, "host-a", gate.Config{})
	other := newGate(t, db.NewPool(t), "host-b", gate.Config{Logger: slog.New(ctxHandler{mu: &mu, recs: &recs}), Hooks: hooks})
	noon := dbNow(t, db.Pool).Truncate(time.Minute)
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- slow.Once(context.Background(), "report", noon, func(context.Context, gate.Run) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	ctx := context.WithValue(context.Background(), ctxKey{}, "request-7")
	err := other.Once(ctx, "report", noon.Add(time.Minute), func(context.Context, gate.Run) error {
		t.Error("12:01 ran while 12:00 holds the lock")
		return nil
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("12:01: %v; want ErrHeld", err)
	}
	if !strings.Contains(err.Error(), "host-a") {
		t.Errorf("error %q does not name the run holding the lock (host-a)", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var skip *gate.Event
	for i := range events {
		if events[i].Kind == gate.EventSkipped {
			skip = &events[i]
		}
	}
	if skip == nil || !errors.Is(skip.Err, gate.ErrHeld) || !skip.FireAt.Equal(noon.Add(time.Minute)) || skip.HeldBy != "host-a" {
		t.Errorf("skip event %+v; want EventSkipped at 12:01, Err wrapping ErrHeld, HeldBy host-a", skip)
	}
	warned := false
	for _, r := range recs {
		if strings.HasPrefix(r, "WARN") && strings.Contains(r, "name=report") && strings.Contains(r, "fire_at=") &&
			strings.Contains(r, "held_by=host-a") && strings.Contains(r, "ctx=request-7") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning naming the job, the instant and the holder, with the caller's context; logged:\n%s", strings.Join(recs, "\n"))
	}
}

// A nil Logger is slog.Default(): a warning reaches the process's logger.
// Not parallel: it replaces the default logger for its duration.
func TestNilLoggerIsDefault(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	defer slog.SetDefault(old)

	db := pgtest.NewDatabase(t)
	a := newGate(t, db.Pool, "host-a", gate.Config{})
	b := newGate(t, db.NewPool(t), "host-b", gate.Config{})
	at := dbNow(t, db.Pool).Truncate(time.Second)
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.Once(context.Background(), "nightly", at, func(context.Context, gate.Run) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	_ = b.Once(context.Background(), "nightly", at.Add(time.Second), func(context.Context, gate.Run) error { return nil })
	close(release)
	<-done
	if s := buf.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "name=nightly") {
		t.Errorf("default logger got %q; want the skip warning", s)
	}
}

// A database without pgclaim's tables is refused at construction, with the
// fix named, not at the first Once with SQLSTATE 42P01.
func TestNewUnmigrated(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabaseFrom(t, pgtest.Template{Name: "gate_unmigrated", Unmigrated: true})
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "apply pgclaim's migrations (pgclaim.Migrate)") {
			t.Errorf("%s on an unmigrated database: %v; want ErrInvalid naming pgclaim.Migrate", what, err)
		}
	}
	g, err := gate.New(db.Pool, gate.Config{})
	if err == nil {
		err = g.Once(context.Background(), "j", time.Now(), func(context.Context, gate.Run) error { return nil })
		g.Close()
	}
	check("gate.New", err)
	_, err = gate.NewLease(db.Pool, "l", gate.LeaseConfig{AtMost: time.Second})
	check("gate.NewLease", err)
	_, err = gate.NewElector(db.Pool, "e", gate.ElectorConfig{})
	check("gate.NewElector", err)
}

// TestNewUnreachable: a database the constructors cannot reach (a service
// starting while the server restarts) is a warning, not an error: the
// check is for a missing schema, and the first statement reports the rest.
func TestNewUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+addr+"/x?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	g, err := gate.New(pool, gate.Config{Logger: log})
	if err != nil {
		t.Fatalf("gate.New on an unreachable database: %v; want a warning only", err)
	}
	g.Close()
	if _, err := gate.NewLease(pool, "l", gate.LeaseConfig{Logger: log, AtMost: time.Second}); err != nil {
		t.Fatalf("gate.NewLease on an unreachable database: %v", err)
	}
	if _, err := gate.NewElector(pool, "e", gate.ElectorConfig{Logger: log}); err != nil {
		t.Fatalf("gate.NewElector on an unreachable database: %v", err)
	}
	if n := strings.Count(buf.String(), "could not check pgclaim's tables"); n != 3 {
		t.Errorf("%d warnings, want 3:\n%s", n, buf.String())
	}
}
