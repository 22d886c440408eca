package gate_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

// Environment of the holder child process (TestHelperHolderProcess).
const (
	envChildURL = "PGCLAIM_GATE_CHILD_URL"
	envChildAt  = "PGCLAIM_GATE_CHILD_AT"
)

// TestHelperHolderProcess is not a test: it is the body of the child process
// TestOnceAbandonedWhenHolderKilled starts and kills. It claims a tick through
// Once, prints "RUNNING <fence>", and waits in the job until it is killed.
func TestHelperHolderProcess(t *testing.T) {
	url := os.Getenv(envChildURL)
	if url == "" {
		t.Skip("runs only as the child process of TestOnceAbandonedWhenHolderKilled")
	}
	at, err := time.Parse(time.RFC3339Nano, os.Getenv(envChildAt))
	if err != nil {
		fmt.Println("bad", envChildAt, err)
		os.Exit(2)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println("pool:", err)
		os.Exit(2)
	}
	g, err := gate.New(pool, gate.Config{Holder: "doomed"})
	if err != nil {
		fmt.Println("gate:", err)
		os.Exit(2)
	}
	err = g.Once(ctx, "job", at, func(ctx context.Context, run gate.Run) error {
		fmt.Println("RUNNING", run.Fence)
		select {} // until killed
	})
	fmt.Println("Once returned:", err)
	os.Exit(2)
}

// abandonedEvents collects EventAbandoned events.
type abandonedEvents struct {
	mu     sync.Mutex
	events []gate.Event
}

func (a *abandonedEvents) Observe(_ context.Context, e gate.Event) {
	if e.Kind == gate.EventAbandoned {
		a.mu.Lock()
		a.events = append(a.events, e)
		a.mu.Unlock()
	}
}

func (a *abandonedEvents) list() []gate.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]gate.Event(nil), a.events...)
}

// onceUntilNotHeld calls g.Once until the lock is no longer held elsewhere
// (the server frees a dead session's locks a moment after it notices).
func onceUntilNotHeld(t *testing.T, g *gate.Gate, name string, at time.Time, fn gate.Func) error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := g.Once(context.Background(), name, at, fn)
		if !errors.Is(err, gate.ErrHeld) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOnceAbandonedWhenHolderKilled: a process holding a tick is killed
