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

// pushTable describes push_requests to pgclaim's claim package.
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

// dueRows narrows a resume to rows paused at or before the run's instant
// ($1): the 09:00 run resumes what was paused before 09:00, and every
// attempt of it resumes the same rows, never pushes paused after it (they
// wait for the next 09:00).
const dueRows = "paused_at <= $1"

// definition is the resume job's schedule as every instance declares it.
// The policies:
//   - CatchUpLatest within catchUp: a service that was down at 09:00 runs
//     the missed resume when it comes back within the window (one run
//     resumes everything due, so running only the latest loses nothing);
//     older instants are recorded skipped, saying why.
//   - OverlapSkip: a 09:00 that comes due while yesterday's run is still
//     running is recorded skipped; the running one resumes the same rows.
//   - Retry: 3 attempts (an attempt whose instance died counts), 5 s back-off
//     after a failed one. Each attempt works through claims, so it finishes
//     what the one before it left and never sends a push twice.
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
	SweepEvery  time.Duration // how often a run waiting for a dead attempt's claims sweeps again
	Poll        time.Duration // the scheduler's poll: how soon a dead runner's instant is taken over
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
	fs.DurationVar(&c.SweepEvery, "sweep-every", 250*time.Millisecond, "how often a run waiting for a dead attempt's claims sweeps again")
	fs.DurationVar(&c.Poll, "poll", time.Second, "the scheduler's poll interval")
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
	worker  claim.WorkerConfig[int64] // Args set per attempt
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
	in.log = slog.New(slog.DiscardHandler)
	if cfg.Verbose {
		in.log = slog.New(slog.NewTextHandler(stderr, nil)).With("instance", holder)
	}
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

