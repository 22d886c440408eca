package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/examples/pushresume/db"
	"github.com/pgclaim/pgclaim/schedule"
)

const (
	// job is the schedule's name: its row in pgclaim_schedules and its
	// runs in pgclaim_schedule_runs.
	job = "push-resume"
	// spec and zone are the field's schedule: every day at 09:00 in Seoul.
	spec = "0 9 * * *"
	zone = "Asia/Seoul"
)

// pushTable describes push_requests to pgclaim's claim package. Its rows
// move PAUSED → READY by the 09:00 job's resume (one statement), then
// READY → PROCESSING → SENT (or FAILED) by the claim workers of every
// instance.
var pushTable = claim.Table{
	Name:       "push_requests",
	Key:        "id",
	State:      "status",
	ClaimedAt:  "claimed_at",
	ClaimedBy:  "claimed_by",
	Fence:      "fence",
	LeaseUntil: "lease_until",
	Attempts:   "attempts",
	Reason:     "fail_reason",
}

// definition is the resume job's schedule as every instance declares it.
// The policies:
//   - CatchUpLatest within catchUp: a service that was down at 09:00 runs
//     the missed resume when it comes back within the window (one run
//     resumes everything due, so running only the latest loses nothing);
//     older instants are recorded skipped, saying why.
//   - OverlapSkip: a 09:00 that comes due while yesterday's run is still
//     running is recorded skipped; the running one resumes the same rows.
//   - Retry: 3 attempts (an attempt whose instance died counts), 5 s back-off
//     after a failed one. Each attempt resumes what is still PAUSED (nothing,
//     once an earlier attempt's resume committed) and waits for the same
//     rows; the pushes themselves are sent through claims, once each.
//
// demoAt, when set, moves the daily 09:00 to demoAt's time of day (Seoul),
// to seconds: the demo's clock. A real service uses the spec as it is.
func definition(demoAt time.Time, catchUp time.Duration) (schedule.Definition, error) {
	d := schedule.Definition{
		Name:             job,
		Spec:             spec,
		TimeZone:         zone,
		Version:          1,
		CatchUp:          schedule.CatchUpLatest,
		CatchUpWindow:    catchUp,
		Overlap:          schedule.OverlapSkip,
		Retry:            schedule.RetryPolicy{MaxAttempts: 3, Backoff: 5 * time.Second},
		ExpectedDuration: time.Minute,
	}
	if !demoAt.IsZero() {
		var err error
		if d.Spec, err = demoSpec(demoAt); err != nil {
			return d, err
		}
	}
	return d, nil
}

// demoSpec is the daily spec (six fields, seconds first) firing at t's time
// of day in the schedule's zone.
func demoSpec(t time.Time) (string, error) {
	loc, err := time.LoadLocation(zone) // from time/tzdata when the system has no zone database
	if err != nil {
		return "", err
	}
	t = t.In(loc)
	return fmt.Sprintf("%d %d %d * * *", t.Second(), t.Minute(), t.Hour()), nil
}

// instanceConfig configures one instance of the push service.
type instanceConfig struct {
	URL         string        // database
	Name        string        // role shown by the demo ("active", "standby")
	SendDelay   time.Duration // how long one "send" to the push provider takes
	Batch       int           // rows claimed per statement
	Lease       time.Duration // claim lease; heartbeats extend it while a push is sent
	StaleAfter  time.Duration // the field's rule: PROCESSING this long → FAILED
	MaxAttempts int           // claims a push gets before a stale claim fails it
	SweepEvery  time.Duration // how often a run waiting for its pushes sweeps for a dead instance's claims
	Poll        time.Duration // the scheduler's poll: how soon a dead runner's instant is taken over
	WorkerPoll  time.Duration // the workers' poll: the safety net for a READY row whose announcement was lost
	DailyAt     time.Time     // the demo's 09:00; zero: not known yet (the demo sends it)
	CatchUp     time.Duration // the schedule's catch-up window
	Verbose     bool          // pgclaim's logs on standard error
}

