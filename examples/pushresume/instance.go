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
	"github.com/pgclaim/pgclaim/gate"
)

const (
	// job is the scheduled job's name in the tick ledger and the name of
	// its advisory lock.
	job = "push-resume"
	// election is the Active/Standby election every instance stands in.
	election = "pushresume"
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

// dueRows narrows a resume to rows paused before the job's latest scheduled
// instant: the 09:00 run resumes what was paused before 09:00, and a run that
// finishes a cut-short 09:00 run resumes the same rows, never pushes paused
// after it (they wait for the next 09:00).
const dueRows = "paused_at <= (SELECT max(fire_at) FROM pgclaim_ticks WHERE job = '" + job + "')"

// instanceConfig configures one instance of the push service.
type instanceConfig struct {
	URL          string        // database
	Name         string        // role shown by the demo ("active", "standby")
	SendDelay    time.Duration // how long one "send" to the push provider takes
	Batch        int           // rows claimed per statement
	Lease        time.Duration // claim lease; heartbeats extend it while a push is sent
	TTL          time.Duration // elector TTL: how long a dead leader can hold leadership
	StaleAfter   time.Duration // the field's rule: PROCESSING this long without a lease → FAILED
	MaxAttempts  int           // claims a push gets before a stale claim fails it
	SweepEvery   time.Duration // how often the leader sweeps and looks for cut-short runs
	StandbyDelay time.Duration // a standby lets the Active take the tick first
	DailyAt      time.Time     // the schedule's anchor (the demo's 09:00); zero: none known yet
	CatchUp      time.Duration // start-up catch-up window for a missed tick
	Verbose      bool          // pgclaim's logs on standard error
}

func (c *instanceConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "database-url", "", "database connection string (required)")
	fs.StringVar(&c.Name, "name", "instance", "role name shown in the demo")
	fs.DurationVar(&c.SendDelay, "send-delay", 20*time.Millisecond, "time one push takes to send")
	fs.IntVar(&c.Batch, "batch", 10, "pushes claimed per statement")
	fs.DurationVar(&c.Lease, "lease", 2*time.Second, "claim lease, extended while a push is sent")
	fs.DurationVar(&c.TTL, "ttl", time.Second, "elector TTL")
	fs.DurationVar(&c.StaleAfter, "stale-after", 24*time.Hour, "PROCESSING rows without a lease older than this are failed")
	fs.IntVar(&c.MaxAttempts, "max-attempts", 3, "claims a push gets before a stale claim fails it")
	fs.DurationVar(&c.SweepEvery, "sweep-every", 250*time.Millisecond, "leader's sweep interval")
	fs.DurationVar(&c.StandbyDelay, "standby-delay", 300*time.Millisecond, "how long a standby lets the Active take a tick first")
	fs.Func("daily-at", "schedule anchor: the job runs daily at this instant (RFC 3339)", func(s string) error {
		t, err := time.Parse(time.RFC3339Nano, s)
		c.DailyAt = t
		return err
	})
	fs.DurationVar(&c.CatchUp, "catch-up", time.Hour, "start-up catch-up window for a missed tick")
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
	case c.TTL < 10*time.Millisecond:
		return errors.New("--ttl: must be at least 10ms")
	case c.StaleAfter <= 0:
		return errors.New("--stale-after: must be positive")
	case c.MaxAttempts < 1:
		return errors.New("--max-attempts: must be at least 1")
	case c.SweepEvery <= 0:
		return errors.New("--sweep-every: must be positive")
	case c.StandbyDelay < 0:
		return errors.New("--standby-delay: must not be negative")
	}
	return nil
}

// daily is the job's schedule: every day at the time of day of at.
type daily struct{ at time.Time }

