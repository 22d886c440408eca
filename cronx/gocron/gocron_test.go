package gocron

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	gocronv2 "github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/cronx/internal/crontest"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

const everySecond = "* * * * * *"

// shiftedCron is gocron's cron as seen by an instance whose clock reads
// skew ahead of real time: it fires when that clock reaches an instant,
// which is skew earlier in real time.
type shiftedCron struct {
	gocronv2.Cron
	skew time.Duration
}

func (s shiftedCron) Next(t time.Time) time.Time { return s.Cron.Next(t.Add(s.skew)).Add(-s.skew) }

// noDuplicates fails for every tick that ran more than once.
func noDuplicates(t testing.TB, runs map[time.Time][]string) {
	t.Helper()
	for at, hs := range runs {
		if len(hs) != 1 {
			t.Errorf("tick %s ran %d times (by %v), want once", at.Format(time.RFC3339Nano), len(hs), hs)
		}
	}
}

// contiguous fails unless the ticks that ran are consecutive seconds, at
// least n of them: no tick between the first and the last was lost.
func contiguous(t testing.TB, runs map[time.Time][]string, n int) {
	t.Helper()
	var ticks []time.Time
	for at := range runs {
		ticks = append(ticks, at)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
	if len(ticks) < n {
		t.Fatalf("%d ticks ran, want at least %d", len(ticks), n)
	}
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != time.Second {
			t.Errorf("ticks %s and %s are %s apart: a tick between was lost", ticks[i-1].Format(time.RFC3339), ticks[i].Format(time.RFC3339), d)
		}
	}
}