func (c *instanceConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "database-url", "", "database connection string (required)")
	fs.StringVar(&c.Name, "name", "instance", "role name shown in the demo")
	fs.DurationVar(&c.SendDelay, "send-delay", 20*time.Millisecond, "time one push takes to send")
	fs.IntVar(&c.Batch, "batch", 10, "pushes claimed per statement")
	fs.DurationVar(&c.Lease, "lease", 2*time.Second, "claim lease, extended while a push is sent")
	fs.DurationVar(&c.StaleAfter, "stale-after", 24*time.Hour, "PROCESSING rows claimed longer ago than this are failed")
	fs.IntVar(&c.MaxAttempts, "max-attempts", 3, "claims a push gets before a stale claim fails it")
	fs.DurationVar(&c.SweepEvery, "sweep-every", 250*time.Millisecond, "how often the 09:00 run, waiting for its pushes to be sent, sweeps for a dead instance's claims")
	fs.DurationVar(&c.Poll, "poll", time.Second, "the scheduler's poll interval")
	fs.DurationVar(&c.WorkerPoll, "worker-poll", 10*time.Second, "the claim worker's poll interval (its safety net: it claims when rows are announced)")
	fs.Func("daily-at", "the demo's 09:00: the job runs daily at this instant's time of day (RFC 3339)", func(s string) error {
		t, err := time.Parse(time.RFC3339Nano, s)
		c.DailyAt = t
		return err
	})
	fs.DurationVar(&c.CatchUp, "catch-up", time.Hour, "catch-up window for a missed 09:00")
	fs.BoolVar(&c.Verbose, "v", false, "log pgclaim's records to standard error")
}

func (c *instanceConfig) check() error {
	switch {
	case c.URL == "":
		return errors.New("--database-url: required")
	case c.Batch < 1:
		return errors.New("--batch: must be at least 1")
	case c.Lease < 10*time.Millisecond:
		return errors.New("--lease: must be at least 10ms")
	case c.SendDelay < 0:
		return errors.New("--send-delay: must not be negative")
	case c.SendDelay >= c.Lease:
		return errors.New("--send-delay: must be shorter than --lease")
	case c.StaleAfter <= 0:
		return errors.New("--stale-after: must be positive")
	case c.MaxAttempts < 1:
		return errors.New("--max-attempts: must be at least 1")
	case c.SweepEvery <= 0:
		return errors.New("--sweep-every: must be positive")
	case c.Poll <= 0:
		return errors.New("--poll: must be positive")
	case c.WorkerPoll <= 0:
		return errors.New("--worker-poll: must be positive")
	case c.CatchUp < 0:
		return errors.New("--catch-up: must not be negative")
	}
	return nil
}

// instance is one running server of the push service.
type instance struct {
	cfg    instanceConfig
	holder string
	pool   *pgxpool.Pool
	q      *db.Queries
	rep    *reporter
	log    *slog.Logger
	// applied lists the migrations this instance applied at start-up.
	applied []string

	sched   *schedule.Scheduler
	claimer *claim.Claimer[int64]
	worker  *claim.Worker[int64]
	sweeper *claim.Sweeper[int64]

	mu sync.Mutex
	n  counters
}

func (in *instance) count(f func(*counters)) {
	in.mu.Lock()
	f(&in.n)
	in.mu.Unlock()
}

func (in *instance) counters() counters {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n
}

