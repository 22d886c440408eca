package schedule

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/harness/standbytest"
)

// lockedBuffer is a log the scheduler and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReadOnlyServer: a scheduler whose address points at a hot standby
// (as a writer's DNS name does for a while after a failover) says once that
// it reaches a read-only server, not at every retry; once the address
// points at the primary, its sessions reach the primary and the schedule
// runs.
func TestReadOnlyServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pair, primary := standbytest.New(t, ctx)
	effectsTable(t, primary)
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}

	pc, address := pgprobe.SwitchConfig(t, pair.StandbyURL("app"))
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	logs := &lockedBuffer{}
	s, err := New(pool, Config{Holder: "a", PollInterval: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	// Registering writes: refused on the standby, with an error that says
	// why.
	def := Definition{Name: "ro", Spec: "* * * * * *", Version: 1}
	err = s.Register(ctx, def, effect(pool))
	if err == nil || !strings.Contains(err.Error(), "read-only server") {
		t.Fatalf("Register on a standby: %v, want an error saying the server is read-only", err)
	}
	address.Point(t, pair.PrimaryURL("app"))
	time.Sleep(100 * time.Millisecond)
	if err := s.Register(ctx, def, effect(pool)); err != nil {
		t.Fatalf("Register once the address points at the primary: %v", err)
	}
	address.Point(t, pair.StandbyURL("app"))
	pool.Reset()

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() { stop(); <-done }()
	time.Sleep(3 * time.Second) // instants due, every statement refused
	said := strings.Count(logs.String(), `msg="schedule: this connection reaches a read-only server`)
	if said != 1 {
		t.Errorf("the read-only server reported %d times in 3 s, want once; the log:\n%s", said, logs.String())
	}
	select {
	case err := <-done:
		t.Fatalf("Run ended on the standby: %v", err)
	default:
	}
	// An advisory lock on the standby would exclude nobody on the primary.
	standby, err := pgx.Connect(ctx, pair.StandbyURL("app"))
	if err != nil {
		t.Fatal(err)
	}
	var held int
	if err := standby.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	_ = standby.Close(ctx)
	if held != 0 {
		t.Errorf("%d advisory locks held on the standby", held)
	}

	address.Point(t, pair.PrimaryURL("app"))
	deadline := time.Now().Add(30 * time.Second)
	var runs int
	for {
		if err := primary.QueryRow(ctx, `SELECT count(*) FROM effects WHERE schedule = 'ro'`).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs within 30 s of the address pointing at the primary; the log:\n%s", runs, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the log:\n%s", logs.String())
}
