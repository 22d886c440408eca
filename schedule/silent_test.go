package schedule

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestSilentNetworkAdvisory: the network between the scheduler running an
// attempt and the server goes silent (connections open, nothing answered)
// while the schedule has the default 30 s lease, so the run's lease alone
// would keep the attempt going for 27 s. The server frees the silent
// holder's advisory lock at the soonest its TCP keepalive allows (6 s after
// the silence; the test ends the session itself then, since the blackhole
// keeps the server's side alive), and another instance takes the run over
// as the next attempt. The silent attempt's context must have ended before
// the other attempt starts.
func TestSilentNetworkAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	cfg, bh := pgprobe.BlackholeConfig(t, db.Pool)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(bh.Cut) // first: what still waits on the silent network fails
	// Logs to stderr: the silent scheduler may log after the test ends.
	silent, err := New(pool, Config{Holder: "silent", PollInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var cancelledAt, otherAt time.Time
	var cause error
	started := make(chan Run, 1)
	job := func(ctx context.Context, r Run) error {
		if r.Holder == "silent" {
			started <- r
			<-ctx.Done()
			mu.Lock()
			cancelledAt, cause = time.Now(), context.Cause(ctx)
			mu.Unlock()
			return ctx.Err()
		}
		mu.Lock()
		if otherAt.IsZero() {
			otherAt = time.Now()
		}
		mu.Unlock()
		return nil
	}
	def := Definition{Name: "resume", Spec: "*/2 * * * * *", Version: 1}
	if err := silent.Register(ctx, def, job); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- silent.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Log("the silent scheduler's Run had not returned 20 s after its stop")
		}
	})
	var first Run
	select {
	case first = <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("no run started")
	}
	pid := lockPID(t, db, def.Name)

	time.Sleep(1500 * time.Millisecond)
	silentAt := time.Now()
	bh.Silence()
	other := newInstance(t, db, "direct", Config{PollInterval: 200 * time.Millisecond}, nil)
	if err := other.s.Register(ctx, def, job); err != nil {
		t.Fatal(err)
	}
	other.start(t)
	// The server's keepalive gives up on the silent client: 11 s after the
	// last packet, which a quiet connection exchanges every 5 s at most.
	drop := time.AfterFunc(6*time.Second, func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	})
	defer drop.Stop()
	waitFor(t, 25*time.Second, "the other instance to run the schedule", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !otherAt.IsZero()
	})
	mu.Lock()
	c, o, why := cancelledAt, otherAt, cause
	mu.Unlock()
	if c.IsZero() {
		t.Fatalf("attempt %d of %v (silent holder) still running when the other instance's attempt started, %v after the network went silent",
			first.Attempt, first.Instant, o.Sub(silentAt).Round(time.Millisecond))
	}
	t.Logf("silent attempt cancelled %v after the network went silent (cause: %v); the other instance's run started %v after; margin %v",
		c.Sub(silentAt).Round(time.Millisecond), why, o.Sub(silentAt).Round(time.Millisecond), o.Sub(c).Round(time.Millisecond))
	if !c.Before(o) {
		t.Errorf("runs overlapped by %v", c.Sub(o))
	}
}