// runInstance is the hidden "instance" subcommand: one server of the push
// service, reporting events on stdout and taking commands on stdin
// ("daily-at <RFC 3339 instant>": register the schedule with the demo's
// 09:00 at that instant's time of day; end of input or "stop": shut down
// cleanly).
func runInstance(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pushresume instance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg instanceConfig
	cfg.flags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintln(stderr, "pushresume instance:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	clocks := make(chan time.Time, 4)
	go func() {
		defer cancel()
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			switch {
			case line == "stop":
				return
			case strings.HasPrefix(line, "daily-at "):
				t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(line, "daily-at "))
				if err != nil {
					fmt.Fprintln(stderr, "pushresume instance: bad daily-at command:", err)
					continue
				}
				clocks <- t
			}
		}
	}()

	holder := fmt.Sprintf("%s:%d", cfg.Name, os.Getpid())
	rep := newReporter(stdout, holder)
	in, err := newInstance(ctx, cfg, holder, rep, stderr)
	if err != nil {
		rep.emit(event{Ev: evError, Msg: err.Error()})
		fmt.Fprintln(stderr, "pushresume instance:", err)
		return 1
	}
	defer in.close()
	if err := in.run(ctx, clocks); err != nil {
		rep.emit(event{Ev: evError, Msg: err.Error()})
		fmt.Fprintln(stderr, "pushresume instance:", err)
		return 1
	}
	return 0
}

func newInstance(ctx context.Context, cfg instanceConfig, holder string, rep *reporter, stderr io.Writer) (*instance, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "pushresume " + holder
	pc.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	in := &instance{cfg: cfg, holder: holder, pool: pool, q: db.New(pool), rep: rep}
	var h slog.Handler = slog.DiscardHandler
	if cfg.Verbose {
		h = slog.NewTextHandler(stderr, nil)
	}
	in.log = slog.New(modeHandler{Handler: h, rep: rep}).With("instance", holder)
	// Migrate before building on the tables: NewWorker and NewSweeper
	// check the table and the states against the database.
	if in.applied, err = migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if err := in.build(); err != nil {
		pool.Close()
		return nil, err
	}
	return in, nil
}

// modeHandler hands every record to its Handler, and reports to the demo
// the claim worker's record saying how it learns of claimable rows: from the
// table's trigger, from claim.Notify only, or by its poll alone.
type modeHandler struct {
	slog.Handler
	rep *reporter
}

func (h modeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.Handler.Enabled(ctx, l)
}

