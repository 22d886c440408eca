package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/examples/pushresume/db"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/pgtest/pgcontainer"
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

// say prints one line of the live view.
func (o *orchestrator) say(who, format string, args ...any) {
	fmt.Fprintf(o.out, "%6.2fs  %-9s %s\n", time.Since(o.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// provision finds the database: the given URL, else a fresh database on a
// server from pgtest (PGCLAIM_TEST_DATABASE_URL, Docker, local binaries).
func (o *orchestrator) provision(ctx context.Context) (url string, cleanup func(), err error) {
	if o.cfg.DatabaseURL != "" {
		pool, err := pgxpool.New(ctx, o.cfg.DatabaseURL)
		if err != nil {
			return "", nil, fmt.Errorf("--database-url: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return "", nil, fmt.Errorf("--database-url: %w", err)
		}
		o.pool, o.q = pool, db.New(pool)
		o.say("demo", "Postgres: the database from --database-url / DATABASE_URL (kept after the run)")
		return o.cfg.DatabaseURL, pool.Close, nil
	}
	o.say("demo", "no --database-url or DATABASE_URL: provisioning Postgres (Docker if an engine answers, else the local PostgreSQL binaries)")
	srv, err := pgtest.Start(ctx)
	if err != nil {
		return "", nil, err
	}
	closeSrv := func() { _ = srv.Close() }
	if srv.Source() != pgtest.SourceURL {
		// A server of our own, thrown away at the end: its maintenance
		// database will do.
		pool, err := pgxpool.New(ctx, srv.URL())
		if err != nil {
			closeSrv()
			return "", nil, err
		}
		o.pool, o.q = pool, db.New(pool)
		how := "a throwaway cluster from the local PostgreSQL binaries"
		if srv.Source() == pgtest.SourceContainer {
			how = "a container (testcontainers, " + pgcontainer.Image + ")"
		}
		o.say("demo", "Postgres: %s (removed at the end)", how)
		return srv.URL(), func() { pool.Close(); closeSrv() }, nil
	}
	// A shared server (PGCLAIM_TEST_DATABASE_URL): a database of our own.
	d, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pushresume_demo", Unmigrated: true})
	if err != nil {
		closeSrv()
		return "", nil, err
	}
	o.pool, o.q = d.Pool, db.New(d.Pool)
	o.say("demo", "Postgres: database %s on the server in %s (dropped at the end)", d.Name, pgtest.EnvURL)
	return d.URL, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Drop(ctx)
		closeSrv()
	}, nil
}

// prepare migrates, empties the demo's tables and seeds them.
func (o *orchestrator) prepare(ctx context.Context) error {
	if o.cfg.DatabaseURL != "" {
		t, err := o.q.DemoTables(ctx)
		if err != nil {
			return err
		}
		if t.PushRequests && !t.VersionTable {
			return errors.New("the database has a push_requests table this demo did not create; use an empty database")
		}
	}
	applied, err := migrate(ctx, o.pool)
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		o.say("demo", "schema: applied %s", strings.Join(applied, ", "))
	} else {
		o.say("demo", "schema: up to date")
	}
	if err := o.q.ResetDemo(ctx); err != nil {
		return err
	}
	if err := o.q.ResetSchedule(ctx, job); err != nil {
		return err
	}
	cfg := o.cfg
	if cfg.Stuck > 0 {
		if _, err := o.q.SeedStuck(ctx, db.SeedStuckParams{
			N: int32(cfg.Stuck), AgeSeconds: (cfg.Instance.StaleAfter + time.Hour).Seconds(), Holder: "active:yesterday",
		}); err != nil {
			return err
		}
	}
	if _, err := o.q.SeedPaused(ctx, int32(cfg.Pushes)); err != nil {
		return err
	}
	o.say("demo", "seeded %d PAUSED pushes, and %d requests a crashed server left PROCESSING %s ago",
		cfg.Pushes, cfg.Stuck, durationText(cfg.Instance.StaleAfter+time.Hour))
	return nil
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

// handle applies one event to its proc and prints it in the live view.
func (o *orchestrator) handle(pe procEvent) error {
	p, e := pe.p, pe.e
	if pe.exit {
		p.exited, p.err = true, pe.err
		if !p.killed && p.stopped == nil {
			return fmt.Errorf("%s: %w: %v", p.label, errExited, pe.err)
		}
		return nil
	}
	if e.Holder != "" {
		p.holder = e.Holder
	}
	switch e.Ev {
	case evReady:
		p.ready = true
		o.say(p.label, "claim worker and scheduler running (pid %d)", e.PID)
	case evWorker:
		o.say(p.label, "worker: %s (its poll: every %s)", e.Msg, o.cfg.Instance.WorkerPoll)
	case evSwept:
		p.seen.SweptFailed += e.To["FAILED"]
		p.seen.SweptRetry += e.To["READY"]
		p.swept += e.N
		for holder, n := range e.By {
			for _, q := range o.procs {
				if q.holder == holder && q.killed {
					q.seen.Claimed += n // claims it held when it died
				}
			}
		}
		o.say(p.label, "%s", sweptText(e))
	case evRegistered:
		p.registered = true
		o.say(p.label, "%s", e.Msg)
	case evLedger:
		o.say(p.label, "ledger: the newest run of %s, %s, is %s at attempt %d (fence %d, %s)",
			job, o.instantText(e.FireAt), e.State, e.Attempt, e.Fence, e.Msg)
	case evTakenOver:
		if e.State == "failed" {
			o.say(p.label, "%s: recorded failed, no attempts left (%s)", o.instantText(e.FireAt), e.Msg)
			break
		}
		o.say(p.label, "%s: took the run over (%s)", o.instantText(e.FireAt), e.Msg)
	case evAttempt:
		p.attempt, p.fence, p.finished = e.Attempt, e.Fence, ""
		p.seen.Attempts++
		o.say(p.label, "%s: attempt %d is mine (fence %d) → resuming the pushes paused before it", o.instantText(e.FireAt), e.Attempt, e.Fence)
	case evWaiting:
		o.say(p.label, "attempt %d: %s", e.Attempt, o.waitingText(e))
	case evFinished:
		p.finished = e.State
		if e.State == "succeeded" {
			p.seen.Completed++
		}
		text := fmt.Sprintf("%s: attempt %d (fence %d) ended %s", o.instantText(e.FireAt), e.Attempt, e.Fence, e.State)
		if e.Msg != "" {
			text += ": " + short(e.Msg)
		}
		o.say(p.label, "%s", text)
	case evLost, evSkipped:
		o.say(p.label, "%s: %s", o.instantText(e.FireAt), short(e.Msg))
	case evSending:
		p.sending++
		if p.firstSend.IsZero() {
			p.firstSend = e.At
			o.pickups()
		}
	case evResumed:
		p.seen.Resumed += e.N
		if e.N == 0 {
			o.say(p.label, "%s: nothing left PAUSED (an earlier attempt's resume committed)", e.How)
			break
		}
		o.say(p.label, "%s: resumed %s in one statement (PAUSED → READY); the table's trigger announces them with its commit (the COMMIT: %s)",
			e.How, plural(e.N, "push"), msText(e.Took))
		if o.resumedAt.IsZero() {
			o.resumedAt = e.At
			// The workers the announcement reached: those of the
			// instances running now. One started later finds its rows
			// by its first claim, not by the announcement.
			for _, q := range o.procs {
				q.atResume = q.ready && !q.killed && !q.exited
			}
			o.pickups()
		}
	case evError:
		o.say(p.label, "ERROR %s", short(e.Msg))
	case evStopped:
		p.stopped = e.Stats
	}
	if o.onEvent != nil {
		o.onEvent(p, e)
	}
	return nil
}

// pickups prints, for each instance running at the resume whose first push
// is known and not yet shown, how soon after the resume's COMMIT it started. An instance's
// events arrive in order, but two instances' interleave: either the resume
// or a first push may come first.
func (o *orchestrator) pickups() {
	if o.resumedAt.IsZero() {
		return
	}
	for _, p := range o.procs {
		if !p.atResume || p.firstSend.IsZero() || p.pickupShown {
			continue
		}
		p.pickupShown = true
		o.say(p.label, "worker: first push started %s after the resume's COMMIT was sent", msText(p.firstSend.Sub(o.resumedAt)))
	}
}

// waitingText describes what an attempt waits for: the instant's rows
// still READY, and those PROCESSING per holder, a killed one's marked.
func (o *orchestrator) waitingText(e event) string {
	parts := []string{fmt.Sprintf("%d READY", e.N)}
	dead := false
	for _, holder := range slices.Sorted(maps.Keys(e.By)) {
		part := fmt.Sprintf("%d PROCESSING under %s", e.By[holder], holder)
		for _, q := range o.procs {
			if q.holder == holder && q.killed {
				part += " (killed)"
				dead = true
			}
		}
		parts = append(parts, part)
	}
	text := "waiting for the instant's pushes to be sent: " + strings.Join(parts, ", ")
	if dead {
		text += " → a killed instance's claims are swept back to READY once their lease runs out"
	}
	return text
}

// msText prints d in milliseconds.
func msText(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// instantText names an instant of the schedule: the demo's 09:00, or the
// instant itself.
func (o *orchestrator) instantText(t time.Time) string {
	if !o.fireAt.IsZero() && t.Equal(o.fireAt) {
		return "09:00 (" + t.UTC().Format("15:04:05Z") + ")"
	}
	return t.UTC().Format(time.RFC3339)
}

func sweptText(e event) string {
	if e.N == 0 {
		return e.Rule + " sweep: nothing stuck"
	}
	var to []string
	for _, s := range slices.Sorted(maps.Keys(e.To)) {
		what := s
		if s == "READY" {
			what = "READY (announced: claimed again)"
		}
		to = append(to, fmt.Sprintf("%d → %s", e.To[s], what))
	}
	by := slices.Sorted(maps.Keys(e.By))
	return fmt.Sprintf("%s sweep: %s stuck under %s: %s", e.Rule, plural(e.N, "row"), strings.Join(by, ", "), strings.Join(to, ", "))
}

// plural returns "1 row", "2 rows", "1 push", "2 pushes".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "sh") {
		return fmt.Sprintf("%d %ses", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func durationText(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return d.String()
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
