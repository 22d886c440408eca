package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/examples/pushresume/db"
	"github.com/pgclaim/pgclaim/status"
)

// demoConfig configures the demo run.
type demoConfig struct {
	DatabaseURL string // an existing database; empty: provision one with pgtest
	Pushes      int    // paused pushes to seed
	Stuck       int    // requests left PROCESSING by yesterday's crash
	KillAfter   int    // SIGKILL the 09:00 run's instance once this many sends have started, on either instance (0: 2/5 of Pushes)
	NoKill      bool   // let the 09:00 run finish (no failover)
	NoRestart   bool   // do not bring the killed instance back
	Instance    instanceConfig
	Timeout     time.Duration // for the whole run after provisioning
	// Serve is an address to serve pgclaim's status page on (read-only)
	// while the scenario runs, and after it until interrupted; "": none.
	Serve string

	// Exe and Env start an instance: Exe with "instance" and its flags,
	// Env added to the environment. Default: this program's executable.
	Exe string
	Env []string

	Out    io.Writer // the live view and the summary
	Stderr io.Writer // the instances' standard error
}

func (c *demoConfig) check() error {
	switch {
	case c.Pushes < 1:
		return errors.New("--pushes: must be at least 1")
	case c.Stuck < 0:
		return errors.New("--stuck: must not be negative")
	case c.KillAfter < 0:
		return errors.New("--kill-after: must not be negative")
	case c.KillAfter >= c.Pushes && !c.NoKill:
		return fmt.Errorf("--kill-after: must be less than --pushes (%d), so the kill lands mid-run", c.Pushes)
	case c.Timeout <= 0:
		return errors.New("--timeout: must be positive")
	}
	ic := c.Instance
	ic.URL = "-" // checked once known
	return ic.check()
}

// demoResult is what a run established, for the summary and for tests.
type demoResult struct {
	OK        bool
	Failures  []string // invariants that did not hold
	FireAt    time.Time
	Procs     []*proc
	Killed    *proc // the instance killed mid-run, if any
	KilledMid int   // rows it left PROCESSING (its worker's claims) when killed
	// Pickup is how soon the first push started after the resume's COMMIT
	// was sent, and PickupBy the same for each instance's worker (by
	// label): measured on the instances' clocks, which the demo's
	// instances share with their host. Zero when not seen.
	Pickup      time.Duration
	PickupBy    map[string]time.Duration
	Total       int64 // rows in push_requests
	States      map[string]int64
	Sends       int64
	Pushes      int64 // distinct pushes sent
	Duplicates  int64
	Early       int64 // pushes sent before the 09:00 instant
	Odd         db.CountInconsistentRow
	Runs        []db.ScheduleRunsRow // the schedule's ledger rows
	Run         *db.ScheduleRunsRow  // the 09:00 instant's row, if there is one
	SentBy      map[string]int64
	FailReasons []db.FailReasonsRow
}

// orchestrator runs the demo: it owns the instance processes and the live
// view. Only its run loop touches the procs' fields.
type orchestrator struct {
	cfg    demoConfig
	start  time.Time
	out    io.Writer
	pool   *pgxpool.Pool
	q      *db.Queries
	url    string
	events chan procEvent
	procs  []*proc
	fireAt time.Time
	// resumedAt is when the COMMIT of the first resume that moved rows was
	// sent, by its instance's clock; zero until then.
	resumedAt time.Time

	onEvent func(*proc, event) // tests: sees every event after it was handled
}

// runDemo runs the whole scenario and returns its result. err is set when
// the demo could not run (no database, an instance failed to start); a run
// that completed with a broken invariant returns a result with OK false.
func runDemo(ctx context.Context, cfg demoConfig) (*demoResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding this program to start its instances: %w", err)
		}
		cfg.Exe = exe
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.KillAfter == 0 {
		// About 2/5 of the way, the two workers having sent about as
		// many each: both in the middle of a batch, the rest of which the
		// killed one leaves claimed.
		b := cfg.Instance.Batch
		cfg.KillAfter = max(1, min(cfg.Pushes-1, 2*((cfg.Pushes/5)/b*b+b/2)))
	}
	o := &orchestrator{cfg: cfg, start: time.Now(), out: cfg.Out, events: make(chan procEvent, 256)}

	url, cleanup, err := o.provision(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	o.url = url
	if cfg.Serve != "" {
		stop, err := o.servePage(cfg.Serve)
		if err != nil {
			return nil, err
		}
		defer stop()
	}

	rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	defer o.shutdown()
	res, err := o.run(rctx)
	if cfg.Serve != "" && err == nil {
		o.shutdown()
		o.say("demo", "the status page stays up at http://%s/ until interrupted (Ctrl-C)", cfg.Serve)
		<-ctx.Done()
	}
	return res, err
}