// Next returns the first instant of the schedule strictly after t.
func (d daily) Next(t time.Time) time.Time {
	const day = 24 * time.Hour
	since := t.Sub(d.at)
	k := since / day
	if since < 0 && since%day != 0 {
		k-- // floor, not truncation
	}
	return d.at.Add((k + 1) * day)
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

	gate    *gate.Gate
	elector *gate.Elector
	worker  *claim.Worker[int64]
	old     *claim.Sweeper[int64] // the field's 24-hour rule
	expired *claim.Sweeper[int64] // claims whose lease ran out

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
// ("fire <RFC 3339 instant>": the schedule fires now for that instant;
// end of input or "stop": shut down cleanly).
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

	fires := make(chan time.Time, 4)
	go func() {
		defer cancel()
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			switch {
			case line == "stop":
				return
			case strings.HasPrefix(line, "fire "):
				t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(line, "fire "))
				if err != nil {
					fmt.Fprintln(stderr, "pushresume instance: bad fire command:", err)
					continue
				}
				fires <- t
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
	if err := in.run(ctx, fires); err != nil {
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
	claimer, err := claim.New[int64](in.pool, pushTable, claim.Config{
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
	in.worker, err = claim.NewWorker(claimer, claim.WorkerConfig[int64]{
		Work:        in.send,
		Done:        "SENT",
		Failed:      "FAILED",
		Retry:       claim.RetryPolicy{State: "PAUSED", MaxAttempts: cfg.MaxAttempts},
		BatchSize:   cfg.Batch,
		Concurrency: 1,
	})
	if err != nil {
		return err
	}
	// Two sweepers with disjoint rows. The field's start-up rule first:
	// anything PROCESSING for more than StaleAfter is failed, lease or not.
	// Then younger claims whose lease ran out (their holder died): back to
	// PAUSED for another attempt, or FAILED once attempts are used up.
	olderThan := "claimed_at < statement_timestamp() - make_interval(secs => $1::float8)"
	youngerThan := "claimed_at >= statement_timestamp() - make_interval(secs => $1::float8)"
	in.old, err = claim.NewSweeper(claimer, claim.SweeperConfig[int64]{
		StaleAfter: cfg.StaleAfter,
		Failed:     "FAILED",
		BatchSize:  500,
		Where:      olderThan,
		Args:       []any{cfg.StaleAfter.Seconds()},
	})
	if err != nil {
		return err
	}
	in.expired, err = claim.NewSweeper(claimer, claim.SweeperConfig[int64]{
		StaleAfter: cfg.StaleAfter,
		Failed:     "FAILED",
		Retry:      claim.RetryPolicy{State: "PAUSED", MaxAttempts: cfg.MaxAttempts},
		BatchSize:  500,
		Where:      youngerThan,
		Args:       []any{cfg.StaleAfter.Seconds()},
	})
	if err != nil {
		return err
	}
	in.gate, err = gate.New(in.pool, gate.Config{Holder: in.holder, Logger: in.log})
	if err != nil {
		return err
	}
	in.elector, err = gate.NewElector(in.pool, election, gate.ElectorConfig{Holder: in.holder, Logger: in.log, TTL: cfg.TTL})
	return err
}

func (in *instance) close() {
	if in.gate != nil {
		in.gate.Close()
	}
	in.pool.Close()
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

// resume drains due PAUSED rows: claim in batches, send, finish SENT.
func (in *instance) resume(ctx context.Context, how string) error {
	st, err := in.worker.Drain(ctx)
	in.count(func(n *counters) {
		n.Claimed += st.Claimed
		n.Sent += st.Succeeded
		n.Released += st.Released
		n.Lost += st.Lost
	})
	in.rep.emit(event{Ev: evResumed, How: how, Stats: &counters{
		Claimed: st.Claimed, Sent: st.Succeeded, Released: st.Released, Lost: st.Lost,
	}})
	return err
}

// sweep runs both sweepers and reports what moved.
func (in *instance) sweep(ctx context.Context, rule string) (retried int, err error) {
	to := map[string]int{}
	by := map[string]int{}
	total := 0
	for _, s := range []*claim.Sweeper[int64]{in.old, in.expired} {
		swept, err := s.Sweep(ctx)
		for _, r := range swept {
			to[r.State]++
			by[r.ClaimedBy]++
			total++
		}
		if err != nil {
			return 0, err
		}
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

// run is the instance's life: start-up clean-up on every instance, then the
// election and the schedule until ctx ends.
func (in *instance) run(ctx context.Context, fires <-chan time.Time) error {
	// Start-up clean-up, on every instance whatever its role: after a crash
	// the instance starting is usually the one that has to clean up.
	if _, err := in.sweep(ctx, ruleStartup); err != nil {
		return err
	}
	in.rep.emit(event{Ev: evReady, PID: os.Getpid(), Msg: strings.Join(in.applied, ", ")})

	if !in.cfg.DailyAt.IsZero() {
		in.catchUp(ctx)
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		in.rep.emit(event{Ev: evCampaign})
		err := in.elector.Run(ctx, in.lead)
		if err != nil && ctx.Err() == nil {
			in.rep.emit(event{Ev: evError, Msg: "election: " + err.Error()})
		}
	}()

loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case at := <-fires:
			wg.Add(1)
			go func() {
				defer wg.Done()
				in.tick(ctx, at)
			}()
		}
	}
	in.log.Info("pushresume: stopping")
	wg.Wait()
	in.log.Info("pushresume: stopped")
	n := in.counters()
	in.rep.emit(event{Ev: evStopped, Stats: &n})
	return nil
}

// catchUp runs the latest scheduled instant within the catch-up window if no
// instance ran it (a service that was down at 09:00 resumes on start-up).
func (in *instance) catchUp(ctx context.Context) {
	err := in.gate.CatchUp(ctx, job, daily{in.cfg.DailyAt}, in.cfg.CatchUp, func(ctx context.Context, run gate.Run) error {
		in.count(func(n *counters) { n.TicksRun++ })
		in.rep.emit(event{Ev: evTickRun, FireAt: run.FireAt, Fence: run.Fence, How: "catch-up"})
		return in.resume(ctx, "catch-up of "+run.FireAt.Format(time.TimeOnly))
	})
	switch {
	case err == nil:
		in.rep.emit(event{Ev: evCatchUp, Msg: "ran the missed tick"})
	case errors.Is(err, gate.ErrSkipped):
		msg := "no tick missed"
		if t, terr := in.q.TickAt(ctx, db.TickAtParams{Job: job, FireAt: in.cfg.DailyAt}); terr == nil {
			in.count(func(n *counters) { n.TicksSkipped++ })
			msg = fmt.Sprintf("tick already in the ledger (holder %s, outcome %s)", t.Holder, t.Outcome)
		}
		in.rep.emit(event{Ev: evCatchUp, Msg: msg})
	default:
		in.rep.emit(event{Ev: evError, Msg: "catch-up: " + err.Error()})
	}
}

// tick is the scheduler firing the job for the instant at. Every instance
// fires; the tick ledger lets one run. A standby lets the Active go first,
// so in normal operation the Active runs the job, and a standby runs it only
// when the Active did not.
func (in *instance) tick(ctx context.Context, at time.Time) {
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
	in.rep.emit(event{Ev: evFired, FireAt: at})
	if !in.elector.IsLeader() && in.cfg.StandbyDelay > 0 {
		t := time.NewTimer(in.cfg.StandbyDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
	err := in.gate.Once(ctx, job, at, func(ctx context.Context, run gate.Run) error {
		in.count(func(n *counters) { n.TicksRun++ })
		in.rep.emit(event{Ev: evTickRun, FireAt: run.FireAt, Fence: run.Fence})
		return in.resume(ctx, "09:00 run")
	})
	switch {
	case errors.Is(err, gate.ErrSkipped):
		in.count(func(n *counters) { n.TicksSkipped++ })
		msg := err.Error()
		if t, terr := in.q.TickAt(ctx, db.TickAtParams{Job: job, FireAt: at}); terr == nil {
			msg = "ledger: tick already taken by " + t.Holder
		}
		in.rep.emit(event{Ev: evTickSkip, FireAt: at, Msg: msg})
	case err != nil:
		in.rep.emit(event{Ev: evTickDone, FireAt: at, Msg: err.Error()})
	default:
		in.rep.emit(event{Ev: evTickDone, FireAt: at})
	}
}

// lead runs while this instance is the Active. It sweeps claims whose holder
// died (their lease ran out) and finishes a run that was cut short: due
// PAUSED rows while no run of the job holds its lock are left over from a
// run whose holder died, or came back from the sweeper for another attempt.
// The resume then runs under the job's exclusive lock; the tick itself stays
// in the ledger under the instance that started it.
func (in *instance) lead(ctx context.Context, run gate.Run) error {
	in.count(func(n *counters) { n.Terms++ })
	in.rep.emit(event{Ev: evElected, Fence: run.Fence})
	defer func() {
		msg := "resigned"
		if cause := context.Cause(ctx); errors.Is(cause, gate.ErrLockLost) {
			msg = "lost: " + cause.Error()
		}
		in.rep.emit(event{Ev: evDemoted, Msg: msg})
	}()
	t := time.NewTicker(in.cfg.SweepEvery)
	defer t.Stop()
	for {
		if _, err := in.sweep(ctx, rulePeriodic); err != nil && ctx.Err() == nil {
			in.rep.emit(event{Ev: evError, Msg: "sweep: " + err.Error()})
		}
		if due, err := in.q.CountDue(ctx, job); err == nil && due > 0 {
			err := in.gate.Exclusive(ctx, job, func(ctx context.Context, _ gate.Run) error {
				// Counted again under the lock: the run that held it may
				// have just finished them.
				due, err := in.q.CountDue(ctx, job)
				if err != nil || due == 0 {
					return err
				}
				in.rep.emit(event{Ev: evLeftovers, N: int(due)})
				return in.resume(ctx, "finishing the cut-short run")
			})
			if err != nil && !errors.Is(err, gate.ErrSkipped) && ctx.Err() == nil {
				in.rep.emit(event{Ev: evError, Msg: "resume: " + err.Error()})
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