func (h modeHandler) Handle(ctx context.Context, r slog.Record) error {
	if msg, ok := strings.CutPrefix(r.Message, "claim: worker: "); ok &&
		(strings.HasPrefix(msg, "claims when") || strings.HasPrefix(msg, "polls only")) {
		h.rep.emit(event{Ev: evWorker, Msg: msg})
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h modeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return modeHandler{Handler: h.Handler.WithAttrs(as), rep: h.rep}
}

func (h modeHandler) WithGroup(name string) slog.Handler {
	return modeHandler{Handler: h.Handler.WithGroup(name), rep: h.rep}
}

// build wires pgclaim's pieces for this instance.
func (in *instance) build() error {
	cfg := in.cfg
	var err error
	// Claims take READY rows, the pushes a resume released: never PAUSED
	// ones, so a worker running all day sends nothing before 09:00.
	in.claimer, err = claim.New[int64](in.pool, pushTable, claim.Config{
		From:   "READY",
		To:     "PROCESSING",
		Holder: in.holder,
		Lease:  cfg.Lease,
		Order:  "id",
		Logger: in.log,
	})
	if err != nil {
		return err
	}
	// The worker runs for the instance's life, on every instance alike. On
	// the pool it listens for the announcements of the table's trigger
	// (migration 00002 attaches it to READY) and claims the moment a
	// statement moves rows there; PollInterval is only its safety net.
	in.worker, err = claim.NewWorker(in.claimer, claim.WorkerConfig[int64]{
		Work:         in.send,
		Done:         "SENT",
		Failed:       "FAILED",
		Retry:        claim.RetryPolicy{State: "READY", MaxAttempts: cfg.MaxAttempts},
		BatchSize:    cfg.Batch,
		Concurrency:  1,
		PollInterval: cfg.WorkerPoll,
	})
	if err != nil {
		return err
	}
	// One sweeper for both rules. A claim whose lease ran out (its holder
	// died) goes back to READY, announced and claimed again at once, or to
	// FAILED once its attempts are used; the field's start-up rule, anything
	// claimed more than StaleAfter ago (lease or none, as an older release
	// left them), goes to FAILED (FailAfter).
	in.sweeper, err = claim.NewSweeper(in.claimer, claim.SweeperConfig[int64]{
		StaleAfter: cfg.StaleAfter,
		FailAfter:  cfg.StaleAfter,
		Failed:     "FAILED",
		Retry:      claim.RetryPolicy{State: "READY", MaxAttempts: cfg.MaxAttempts},
		BatchSize:  500,
	})
	if err != nil {
		return err
	}
	in.sched, err = schedule.New(in.pool, schedule.Config{
		Holder:       in.holder,
		Logger:       in.log,
		Hooks:        schedule.HooksFunc(in.observe),
		PollInterval: cfg.Poll,
	})
	return err
}

func (in *instance) close() {
	in.pool.Close()
}

// register stores the schedule (idempotent: every instance registers the
// same definition) and reports the ledger's newest row for it.
func (in *instance) register(ctx context.Context, demoAt time.Time) error {
	def, err := definition(demoAt, in.cfg.CatchUp)
	if err != nil {
		return err
	}
	if err := in.sched.Register(ctx, def, in.resume); err != nil {
		return err
	}
	msg := fmt.Sprintf("schedule %s registered: %q in %s, catch-up %s within %s, overlap %s, %d attempts",
		def.Name, def.Spec, def.TimeZone, def.CatchUp, def.CatchUpWindow, def.Overlap, def.Retry.MaxAttempts)
	in.rep.emit(event{Ev: evRegistered, Msg: msg})
	if r, err := in.q.LatestRun(ctx, job); err == nil {
		e := event{Ev: evLedger, FireAt: r.Instant, State: r.State, Attempt: int(r.Attempt)}
		if r.Fence != nil {
			e.Fence = *r.Fence
		}
		if r.Holder != nil {
			e.Msg = *r.Holder
		}
		in.rep.emit(e)
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return nil
}

// run is the instance's life: the start-up clean-up, then the claim worker
// and the scheduler until ctx ends. Every instance runs the same worker and
// the same scheduler; which one runs an instant is decided in the database,
// and which worker sends a push by its claim.
func (in *instance) run(ctx context.Context, clocks <-chan time.Time) error {
	// Start-up clean-up, on every instance whatever its role: after a crash
	// the instance starting is usually the one that has to clean up.
	if _, err := in.sweep(ctx, ruleStartup); err != nil {
		return err
	}
	if !in.cfg.DailyAt.IsZero() {
		if err := in.register(ctx, in.cfg.DailyAt); err != nil {
			return err
		}
	}

	// A worker that stops on a failure that cannot go away ends the
	// instance: a server that cannot send must not look healthy.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var worked claim.Stats
	var workerErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		worked, workerErr = in.worker.Run(ctx)
		if workerErr != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		if err := in.sched.Run(ctx); err != nil && ctx.Err() == nil {
			in.rep.emit(event{Ev: evError, Msg: "scheduler: " + err.Error()})
		}
	}()
	in.rep.emit(event{Ev: evReady, PID: os.Getpid(), Msg: strings.Join(in.applied, ", ")})

loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case at := <-clocks:
			if err := in.register(ctx, at); err != nil {
				in.rep.emit(event{Ev: evError, Msg: "register: " + err.Error()})
			}
		}
	}
	in.log.Info("pushresume: stopping")
	wg.Wait()
	in.log.Info("pushresume: stopped")
	in.count(func(n *counters) {
		n.Claimed, n.Sent, n.Released, n.Lost = worked.Claimed, worked.Succeeded, worked.Released, worked.Lost
	})
	if workerErr != nil {
		return fmt.Errorf("worker: %w", workerErr)
	}
	n := in.counters()
	in.rep.emit(event{Ev: evStopped, Stats: &n})
	return nil
}