// servePage serves pgclaim's status page, read-only, on addr, showing the
// schedule, the instances' locks and push_requests.
func (o *orchestrator) servePage(addr string) (stop func(), err error) {
	page, err := status.New(status.Config{
		Pool: o.pool, Refresh: time.Second,
		Tables: []status.Table{{Table: pushTable, Processing: "PROCESSING", StaleAfter: o.cfg.Instance.StaleAfter}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--serve: %w", err)
	}
	srv := &http.Server{Handler: page, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	o.say("demo", "status page (read-only): http://%s/", ln.Addr())
	return func() { _ = srv.Close() }, nil
}

// instanceArgs are the flags every instance gets.
func (o *orchestrator) instanceArgs(label string) []string {
	c := o.cfg.Instance
	args := []string{"instance",
		"--database-url", o.url,
		"--name", strings.SplitN(label, "#", 2)[0],
		"--send-delay", c.SendDelay.String(),
		"--batch", strconv.Itoa(c.Batch),
		"--lease", c.Lease.String(),
		"--stale-after", c.StaleAfter.String(),
		"--max-attempts", strconv.Itoa(c.MaxAttempts),
		"--sweep-every", c.SweepEvery.String(),
		"--poll", c.Poll.String(),
		"--worker-poll", c.WorkerPoll.String(),
		"--catch-up", c.CatchUp.String(),
	}
	if c.Verbose {
		args = append(args, "-v")
	}
	if !o.fireAt.IsZero() {
		args = append(args, "--daily-at", o.fireAt.UTC().Format(time.RFC3339Nano))
	}
	return args
}

func (o *orchestrator) startInstance(label string) (*proc, error) {
	o.say("demo", "starting %s", label)
	p, err := startProc(label, o.cfg.Exe, o.instanceArgs(label), o.cfg.Env, o.events, o.cfg.Stderr)
	if err != nil {
		return nil, err
	}
	o.procs = append(o.procs, p)
	return p, nil
}

// errExited is returned by wait when an instance exits unexpectedly.
var errExited = errors.New("instance exited")

// wait handles events until done reports true, polling poll (if set) every
// 50ms as well. It fails when ctx ends or an instance that was not killed or
// stopped exits.
func (o *orchestrator) wait(ctx context.Context, what string, done func() bool, poll func() (bool, error)) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case pe := <-o.events:
			if err := o.handle(pe); err != nil {
				return err
			}
		case <-tick.C:
			if poll == nil {
				continue
			}
			ok, err := poll()
			if err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
			if ok {
				return nil
			}
		}
	}
	return nil
}

