package robfig

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/internal/crontest"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

// everySecond is the schedule the tests fire on.
func everySecond(t testing.TB) cron.Schedule {
	t.Helper()
	s, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("* * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// shifted is sched as seen by an instance whose clock reads skew ahead of
// real time: the cron fires when that clock reaches an instant, which is
// skew earlier in real time.
type shifted struct {
	sched cron.Schedule
	skew  time.Duration
}

func (s shifted) Next(t time.Time) time.Time { return s.sched.Next(t.Add(s.skew)).Add(-s.skew) }

// instance is one scheduler of a test: its name, its clock skew, and
// whether it wraps a plain cron.Job instead of using NewJob.
type instance struct {
	holder string
	skew   time.Duration
	wrap   bool
}

// runSchedulers runs one robfig cron per instance, each with its own pool
// and gate on one database, firing the same every-second job for about
// four seconds, and checks that every tick all instances fired ran exactly
// once, and no tick ran twice.
func runSchedulers(t *testing.T, insts ...instance) {
	db := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, crontest.RunsTable); err != nil {
		t.Fatal(err)
	}
	sched := everySecond(t)
	obs := &crontest.Seen{}
	var crons []*cron.Cron
	for _, in := range insts {
		pool := db.NewPool(t)
		g, err := gate.New(pool, gate.Config{Holder: in.holder, Hooks: obs.Hooks(in.holder)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		c := cron.New(cron.WithSeconds())
		opts := Config{Location: c.Location(), now: func() time.Time { return time.Now().Add(in.skew) }}
		if in.wrap {
			// The wrapped job does not know its tick: it reads it from
			// the ledger row its gate holds open while it runs, so a run
			// that starts late is still counted for its own tick.
			w, err := Wrap(g, "report", sched, opts)
			if err != nil {
				t.Fatal(err)
			}
			holder := in.holder
			c.Schedule(shifted{sched, in.skew}, w(cron.FuncJob(func() {
				if _, err := pool.Exec(ctx, `INSERT INTO runs
					SELECT fire_at, holder FROM pgclaim_ticks
					 WHERE job = 'report' AND holder = $1 AND finished_at IS NULL`, holder); err != nil {
					t.Error(err)
				}
			})))
		} else {
			job, err := NewJob(g, "report", sched, func(ctx context.Context, run gate.Run) error {
				// Hold the lock a little, so the other instance meets it.
				time.Sleep(50 * time.Millisecond)
				_, err := pool.Exec(ctx, `INSERT INTO runs VALUES ($1, $2)`, run.FireAt, run.Holder)
				return err
			}, opts)
			if err != nil {
				t.Fatal(err)
			}
			c.Schedule(shifted{sched, in.skew}, job)
		}
		crons = append(crons, c)
	}
	for _, c := range crons {
		c.Start()
	}
	time.Sleep(4 * time.Second)
	for _, c := range crons {
		<-c.Stop().Done()
	}

	holders := make([]string, len(insts))
	for i, in := range insts {
		holders[i] = in.holder
	}
	obs.Unexpected(t)
	runs := crontest.RunsPerTick(t, db.Pool)
	for at, hs := range runs {
		if len(hs) != 1 {
			t.Errorf("tick %s ran %d times (by %v), want once", at.Format(time.RFC3339Nano), len(hs), hs)
		}
	}
	common := obs.All(holders...)
	if len(common) < 2 {
		t.Fatalf("only %d ticks were fired by all of %v; want at least 2 (runs: %v)", len(common), holders, runs)
	}
	for _, at := range common {
		if len(runs[at]) != 1 {
			t.Errorf("tick %s fired by all of %v ran %d times, want once", at.Format(time.RFC3339Nano), holders, len(runs[at]))
		}
	}

	// The ledger names the instance that ran each tick.
	rows, err := db.Pool.Query(ctx, `SELECT fire_at, holder, outcome FROM pgclaim_ticks WHERE job = 'report'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var at time.Time
		var h, out string
		if err := rows.Scan(&at, &h, &out); err != nil {
			t.Fatal(err)
		}
		n++
		if out != string(gate.OutcomeSucceeded) {
			t.Errorf("ledger: tick %s outcome %q, want succeeded", at.Format(time.RFC3339Nano), out)
		}
		if got := runs[at.UTC()]; len(got) == 1 && got[0] != h {
			t.Errorf("ledger: tick %s run by %q, but the ledger says %q", at.Format(time.RFC3339Nano), got[0], h)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(runs) {
		t.Errorf("ledger has %d ticks, runs table %d", n, len(runs))
	}
	t.Logf("%d ticks ran, %d fired by every instance", len(runs), len(common))
}

func TestTwoSchedulersOneRunPerTick(t *testing.T) {
	t.Parallel()
	runSchedulers(t, instance{holder: "a"}, instance{holder: "b"})
}

func TestTwoSchedulersSkewedClocks(t *testing.T) {
	t.Parallel()
	// b's clock is 400ms ahead and c's 400ms behind: they fire each tick
	// 800ms apart in real time, yet name the same instant.
	runSchedulers(t, instance{holder: "b", skew: 400 * time.Millisecond}, instance{holder: "c", skew: -400 * time.Millisecond})
}

func TestTwoSchedulersWrap(t *testing.T) {
	t.Parallel()
	runSchedulers(t, instance{holder: "a", wrap: true}, instance{holder: "b", wrap: true, skew: 300 * time.Millisecond})
}

func TestCatchUp(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	var mu sync.Mutex
	var ran []time.Time
	fn := func(_ context.Context, run gate.Run) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, run.FireAt)
		return nil
	}
	// Hourly from 30 s ago: both calls see the same latest instant however
	// long the test takes (an every-second schedule would offer the second
	// call a new, unrun instant whenever a second boundary passes between them).
	sched := hourlyFrom{at: time.Now().Add(-30 * time.Second).Truncate(time.Second)}
	var errs []error
	for _, h := range []string{"a", "b"} {
		g, err := gate.New(db.NewPool(t), gate.Config{Holder: h})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		job, err := NewJob(g, "report", sched, fn, Config{})
		if err != nil {
			t.Fatal(err)
		}
		errs = append(errs, job.CatchUp(context.Background(), time.Minute))
	}
	if errs[0] != nil {
		t.Fatalf("first CatchUp: %v", errs[0])
	}
	if !errors.Is(errs[1], gate.ErrSkipped) {
		t.Fatalf("second CatchUp: got %v, want gate.ErrSkipped", errs[1])
	}
	if len(ran) != 1 || !ran[0].Equal(sched.at) {
		t.Fatalf("catch-up ran for %v, want once for %v", ran, sched.at)
	}
}

// hourlyFrom is a cron.Schedule firing every hour from at.
type hourlyFrom struct{ at time.Time }

func (h hourlyFrom) Next(t time.Time) time.Time {
	if t.Before(h.at) {
		return h.at
	}
	return h.at.Add((t.Sub(h.at)/time.Hour + 1) * time.Hour)
}

func TestClockOutsideTolerance(t *testing.T) {
	t.Parallel()
	g, err := gate.New(pgtest.Pool(t), gate.Config{SkewTolerance: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	ran := false
	job, err := NewJob(g, "report", everySecond(t), func(context.Context, gate.Run) error {
		ran = true
		return nil
	}, Config{Location: time.UTC, now: func() time.Time { return time.Now().Add(time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := job.fire(context.Background()); !errors.Is(err, gate.ErrClockSkew) {
		t.Fatalf("fire with a clock a minute ahead: got %v, want gate.ErrClockSkew", err)
	}
	if ran {
		t.Fatal("job ran although its clock was outside the tolerance")
	}
}

func TestNoInstant(t *testing.T) {
	t.Parallel()
	g, err := gate.New(pgtest.Pool(t), gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	// Daily at 03:17:29 UTC: with a MaxDelay of 1s, a run started at any
	// other second has no instant to count for.
	daily, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("CRON_TZ=UTC 29 17 3 * * *")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	job, err := NewJob(g, "report", daily, func(context.Context, gate.Run) error {
		t.Error("job ran without an instant")
		return nil
	}, Config{MaxDelay: time.Second, now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	if err := job.fire(context.Background()); !errors.Is(err, ErrNoInstant) {
		t.Fatalf("got %v, want ErrNoInstant", err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	g, err := gate.New(pgtest.Pool(t), gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	sched := everySecond(t)
	fn := func(context.Context, gate.Run) error { return nil }
	every90, err := cron.ParseStandard("@every 90s")
	if err != nil {
		t.Fatal(err)
	}
	never, err := cron.ParseStandard("0 0 30 2 *") // 30 February
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		g     *gate.Gate
		job   string
		sched cron.Schedule
		fn    gate.Func
		opts  Config
		field string
	}{
		{"nil gate", nil, "report", sched, fn, Config{}, "robfig: g: must not be nil"},
		{"empty name", g, "", sched, fn, Config{}, "robfig: name: must not be empty"},
		{"nil schedule", g, "report", nil, fn, Config{}, "robfig: sched: must not be nil"},
		{"nil fn", g, "report", sched, nil, Config{}, "robfig: fn: must not be nil"},
		{"negative MaxDelay", g, "report", sched, fn, Config{MaxDelay: -time.Second}, "robfig: MaxDelay: must not be negative"},
		{"@every", g, "report", every90, fn, Config{}, "robfig: sched: instants are not fixed in time"},
		{"no instant", g, "report", never, fn, Config{}, "robfig: sched: has no instant after now"},
		{"spec without CRON_TZ, no Location", g, "report", sched, fn, Config{}, "robfig: Location: must be set for a spec without CRON_TZ"},
	}
	// "@every 1s" fires on every whole second on every instance: accepted.
	if _, err := NewJob(g, "report", cron.Every(time.Second), fn, Config{}); err != nil {
		t.Errorf("NewJob with @every 1s: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j, err := NewJob(c.g, c.job, c.sched, c.fn, c.opts)
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, gate.ErrInvalid) || !strings.HasPrefix(err.Error(), c.field) {
					t.Errorf("%s: got %v, want gate.ErrInvalid starting %q", what, err, c.field)
				}
			}
			check("NewJob", err)
			if j != nil {
				t.Errorf("NewJob returned a job with an error")
			}
			if c.fn != nil {
				w, err := Wrap(c.g, c.job, c.sched, c.opts)
				check("Wrap", err)
				if w != nil {
					t.Errorf("Wrap returned a wrapper with an error")
				}
			}
		})
	}
}

// Compile-time check: a Job is a cron.Job.
var _ cron.Job = (*Job)(nil)

// TestMaxDelayFollowsSkewTolerance: without Config.MaxDelay a job may start
// as late as its gate's skew tolerance allows (see crontest).
func TestMaxDelayFollowsSkewTolerance(t *testing.T) {
	t.Parallel()
	crontest.MaxDelayFollowsSkewTolerance(t, func(g *gate.Gate, name string, sched crontest.Daily, fn gate.Func, maxDelay time.Duration) (func(context.Context) error, error) {
		job, err := NewJob(g, name, sched, fn, Config{MaxDelay: maxDelay})
		if err != nil {
			return nil, err
		}
		return job.fire, nil
	}, ErrNoInstant)
}

// TestRunAt: RunAt fires the job for a chosen instant (see crontest.RunAt).
func TestRunAt(t *testing.T) {
	t.Parallel()
	crontest.RunAt(t, "robfig", func(g *gate.Gate, name string, loc *time.Location, fn gate.Func) (func(context.Context, time.Time) error, error) {
		sched, err := cron.ParseStandard("0 9 * * *")
		if err != nil {
			return nil, err
		}
		job, err := NewJob(g, name, sched, fn, Config{Location: loc})
		if err != nil {
			return nil, err
		}
		return job.RunAt, nil
	})
}