// build wires pgclaim's pieces for this instance.
func (in *instance) build() error {
	cfg := in.cfg
	var err error
	in.claimer, err = claim.New[int64](in.pool, pushTable, claim.Config{
		From:   "PAUSED",
		To:     "PROCESSING",
		Holder: in.holder,
		Lease:  cfg.Lease,
		Order:  "id",
		Where:  dueRows,
		Logger: in.log,
	})
	if err != nil {
		return err
	}
	in.worker = claim.WorkerConfig[int64]{
		Work:        in.send,
		Done:        "SENT",
		Failed:      "FAILED",
		Retry:       claim.RetryPolicy{State: "PAUSED", MaxAttempts: cfg.MaxAttempts},
		BatchSize:   cfg.Batch,
		Concurrency: 1,
		Args:        []any{time.Now()},
	}
	// Checked against the database once, here; each attempt builds its own
	// worker for its instant without checking again.
	if _, err := claim.NewWorker(in.claimer, in.worker); err != nil {
		return err
	}
	in.worker.SkipVerify = true
	// One sweeper for both rules. A claim whose lease ran out (its holder
	// died) goes back to PAUSED for another attempt, or to FAILED once its
	// attempts are used; the field's start-up rule, anything claimed more
	// than StaleAfter ago (lease or none, as an older release left them),
	// goes to FAILED (FailAfter).
	in.sweeper, err = claim.NewSweeper(in.claimer, claim.SweeperConfig[int64]{
		StaleAfter: cfg.StaleAfter,
		FailAfter:  cfg.StaleAfter,
		Failed:     "FAILED",
		Retry:      claim.RetryPolicy{State: "PAUSED", MaxAttempts: cfg.MaxAttempts},
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

// observe reports the scheduler's events to the demo.
func (in *instance) observe(_ context.Context, e schedule.Event) {
	ev := event{FireAt: e.Instant, How: e.RunKind, Attempt: e.Attempt, Fence: e.Fence, State: e.State, Msg: e.Reason}
	switch e.Kind {
	case schedule.EventStarted:
		ev.Ev = evAttempt
		in.count(func(n *counters) { n.Attempts++ })
	case schedule.EventFinished:
		ev.Ev = evFinished
		if e.Err != nil && ev.Msg == "" {
			ev.Msg = e.Err.Error()
		}
		if e.State == "succeeded" {
			in.count(func(n *counters) { n.Completed++ })
		}
	case schedule.EventTakenOver:
		ev.Ev = evTakenOver
	case schedule.EventLost:
		ev.Ev, ev.Msg = evLost, e.Err.Error()
	case schedule.EventSkipped, schedule.EventMissed:
		ev.Ev, ev.Msg = evSkipped, e.Kind.String()+": "+e.Reason
	case schedule.EventFollowed:
		ev.Ev, ev.Msg = evError, "registration: "+e.Reason
	default:
		return
	}
	in.rep.emit(ev)
}

// send "sends" one push: the provider call takes SendDelay, and the hand-over
// is recorded in sent_pushes through tx, the transaction the worker then
// finishes the claim in (PROCESSING → SENT, fenced by the claim's token). If
// the claim was swept meanwhile, the finish fails and the send rolls back.
func (in *instance) send(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error {
	in.rep.emit(event{Ev: evSending, ID: c.Key, Fence: c.Fence})
	if in.cfg.SendDelay > 0 {
		t := time.NewTimer(in.cfg.SendDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	return in.q.WithTx(tx).RecordSend(ctx, db.RecordSendParams{PushID: c.Key, Fence: c.Fence, Instance: in.holder})
}

// resume is the schedule's job: one attempt at resuming the pushes paused
// before run.Instant. It works through claims, so it completes whatever an
// earlier attempt of the instant left: rows that attempt never claimed are
// still PAUSED; rows it held when it died are PROCESSING until their lease
// runs out, then swept back to PAUSED and resumed here; rows it sent are
// SENT, and never sent again. It returns once no due row is PAUSED or
// PROCESSING.
func (in *instance) resume(ctx context.Context, run schedule.Run) error {
	wc := in.worker
	wc.Args = []any{run.Instant}
	w, err := claim.NewWorker(in.claimer, wc)
	if err != nil {
		return err
	}
	how := fmt.Sprintf("attempt %d", run.Attempt)
	waiting := false
	for {
		if _, err := in.sweep(ctx, how); err != nil {
			return err
		}
		st, err := w.Drain(ctx)
		in.count(func(n *counters) {
			n.Claimed += st.Claimed
			n.Sent += st.Succeeded
			n.Released += st.Released
			n.Lost += st.Lost
		})
		if st.Claimed > 0 || err != nil {
			in.rep.emit(event{Ev: evResumed, How: how, Attempt: run.Attempt, Stats: &counters{
				Claimed: st.Claimed, Sent: st.Succeeded, Released: st.Released, Lost: st.Lost,
			}})
		}
		if err != nil {
			return err
		}
		open, err := in.q.CountOpen(ctx, run.Instant)
		if err != nil {
			return err
		}
		if open.Paused+open.Processing == 0 {
			return nil
		}
		if open.Processing > 0 && !waiting {
			// Claims of the attempt that died: wait for their lease.
			waiting = true
			in.rep.emit(event{Ev: evWaiting, Attempt: run.Attempt, N: int(open.Processing)})
		}
		t := time.NewTimer(in.cfg.SweepEvery)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
}

// sweep runs the sweeper and reports what moved.
func (in *instance) sweep(ctx context.Context, rule string) (retried int, err error) {
	to := map[string]int{}
	by := map[string]int{}
	total := 0
	swept, err := in.sweeper.Sweep(ctx)
	for _, r := range swept {
		to[r.State]++
		by[r.ClaimedBy]++
		total++
	}
	if err != nil {
		return 0, err
	}
	in.count(func(n *counters) {
		n.SweptFailed += to["FAILED"]
		n.SweptRetry += to["PAUSED"]
	})
	if total > 0 || rule == ruleStartup {
		in.rep.emit(event{Ev: evSwept, Rule: rule, N: total, To: to, By: by})
	}
	return to["PAUSED"], nil
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

// run is the instance's life: the start-up clean-up, then the scheduler
// until ctx ends. Every instance runs the same scheduler; which one runs an
// instant is decided in the database.
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

	var wg sync.WaitGroup
	wg.Add(1)
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
	n := in.counters()
	in.rep.emit(event{Ev: evStopped, Stats: &n})
	return nil
}