// run is the scenario.
func (o *orchestrator) run(ctx context.Context) (*demoResult, error) {
	cfg := o.cfg
	if err := o.prepare(ctx); err != nil {
		return nil, err
	}
	res := &demoResult{}

	// The Active, then the Standby: the same program, the same scheduler.
	active, err := o.startInstance("active")
	if err != nil {
		return nil, err
	}
	if err := o.wait(ctx, "active to be ready", func() bool { return active.ready }, nil); err != nil {
		return nil, err
	}
	standby, err := o.startInstance("standby")
	if err != nil {
		return nil, err
	}
	if err := o.wait(ctx, "standby to be ready", func() bool { return standby.ready }, nil); err != nil {
		return nil, err
	}

	// The demo clock: 09:00 is about two seconds from now, by the
	// database's clock, to the second (the spec has a seconds field).
	now, err := o.q.DatabaseNow(ctx)
	if err != nil {
		return nil, err
	}
	o.fireAt = now.Add(2 * time.Second).Truncate(time.Second)
	res.FireAt = o.fireAt
	o.say("demo", "demo clock: 09:00:00 in %s is %s (database time, in %.1fs); both instances register the schedule",
		zone, o.fireAt.UTC().Format("15:04:05Z"), o.fireAt.Sub(now).Seconds())
	for _, p := range []*proc{active, standby} {
		if err := p.setClock(o.fireAt); err != nil {
			return nil, err
		}
	}
	if err := o.wait(ctx, "both instances to register the schedule", func() bool { return active.registered && standby.registered }, nil); err != nil {
		return nil, err
	}

	// Both schedulers wake at 09:00; the one that takes the schedule's lock
	// records the instant and runs attempt 1: it resumes the pushes, both
	// instances' workers send them, and it waits for them to be sent. Kill
	// it mid-run.
	var runner *proc
	if err := o.wait(ctx, "the 09:00 run to start", func() bool {
		for _, p := range o.procs {
			if p.attempt == 1 {
				runner = p
				return true
			}
		}
		return false
	}, nil); err != nil {
		return nil, err
	}
	if !cfg.NoKill {
		if err := o.wait(ctx, "the kill point", func() bool { return o.sending() >= cfg.KillAfter || runner.finished != "" }, nil); err != nil {
			return nil, err
		}
		if runner.finished != "" {
			o.say("demo", "the 09:00 run ended before the kill point; nothing to kill mid-run")
		} else {
			if err := runner.kill(); err != nil {
				return nil, err
			}
			res.Killed = runner
			n, err := o.q.CountProcessingBy(ctx, &runner.holder)
			if err != nil {
				return nil, err
			}
			res.KilledMid = int(n)
			var started []string
			for _, p := range o.procs {
				started = append(started, fmt.Sprintf("%d by %s", p.sending, p.label))
			}
			o.say("demo", "SIGKILL %s (pid %d) mid-run of attempt 1 (fence %d): %d sends had started (%s); its worker leaves %s PROCESSING under its claims",
				runner.label, runner.pid, runner.fence, o.sending(), strings.Join(started, ", "), plural(int(n), "row"))
		}
	}

	// The instant's run ends (succeeded: by a next attempt, if its runner
	// was killed) and every push settles.
	if err := o.wait(ctx, "the 09:00 run to end and every push to settle", never, func() (bool, error) {
		run, err := o.q.LatestRun(ctx, job)
		if err != nil {
			return false, err
		}
		if run.State != "succeeded" && run.State != "failed" {
			return false, nil
		}
		st, err := o.states(ctx)
		return st["PAUSED"] == 0 && st["READY"] == 0 && st["PROCESSING"] == 0, err
	}); err != nil {
		return nil, err
	}
	o.say("demo", "the 09:00 run ended, and every push settled (none PAUSED, READY or PROCESSING)")

	// The killed server comes back, as in the field: its start-up clean-up
	// runs, it registers the schedule (nothing to catch up: the ledger has
	// the 09:00 run) and stands by.
	if res.Killed != nil && !cfg.NoRestart {
		back, err := o.startInstance(res.Killed.label + "#2")
		if err != nil {
			return nil, err
		}
		if err := o.wait(ctx, "the restarted instance to be ready", func() bool { return back.ready }, nil); err != nil {
			return nil, err
		}
	}

	o.say("demo", "stopping the instances")
	if err := o.stopAll(ctx); err != nil {
		return nil, err
	}
	res.Procs = o.procs
	o.pickup(res)
	if err := o.check(ctx, res); err != nil {
		return nil, err
	}
	o.summary(res)
	return res, nil
}

// sending is how many sends have started, on every instance.
func (o *orchestrator) sending() int {
	n := 0
	for _, p := range o.procs {
		n += p.sending
	}
	return n
}

// pickup records in res how soon after the resume's COMMIT the worker of
// each instance running then started its first push, and the earliest.
func (o *orchestrator) pickup(res *demoResult) {
	res.PickupBy = map[string]time.Duration{}
	if o.resumedAt.IsZero() {
		return
	}
	for _, p := range o.procs {
		if !p.atResume || p.firstSend.IsZero() {
			continue
		}
		d := p.firstSend.Sub(o.resumedAt)
		res.PickupBy[p.label] = d
		if len(res.PickupBy) == 1 || d < res.Pickup {
			res.Pickup = d
		}
	}
}

// never is the condition of waits that end by polling.
func never() bool { return false }

// stopAll stops the instances cleanly and waits until every instance (the
// killed ones too) has exited.
func (o *orchestrator) stopAll(ctx context.Context) error {
	for _, p := range o.procs {
		if !p.exited && !p.killed {
			p.stop()
		}
	}
	return o.wait(ctx, "the instances to exit", func() bool {
		for _, p := range o.procs {
			if !p.exited {
				return false
			}
		}
		return true
	}, nil)
}

func (o *orchestrator) states(ctx context.Context) (map[string]int64, error) {
	rows, err := o.q.CountByStatus(ctx)
	if err != nil {
		return nil, err
	}
	st := map[string]int64{}
	for _, r := range rows {
		st[r.Status] = r.N
	}
	return st, nil
}

// shutdown stops (or, after a grace period, kills) every instance still
// running; used when the demo ends early.
func (o *orchestrator) shutdown() {
	alive := func() []*proc {
		var a []*proc
		for _, p := range o.procs {
			if !p.exited {
				a = append(a, p)
			}
		}
		return a
	}
	if len(alive()) == 0 {
		return
	}
	for _, p := range alive() {
		p.stop()
	}
	deadline := time.After(10 * time.Second)
	for len(alive()) > 0 {
		select {
		case pe := <-o.events:
			if pe.exit {
				pe.p.exited = true
			}
		case <-deadline:
			for _, p := range alive() {
				_ = p.kill()
			}
			deadline = time.After(5 * time.Second)
		}
	}
}