// (SIGKILL) mid-run, leaving its ledger row running. The next tick's Once on
// another instance takes the job's lock, marks the old row abandoned in its
// claim statement, reports EventAbandoned, and runs its own tick.
func TestOnceAbandonedWhenHolderKilled(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	at := dbNow(t, db.Pool).Truncate(time.Second)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildURL+"="+db.URL, envChildAt+"="+at.Format(time.RFC3339Nano))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	var childFence int64
	for lines.Scan() {
		if f, ok := strings.CutPrefix(lines.Text(), "RUNNING "); ok {
			childFence, err = strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		t.Logf("child: %s", lines.Text())
	}
	if childFence == 0 {
		t.Fatalf("child did not start its run (%v)", lines.Err())
	}
	if r := ledger(t, db.Pool, "job")[at.UTC()]; r.outcome != "running" || r.holder != "doomed" {
		t.Fatalf("child's tick %+v, want running by doomed", r)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	rec := &abandonedEvents{}
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	heir := newGate(t, db.Pool, "heir", gate.Config{Hooks: rec, Logger: logger})
	next := at.Add(time.Second)
	var ran atomic.Int32
	if err := onceUntilNotHeld(t, heir, "job", next, func(context.Context, gate.Run) error {
		ran.Add(1)
		return nil
	}); err != nil {
		t.Fatalf("next tick: %v", err)
	}
	if ran.Load() != 1 {
		t.Fatalf("next tick ran %d times, want 1", ran.Load())
	}

	rows := ledger(t, db.Pool, "job")
	old := rows[at.UTC()]
	if old.outcome != "abandoned" || !old.done || old.holder != "doomed" || old.fence != childFence ||
		old.errText == nil || !strings.Contains(*old.errText, "session ended before the run finished") ||
		!strings.Contains(*old.errText, "heir") {
		t.Errorf("killed holder's tick %+v (error %q), want abandoned with a reason naming the finder", old, deref(old.errText))
	}
	if r := rows[next.UTC()]; r.outcome != "succeeded" || r.holder != "heir" {
		t.Errorf("next tick %+v, want succeeded by heir", r)
	}
	evs := rec.list()
	if len(evs) != 1 {
		t.Fatalf("%d abandoned events, want 1: %+v", len(evs), evs)
	}
	if e := evs[0]; e.Name != "job" || !e.FireAt.Equal(at) || e.Fence != childFence || e.Holder != "heir" ||
		e.Outcome != gate.OutcomeAbandoned || e.Err == nil || !strings.Contains(e.Err.Error(), "doomed") {
		t.Errorf("abandoned event %+v", e)
	}
	logMu.Lock()
	logged := logs.String()
	logMu.Unlock()
	if want := `level=WARN msg="gate: abandoned" name=job holder=heir`; !strings.Contains(logged, want) || !strings.Contains(logged, "by doomed") {
		t.Errorf("logs lack %q naming doomed:\n%s", want, logged)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestOnceAbandonedAfterBackendTerminated: the holder's session is
// terminated while its job keeps going (it ignores its context). Another
// instance's Once marks the tick abandoned as soon as it gets the lock; when
// the old job finally returns, its own account (lost) replaces that mark.
func TestOnceAbandonedAfterBackendTerminated(t *testing.T) {
	t.Parallel()
	srv := pgtest.Shared(t)
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	a := newGate(t, db.Pool, "a", gate.Config{})
	rec := &abandonedEvents{}
	b := newGate(t, db.NewPool(t), "b", gate.Config{Hooks: rec})
	at := dbNow(t, db.Pool).Truncate(time.Second)

	running, release := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- a.Once(ctx, "job", at, func(context.Context, gate.Run) error {
			close(running)
			<-release // a job that does not watch its context
			return nil
		})
	}()
	<-running
	if err := srv.Terminate(ctx, holderPID(t, db.Pool, "job")); err != nil {
		t.Fatal(err)
	}
	if err := onceUntilNotHeld(t, b, "job", at.Add(time.Second), noop); err != nil {
		t.Fatalf("b: %v", err)
	}
	if r := ledger(t, db.Pool, "job")[at.UTC()]; r.outcome != "abandoned" || r.holder != "a" {
		t.Errorf("a's tick after b's claim: %+v, want abandoned", r)
	}
	if n := len(rec.list()); n != 1 {
		t.Errorf("%d abandoned events, want 1", n)
	}

	close(release)
	if err := <-aDone; !errors.Is(err, gate.ErrLockLost) {
		t.Errorf("a returned %v, want ErrLockLost", err)
	}
	if r := ledger(t, db.Pool, "job")[at.UTC()]; r.outcome != "lost" || r.holder != "a" {
		t.Errorf("a's tick after a returned: %+v, want lost", r)
	}
}

// TestAbandonedEveryLockedPath: a tick left running (its holder's session
// is gone) is marked abandoned by a catch-up, and by Once with a lock wait,
// but not by a ledger-only Once, which holds no lock and so cannot tell a
// dead run from a live one.
func TestAbandonedEveryLockedPath(t *testing.T) {
	t.Parallel()
	const period = time.Hour
	for _, tc := range []struct {
		name      string
		cfg       gate.Config
		catchUp   bool
		abandoned bool
	}{
		{"catch-up", gate.Config{}, true, true},
		{"lock-wait", gate.Config{LockWait: time.Second}, false, true},
		{"catch-up-lock-wait", gate.Config{LockWait: time.Second}, true, true},
		{"ledger-only", gate.Config{LedgerOnly: true}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDatabase(t)
			ctx := context.Background()
			now := dbNow(t, db.Pool)
			latest := now.Truncate(period)
			// Two ticks left running: an old one, and the job's latest.
			older, stale := latest.Add(-6*period), latest.Add(-5*period)
			for _, at := range []time.Time{older, stale} {
				if _, err := db.Pool.Exec(ctx,
					`INSERT INTO pgclaim_ticks (job, fire_at, holder, fence) VALUES ('job', $1, 'ghost', nextval('pgclaim_fence_seq'))`,
					at); err != nil {
					t.Fatal(err)
				}
			}
			rec := &abandonedEvents{}
			tc.cfg.Hooks = rec
			g := newGate(t, db.Pool, "finder", tc.cfg)
			var err error
			if tc.catchUp {
				err = g.CatchUp(ctx, "job", every(period), 2*period, noop)
			} else {
				err = g.Once(ctx, "job", now, noop)
			}
			if err != nil {
				t.Fatal(err)
			}
			rows := ledger(t, db.Pool, "job")
			if tc.abandoned {
				for _, at := range []time.Time{older, stale} {
					if r := rows[at.UTC()]; r.outcome != "abandoned" || !r.done || r.errText == nil {
						t.Errorf("stale tick %s: %+v, want abandoned", at, r)
					}
				}
				if evs := rec.list(); len(evs) != 2 || !evs[0].FireAt.Equal(older) || !evs[1].FireAt.Equal(stale) {
					t.Errorf("abandoned events %+v, want one for %s and one for %s", evs, older, stale)
				}
			} else {
				for _, at := range []time.Time{older, stale} {
					if r := rows[at.UTC()]; r.outcome != "running" {
						t.Errorf("stale tick %s: %+v, want left running", at, r)
					}
				}
				if evs := rec.list(); len(evs) != 0 {
					t.Errorf("abandoned events %+v, want none", evs)
				}
			}
		})
	}
}

// TestLiveRunNeverAbandoned: while a run holds the job's lock, other
// instances — without a wait, with a wait that runs out, and catching up —
// skip with ErrHeld and leave its tick running; it finishes as succeeded.
// Then, under contention (3 instances with a lock wait firing the same ticks,
// so each claim races the previous run's finish and unlock), no tick is ever
// marked abandoned.
func TestLiveRunNeverAbandoned(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	rec := &abandonedEvents{}
	live := newGate(t, db.Pool, "live", gate.Config{Hooks: rec})
	at := dbNow(t, db.Pool).Truncate(time.Second)

	running, release := make(chan struct{}), make(chan struct{})
	liveDone := make(chan error, 1)
	go func() {
		liveDone <- live.Once(ctx, "job", at, func(context.Context, gate.Run) error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	noWait := newGate(t, db.NewPool(t), "no-wait", gate.Config{Hooks: rec})
	waits := newGate(t, db.NewPool(t), "waits", gate.Config{Hooks: rec, LockWait: 100 * time.Millisecond})
	for _, try := range []struct {
		name string
		call func() error
	}{
		{"once", func() error { return noWait.Once(ctx, "job", at.Add(time.Second), noop) }},
		{"once with wait", func() error { return waits.Once(ctx, "job", at.Add(time.Second), noop) }},
		{"catch-up", func() error { return noWait.CatchUp(ctx, "job", every(time.Millisecond), time.Second, noop) }},
		{"catch-up with wait", func() error { return waits.CatchUp(ctx, "job", every(time.Millisecond), time.Second, noop) }},
	} {
		if err := try.call(); !errors.Is(err, gate.ErrHeld) {
			t.Errorf("%s while the job runs: %v, want ErrHeld", try.name, err)
		}
		if r := ledger(t, db.Pool, "job")[at.UTC()]; r.outcome != "running" || r.done {
			t.Fatalf("live tick after %s: %+v, want running", try.name, r)
		}
	}
	close(release)
	if err := <-liveDone; err != nil {
		t.Fatal(err)
	}
	if r := ledger(t, db.Pool, "job")[at.UTC()]; r.outcome != "succeeded" {
		t.Errorf("live tick %+v, want succeeded", r)
	}

	// Contention: every claim but the first of each tick waits for the lock
	// while another run finishes.
	const ticks = 150
	base := at.Add(10 * time.Second)
	var runs [ticks]atomic.Int32
	var wg sync.WaitGroup
	for k := range 3 {
		g := newGate(t, db.NewPool(t), fmt.Sprintf("contender-%d", k), gate.Config{Hooks: rec, LockWait: time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ticks {
				err := g.Once(ctx, "burst", base.Add(time.Duration(i)*time.Millisecond), func(context.Context, gate.Run) error {
					runs[i].Add(1)
					time.Sleep(time.Duration(i%3) * 100 * time.Microsecond)
					return nil
				})
				if err != nil && !errors.Is(err, gate.ErrSkipped) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for i := range ticks {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("tick %d ran %d times, want 1", i, n)
		}
	}
	var abandoned int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_ticks WHERE outcome <> 'succeeded'`).Scan(&abandoned); err != nil {
		t.Fatal(err)
	}
	if abandoned != 0 {
		t.Errorf("%d ticks not succeeded, want 0", abandoned)
	}
	if evs := rec.list(); len(evs) != 0 {
		t.Errorf("abandoned events %+v, want none", evs)
	}
}