// newScheduler returns a started gocron scheduler, shut down at cleanup.
func newScheduler(t testing.TB, opts ...gocronv2.SchedulerOption) gocronv2.Scheduler {
	t.Helper()
	s, err := gocronv2.NewScheduler(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// recordRun returns a gocron task function recording one run of tick at
// the second the instance's clock (real time + skew) reads.
func recordRun(t testing.TB, pool *pgxpool.Pool, holder string, skew time.Duration) func() {
	return func() {
		at := time.Now().Add(skew).Truncate(time.Second)
		if _, err := pool.Exec(context.Background(), `INSERT INTO runs VALUES ($1, $2)`, at, holder); err != nil {
			t.Error(err)
		}
	}
}

// runLocked runs two schedulers on one database, each with its own pool and
// a Locker with atLeast, firing the same job every second; b's clock is
// skew behind a's. It returns who ran each tick.
func runLocked(t *testing.T, atLeast, skew time.Duration) map[time.Time][]string {
	db := pgtest.NewDatabase(t)
	if _, err := db.Pool.Exec(context.Background(), crontest.RunsTable); err != nil {
		t.Fatal(err)
	}
	var scheds []gocronv2.Scheduler
	for _, in := range []struct {
		holder string
		skew   time.Duration
	}{{"a", 0}, {"b", -skew}} {
		pool := db.NewPool(t)
		// NewLocker refuses AtLeast 0; the control builds one anyway.
		opts := gate.LeaseConfig{Holder: in.holder, AtMost: 5 * time.Second, AtLeast: atLeast}
		locker := &Locker{pool: pool, cfg: opts, leases: map[string]*gate.Lease{}}
		s := newScheduler(t, gocronv2.WithDistributedLocker(locker))
		_, err := s.NewJob(gocronv2.CronJob(everySecond, true), gocronv2.NewTask(recordRun(t, pool, in.holder, in.skew)),
			gocronv2.WithName("report"), gocronv2.WithCronImplementation(shiftedCron{gocronv2.NewDefaultCron(true), in.skew}))
		if err != nil {
			t.Fatal(err)
		}
		scheds = append(scheds, s)
	}
	for _, s := range scheds {
		s.Start()
	}
	time.Sleep(4 * time.Second)
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	return crontest.RunsPerTick(t, db.Pool)
}

// The Locker's at-least keeps a fast job from running again on an instance
// whose clock is late: b fires every tick 300ms after a, when a's job has
// long finished, and still finds the lock held.
func TestLockerOneRunPerTick(t *testing.T) {
	t.Parallel()
	runs := runLocked(t, 600*time.Millisecond, 300*time.Millisecond)
	noDuplicates(t, runs)
	contiguous(t, runs, 3)
	t.Logf("%d ticks ran", len(runs))
}

// Control: without at-least, the same setup runs ticks twice — the problem
// the Locker's at-least fixes.
func TestLockerWithoutAtLeastRunsTwice(t *testing.T) {
	t.Parallel()
	runs := runLocked(t, 0, 300*time.Millisecond)
	twice := 0
	for _, hs := range runs {
		if len(hs) > 1 {
			twice++
		}
	}
	if twice == 0 {
		t.Fatalf("no tick ran twice without AtLeast (runs: %v); the at-least test proves nothing", runs)
	}
	t.Logf("%d of %d ticks ran twice without AtLeast", twice, len(runs))
}

func TestLocker(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	opts := func(h string) gate.LeaseConfig {
		return gate.LeaseConfig{Holder: h, AtMost: 5 * time.Second, AtLeast: 300 * time.Millisecond}
	}
	a, err := NewLocker(db.Pool, opts("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewLocker(db.NewPool(t), opts("b"))
	if err != nil {
		t.Fatal(err)
	}
	// AtLeast counts from the lock's start, not its unlock.
	start := time.Now()
	la, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(ctx, "report"); !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("second lock: got %v, want gate.ErrHeld", err)
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	early, err := b.Lock(ctx, "report")
	if time.Since(start) < 250*time.Millisecond && !errors.Is(err, gate.ErrHeld) {
		t.Fatalf("lock right after unlock: got %v, want gate.ErrHeld until AtLeast passed", err)
	}
	if err == nil { // the machine was too slow to tell; let go
		if err := early.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		t.Log("at-least not checked: the lock attempt came too late")
	}
	lo, err := b.Lock(ctx, "other")
	if err != nil {
		t.Fatalf("a lock of another name: %v", err)
	}
	if err := lo.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	lb, err := b.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("lock after AtLeast: %v", err)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lb.Unlock(ctx); !errors.Is(err, gate.ErrReleased) {
		t.Fatalf("second unlock: got %v, want gate.ErrReleased", err)
	}
}

// gocron unlocks with the job's context, cancelled when the scheduler
// shuts down mid-run: the lease is released all the same, and free after
// AtLeast rather than AtMost.
func TestUnlockWithCancelledContext(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	opts := func(h string) gate.LeaseConfig {
		return gate.LeaseConfig{Holder: h, AtMost: time.Minute, AtLeast: 100 * time.Millisecond}
	}
	a, err := NewLocker(db.Pool, opts("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewLocker(db.NewPool(t), opts("b"))
	if err != nil {
		t.Fatal(err)
	}
	jobCtx, cancel := context.WithCancel(context.Background())
	la, err := a.Lock(jobCtx, "report")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := la.Unlock(jobCtx); err != nil {
		t.Fatalf("Unlock with a cancelled context: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	lb, err := b.Lock(context.Background(), "report")
	if err != nil {
		t.Fatalf("lock after AtLeast: %v (the lease was not released)", err)
	}
	if err := lb.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Tasks from NewTask go through the tick ledger: once per tick, even with
// the two instances' clocks 800ms apart.
func TestTaskOneRunPerTick(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, crontest.RunsTable); err != nil {
		t.Fatal(err)
	}
	sched, err := CronSchedule(everySecond, true, time.Local) // the schedulers' location
	if err != nil {
		t.Fatal(err)
	}
	obs := &crontest.Seen{}
	var scheds []gocronv2.Scheduler
	for _, in := range []struct {
		holder string
		skew   time.Duration
	}{{"b", 400 * time.Millisecond}, {"c", -400 * time.Millisecond}} {
		pool := db.NewPool(t)
		g, err := gate.New(pool, gate.Config{Holder: in.holder, Hooks: obs.Hooks(in.holder)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		skew := in.skew
		task, err := NewTask(g, "report", sched, func(ctx context.Context, run gate.Run) error {
			time.Sleep(50 * time.Millisecond) // hold the lock a little
			_, err := pool.Exec(ctx, `INSERT INTO runs VALUES ($1, $2)`, run.FireAt, run.Holder)
			return err
		}, TaskConfig{now: func() time.Time { return time.Now().Add(skew) }})
		if err != nil {
			t.Fatal(err)
		}
		s := newScheduler(t)
		_, err = s.NewJob(gocronv2.CronJob(everySecond, true), task, gocronv2.WithName("report"),
			gocronv2.WithCronImplementation(shiftedCron{gocronv2.NewDefaultCron(true), in.skew}))
		if err != nil {
			t.Fatal(err)
		}
		scheds = append(scheds, s)
	}
	for _, s := range scheds {
		s.Start()
	}
	time.Sleep(4 * time.Second)
	obs.Stop()
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	obs.Unexpected(t)
	runs := crontest.RunsPerTick(t, db.Pool)
	noDuplicates(t, runs)
	common := obs.All("b", "c")
	if len(common) < 2 {
		t.Fatalf("only %d ticks were fired by both instances; want at least 2 (runs: %v)", len(common), runs)
	}
	for _, at := range common {
		if len(runs[at]) != 1 {
			t.Errorf("tick %s fired by both ran %d times, want once", at.Format(time.RFC3339Nano), len(runs[at]))
		}
	}
	t.Logf("%d ticks ran, %d fired by both", len(runs), len(common))
}

// With the Elector only the leader runs the job; when it resigns between
// two ticks the standby runs the next ones, and no tick runs twice.
func TestElectorOneRunPerTick(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := db.Pool.Exec(ctx, crontest.RunsTable); err != nil {
		t.Fatal(err)
	}
	electors := map[string]*gate.Elector{}
	var wg sync.WaitGroup
	var scheds []gocronv2.Scheduler
	for _, h := range []string{"a", "b"} {
		pool := db.NewPool(t)
		ge, err := gate.NewElector(pool, "scheduler", gate.ElectorConfig{Holder: h, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		electors[h] = ge
		e, err := NewElector(ge)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.Run(ctx); !errors.Is(err, context.Canceled) {
				t.Errorf("Elector.Run: %v", err)
			}
		}()
		s := newScheduler(t, gocronv2.WithDistributedElector(e))
		if _, err := s.NewJob(gocronv2.CronJob(everySecond, true), gocronv2.NewTask(recordRun(t, pool, h, 0)), gocronv2.WithName("report")); err != nil {
			t.Fatal(err)
		}
		scheds = append(scheds, s)
	}
	// Start the schedulers once there is a leader, half-way between ticks.
	leader := ""
	for deadline := time.Now().Add(5 * time.Second); leader == ""; {
		for h, e := range electors {
			if e.IsLeader() {
				leader = h
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1500 * time.Millisecond)))
	for _, s := range scheds {
		s.Start()
	}
	time.Sleep(2 * time.Second) // two ticks on the first leader
	if err := electors[leader].Resign(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // two on the other
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()

	runs := crontest.RunsPerTick(t, db.Pool)
	noDuplicates(t, runs)
	contiguous(t, runs, 4)
	by := map[string]int{}
	for _, hs := range runs {
		for _, h := range hs {
			by[h]++
		}
	}
	if by["a"] == 0 || by["b"] == 0 {
		t.Errorf("runs by instance %v: want both to have led", by)
	}
	t.Logf("%d ticks ran, by instance %v", len(runs), by)
}

func TestElectorNotLeader(t *testing.T) {
	t.Parallel()
	ge, err := gate.NewElector(pgtest.Pool(t), "scheduler", gate.ElectorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewElector(ge)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.IsLeader(context.Background()); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("IsLeader before campaigning: got %v, want ErrNotLeader", err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	g, err := gate.New(pool, gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	sched, err := CronSchedule(everySecond, true, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, gate.Run) error { return nil }
	check := func(what string, err error, prefix string) {
		t.Helper()
		if !errors.Is(err, gate.ErrInvalid) || !strings.HasPrefix(err.Error(), prefix) {
			t.Errorf("%s: got %v, want gate.ErrInvalid starting %q", what, err, prefix)
		}
	}

	lease := gate.LeaseConfig{AtMost: time.Second, AtLeast: 100 * time.Millisecond}
	_, err = NewLocker(nil, lease)
	check("NewLocker nil pool", err, "gocron: pool: must not be nil")
	_, err = NewLocker(pool, gate.LeaseConfig{AtLeast: 100 * time.Millisecond})
	check("NewLocker zero AtMost", err, "gate: LeaseConfig.AtMost")
	_, err = NewLocker(pool, gate.LeaseConfig{AtMost: time.Second})
	check("NewLocker zero AtLeast", err, "gocron: LeaseConfig.AtLeast: must be set")
	_, err = NewLocker(pool, gate.LeaseConfig{AtMost: time.Second, AtLeast: 2 * time.Second})
	check("NewLocker AtLeast > AtMost", err, "gate: LeaseConfig.AtLeast")
	l, err := NewLocker(pool, lease)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Lock(context.Background(), "")
	check("Lock empty key", err, "gocron: key: must not be empty")

	_, err = NewElector(nil)
	check("NewElector nil", err, "gocron: e: must not be nil")

	_, err = NewTask(nil, "report", sched, fn, TaskConfig{})
	check("NewTask nil gate", err, "gocron: g: must not be nil")
	_, err = NewTask(g, "", sched, fn, TaskConfig{})
	check("NewTask empty name", err, "gocron: name: must not be empty")
	_, err = NewTask(g, "report", nil, fn, TaskConfig{})
	check("NewTask nil schedule", err, "gocron: sched: must not be nil")
	_, err = NewTask(g, "report", sched, nil, TaskConfig{})
	check("NewTask nil fn", err, "gocron: fn: must not be nil")
	_, err = NewTask(g, "report", sched, fn, TaskConfig{MaxDelay: -time.Second})
	check("NewTask negative MaxDelay", err, "gocron: MaxDelay: must not be negative")
	_, err = NewTask(g, "report", interval(90*time.Second), fn, TaskConfig{})
	check("NewTask interval schedule", err, "gocron: sched: instants are not fixed in time")

	_, err = CronSchedule("", true, nil)
	check("CronSchedule empty", err, "gocron: crontab: must not be empty")
	_, err = CronSchedule("0 9 * * *", false, nil)
	check("CronSchedule nil loc", err, "gocron: loc: must not be nil for a crontab without CRON_TZ")
	if _, err := CronSchedule("CRON_TZ=Asia/Seoul 0 9 * * *", false, nil); err != nil {
		t.Errorf("CronSchedule with CRON_TZ and nil loc: %v", err)
	}
	_, err = CronSchedule("61 * * * *", false, time.UTC)
	check("CronSchedule bad minute", err, "gocron: crontab:")
	if !errors.Is(err, gocronv2.ErrCronJobParse) {
		t.Errorf("CronSchedule bad minute: got %v, want it to wrap gocron.ErrCronJobParse", err)
	}
}

// interval counts d from t: instants no two instances share.
type interval time.Duration

func (i interval) Next(t time.Time) time.Time { return t.Add(time.Duration(i)) }

// TestTaskMaxDelayFollowsSkewTolerance: without TaskConfig.MaxDelay a task
// may start as late as its gate's skew tolerance allows (see crontest).
func TestTaskMaxDelayFollowsSkewTolerance(t *testing.T) {
	t.Parallel()
	crontest.MaxDelayFollowsSkewTolerance(t, func(g *gate.Gate, name string, sched crontest.Daily, fn gate.Func, maxDelay time.Duration) (func(context.Context) error, error) {
		return taskFunc(g, name, sched, fn, TaskConfig{MaxDelay: maxDelay})
	}, ErrNoInstant)
}

// TestRunAt: RunAt fires the job for a chosen instant (see crontest.RunAt).
func TestRunAt(t *testing.T) {
	t.Parallel()
	crontest.RunAt(t, "gocron", func(g *gate.Gate, name string, loc *time.Location, fn gate.Func) (func(context.Context, time.Time) error, error) {
		sched, err := CronSchedule("0 9 * * *", false, loc)
		if err != nil {
			return nil, err
		}
		job, err := NewJob(g, name, sched, fn, TaskConfig{})
		if err != nil {
			return nil, err
		}
		return job.RunAt, nil
	})
}
