package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/internal/bouncer"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// Fault is a kind of fault the harness injects.
type Fault string

// The fault kinds. FaultBouncer is a topology rather than an event: some
// instances reach Postgres through PgBouncer in transaction pooling mode.
const (
	FaultKill      Fault = "kill"       // SIGKILL an instance (mid-batch when it can), restart it later
	FaultTerminate Fault = "terminate"  // pg_terminate_backend on instances' backends
	FaultRestart   Fault = "restart"    // immediate restart of the Postgres server
	FaultClock     Fault = "clock"      // change an instance's clock offset (up to ±MaxOffset)
	FaultPause     Fault = "pause"      // SIGSTOP an instance for longer than every lease, then SIGCONT
	FaultSchedule  Fault = "schedpause" // pause a schedule mid-run (Scheduler.Pause), resume it 2-4 s later
	FaultBouncer   Fault = "bouncer"    // put some instances behind PgBouncer (transaction pooling)
	FaultExhaust   Fault = "exhaust"    // another client takes every free connection of the server for 2-5 s
)

// AllFaults lists every fault kind, in report order.
var AllFaults = []Fault{FaultKill, FaultTerminate, FaultRestart, FaultClock, FaultPause, FaultSchedule, FaultBouncer, FaultExhaust}

// ParseFaults parses a comma-separated list of fault kinds (of AllFaults
// and PatroniFaults); "all" and "" mean AllFaults, "none" means none.
func ParseFaults(s string) ([]Fault, error) {
	switch strings.TrimSpace(s) {
	case "", "all":
		return slices.Clone(AllFaults), nil
	case "none":
		return nil, nil
	}
	var out []Fault
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(AllFaults, Fault(f)) && !slices.Contains(PatroniFaults, Fault(f)) {
			return nil, fmt.Errorf("chaos: unknown fault %q (known: %v, and with Patroni %v)", f, AllFaults, PatroniFaults)
		}
		if !slices.Contains(out, Fault(f)) {
			out = append(out, Fault(f))
		}
	}
	return out, nil
}

// Config configures a run. The zero value (with Duration set) is the
// default short run.
type Config struct {
	// Seed drives the fault schedule and the workload's failures. 0 picks
	// one at random; the chosen seed is in the Result and the report.
	Seed int64
	// Duration is how long faults are injected. Required.
	Duration time.Duration
	// Instances is the number of instance processes (default 4).
	Instances int
	// Bouncer is how many of them reach Postgres through PgBouncer when
	// FaultBouncer is on (default Instances/2).
	Bouncer int
	// Faults enabled (default AllFaults; with Patroni, PatroniFaults). Nil
	// means the default; use ParseFaults ("none") for a run without faults.
	// PatroniFaults need Patroni; restart and bouncer are not modelled with
	// it.
	Faults []Fault
	// NoFaults runs without any fault (Faults is ignored).
	NoFaults bool
	// FaultEvery is the mean time between faults (default 1.5s); for the
	// Patroni faults, the mean pause between the cluster being whole again
	// and the next one.
	FaultEvery time.Duration
	// RowsPerSecond is the rate at which new PAUSED rows arrive (default 40).
	RowsPerSecond int
	// Broken selects a deliberately broken worker (BrokenNoFence,
	// BrokenNoGuard, BrokenNoLedger); "" is the real one.
	Broken string
	// Schedules is the number of one-period schedules per group (default
	// 50): every instance runs the advisory group's (direct instances) or
	// the lease group's (every instance, when some are behind PgBouncer).
	Schedules int
	// Period is the schedules' period, whole seconds dividing a minute
	// (default 1s).
	Period time.Duration
	// Window is the schedules' catch-up window (default 1m): longer than
	// the longest a schedule falls behind in a run, its database stalls
	// (a restart, an exhausted server, 10 s and more on a loaded 2-core
	// machine) plus the backlog's drain, so that an instant due during a
	// fault runs rather than being skipped as missed. The run prints the
	// start lags ("schedule start lag").
	Window time.Duration
	// MaxOffset bounds the injected clock offsets (default 5s).
	MaxOffset time.Duration
	// Executable is the binary started for each instance; it must call
	// MaybeWorker first thing. Default: this process's own executable.
	Executable string
	// Dir receives the instances' logs. Default: a temporary directory,
	// removed after a run without violations.
	Dir string
	// Out receives progress lines (default: discarded).
	Out io.Writer
	// Patroni runs the database as a Patroni cluster (etcd and two
	// PostgreSQL nodes on loopback, see docs/RELIABILITY.md) instead of one
	// server; the instances connect through a multi-host URL with
	// target_session_attrs=read-write and nobody goes through PgBouncer.
	// Needs patroni, patronictl and etcd (ErrNoPatroni).
	Patroni bool
	// Sync turns Patroni's synchronous_mode on (patronictl edit-config)
	// before the faults; false is asynchronous replication. Needs Patroni.
	Sync bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Duration <= 0 {
		return c, errors.New("chaos: Config.Duration: must be positive")
	}
	if c.Seed == 0 {
		c.Seed = rand.Int64N(1<<53) + 1
	}
	if c.Instances == 0 {
		c.Instances = 4
	}
	if c.Instances < 2 {
		return c, errors.New("chaos: Config.Instances: need at least 2")
	}
	if c.NoFaults {
		c.Faults = []Fault{}
	} else if c.Faults == nil && c.Patroni {
		c.Faults = slices.Clone(PatroniFaults)
	} else if c.Faults == nil {
		c.Faults = slices.Clone(AllFaults)
	}
	if c.Sync && !c.Patroni {
		return c, errors.New("chaos: Config.Sync: synchronous_mode needs Config.Patroni")
	}
	for _, f := range c.Faults {
		switch {
		case c.Patroni && (f == FaultRestart || f == FaultBouncer):
			return c, fmt.Errorf("chaos: Config.Faults: %q is not modelled with Config.Patroni (Patroni restarts its own servers; no PgBouncer in that topology)", f)
		case !c.Patroni && slices.Contains(PatroniFaults, f):
			return c, fmt.Errorf("chaos: Config.Faults: %q needs Config.Patroni", f)
		}
	}
	if slices.Contains(c.Faults, FaultBouncer) {
		if c.Bouncer == 0 {
			c.Bouncer = c.Instances / 2
		}
		if c.Bouncer < 0 || c.Bouncer > c.Instances {
			return c, errors.New("chaos: Config.Bouncer: out of range")
		}
	} else {
		c.Bouncer = 0
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 1500 * time.Millisecond
	}
	if c.RowsPerSecond == 0 {
		c.RowsPerSecond = 40
	}
	if c.Broken != "" && !slices.Contains(brokenModes, c.Broken) {
		return c, fmt.Errorf("chaos: Config.Broken: unknown mode %q (known: %v)", c.Broken, brokenModes)
	}
	if c.Schedules == 0 {
		c.Schedules = 50
	}
	if c.Schedules < 0 {
		return c, errors.New("chaos: Config.Schedules: must not be negative")
	}
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.Period < time.Second || c.Period%time.Second != 0 || time.Minute%c.Period != 0 {
		return c, errors.New("chaos: Config.Period: must be whole seconds dividing a minute")
	}
	if c.Window == 0 {
		c.Window = time.Minute
	}
	if c.MaxOffset == 0 {
		c.MaxOffset = 5 * time.Second
	}
	if c.Window < 2*c.MaxOffset+4*c.Period {
		return c, errors.New("chaos: Config.Window: must exceed 2*MaxOffset + 4*Period")
	}
	if c.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return c, err
		}
		c.Executable = exe
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c, nil
}

// timing of the workload, derived from the Config.
func (c Config) worker() workerConfig {
	return workerConfig{
		Broken:         c.Broken,
		Period:         c.Period,
		Window:         c.Window,
		Schedules:      c.Schedules,
		SchedWork:      100 * time.Millisecond,
		SchedLease:     2 * time.Second,
		SchedPoll:      time.Second,
		SchedAttempts:  10,
		PollEvery:      200 * time.Millisecond,
		BatchSize:      20,
		WorkPerRow:     10 * time.Millisecond,
		RowLease:       2 * time.Second,
		SweepEvery:     time.Second,
		MaxAttempts:    3,
		ElectorTTL:     2 * time.Second,
		HeartbeatEvery: 250 * time.Millisecond,
		FailPermille:   5,
		RetryPermille:  10,
		Seed:           c.Seed,
	}
}

// pauseRange is how long a SIGSTOP lasts: always longer than the row lease,
// the schedules' lease and the elector's TTL, so the paused instance wakes
// up as a zombie whose claims, runs and locks were taken over.
func (c Config) pauseRange() (lo, hi time.Duration) {
	w := c.worker()
	longest := max(w.RowLease, w.SchedLease, w.ElectorTTL)
	return longest + w.SweepEvery + 500*time.Millisecond, longest + 4*time.Second
}

// Result is the outcome of a run.
type Result struct {
	Seed     int64         // the seed the run used (to replay it)
	Config   Config        // the configuration, defaults filled in
	Faults   []FaultCount  // faults injected, by kind
	Checks   []Check       // every invariant checked
	Stats    []Stat        // figures of the workload
	Dir      string        // where the logs are (kept when there were violations)
	Duration time.Duration // how long the whole run took
}

// FaultCount is how many faults of one kind were injected.
type FaultCount struct {
	Kind   Fault
	Count  int    // how many were injected (for FaultBouncer: instances behind it)
	Detail string // e.g. how many landed mid-batch
}

// Violations is the number of violations over all checks.
func (r *Result) Violations() int {
	n := 0
	for _, c := range r.Checks {
		n += c.Violations
	}
	return n
}

// Check returns the check called name, or nil.
func (r *Result) Check(name string) *Check {
	for i := range r.Checks {
		if r.Checks[i].Name == name {
			return &r.Checks[i]
		}
	}
	return nil
}

// faultLog counts injected faults.
type faultLog struct {
	mu         sync.Mutex
	n          map[Fault]int
	midBatch   map[Fault]int // FaultSchedule: mid-run
	terminated int
	offsets    []int64
	kills      []hit
	stops      []stop
	restarts   []time.Time
	paused     map[string]bool // schedules paused now
}

// stop is a SIGSTOP and when its SIGCONT came (zero: never).
type stop struct {
	hit
	to time.Time
}

// resumed records the SIGCONT of holder's open stop.
func (f *faultLog) resumed(holder string, at time.Time) {
	if at.IsZero() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.stops {
		if f.stops[i].holder == holder && f.stops[i].to.IsZero() {
			f.stops[i].to = at
		}
	}
}

func (f *faultLog) midRun(hits []hit) int {
	n := 0
	for _, h := range hits {
		if h.midRun {
			n++
		}
	}
	return n
}

func (f *faultLog) add(k Fault, mid bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[k]++
	if mid {
		f.midBatch[k]++
	}
}

// Run starts a Postgres server it controls, the instances and (when
// enabled) PgBouncer, injects faults for cfg.Duration, lets the system
// quiesce, stops everything and checks the invariants.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, faults: &faultLog{n: map[Fault]int{}, midBatch: map[Fault]int{}, paused: map[string]bool{}}}
	return h.run(ctx)
}

type harness struct {
	cfg    Config
	srv    *pgtest.Server
	db     *pgtest.Database
	pool   *pgxpool.Pool
	bnc    *bouncer.Bouncer
	pat    *patroniRun // Config.Patroni
	insts  []*instance
	sched  *schedule.Scheduler // pauses and resumes schedules
	pauses int                 // pause faults drawn (inject's goroutine only)
	faults *faultLog
	probe  Check
	stalls stallWatch

	mu       sync.Mutex
	stopping bool // no more restarts of killed instances
	restarts sync.WaitGroup
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Out, "chaos: "+format+"\n", args...)
}

func (h *harness) run(ctx context.Context) (res *Result, err error) {
	began := time.Now()
	cfg := h.cfg
	h.logf("seed %d, %s of faults %v, %d instances (%d behind PgBouncer)%s%s",
		cfg.Seed, cfg.Duration, cfg.Faults, cfg.Instances, cfg.Bouncer, patroniNote(cfg), brokenNote(cfg.Broken))

	dir := cfg.Dir
	tempDir := dir == ""
	if tempDir {
		if dir, err = os.MkdirTemp("", "chaos-run-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}

	var dbURL string
	if cfg.Patroni {
		if h.pat, err = startPatroniRun(ctx, dir, cfg.Sync, h.logf); err != nil {
			return nil, err
		}
		defer h.pat.stop()
		dbURL = h.pat.c.url(patroniDB)
	} else {
		h.srv, err = pgtest.Start(ctx, pgtest.Config{NoContainer: true})
		if err != nil {
			return nil, err
		}
		defer h.srv.Close()
		if slices.Contains(cfg.Faults, FaultRestart) && h.srv.Source() != pgtest.SourceLocal {
			return nil, fmt.Errorf("chaos: the restart fault needs a cluster started from local binaries, got a %s server (unset %s)", h.srv.Source(), pgtest.EnvURL)
		}
		h.db, err = h.srv.CreateDatabase(ctx, pgtest.Template{Name: templateName, Setup: setupSchema})
		if err != nil {
			return nil, err
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = h.db.Drop(dctx)
		}()
		dbURL = h.db.URL
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = harnessAppName
	pcfg.MaxConns = 4
	if cfg.Patroni {
		// Per host: a silent node must not use up a statement's whole
		// deadline before the next host is tried.
		pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	}
	if h.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	defer h.pool.Close()
	if h.sched, err = schedule.New(h.pool, schedule.Config{Holder: harnessAppName, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		return nil, err
	}

	if cfg.Bouncer > 0 {
		if h.bnc, err = bouncer.Start(ctx, h.srv.URL(), h.db.Name); err != nil {
			return nil, err
		}
		defer h.bnc.Stop()
		h.probe = probePooler(ctx, h.bnc.URL(h.db.Name, harnessAppName))
		sctx, stopSupervise := context.WithCancel(ctx)
		defer stopSupervise()
		go h.bnc.Supervise(sctx, h.logf)
	}

	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6368616f73))
	for i := 0; i < cfg.Instances; i++ {
		in := &instance{
			name:    fmt.Sprintf("i%d", i),
			bouncer: i >= cfg.Instances-cfg.Bouncer,
			exe:     cfg.Executable,
			logPath: instanceLog(dir, fmt.Sprintf("i%d", i)),
		}
		in.cfg = cfg.worker()
		in.cfg.Name = in.name
		if h.pat != nil {
			in.cfg.Acks = true
			in.observe = h.pat.line
		}
		in.cfg.Bouncer = in.bouncer
		in.cfg.SchedGroups = cfg.schedGroups(in.bouncer)
		app := appNamePrefix + fmt.Sprint(i)
		if in.bouncer {
			in.cfg.URL = h.bnc.URL(h.db.Name, app)
		} else {
			in.cfg.URL = dbURL + "&application_name=" + app + "&connect_timeout=5"
			if !strings.Contains(dbURL, "?") {
				in.cfg.URL = dbURL + "?application_name=" + app + "&connect_timeout=5"
			}
		}
		if slices.Contains(cfg.Faults, FaultClock) {
			in.cfg.OffsetMS = randOffset(rng, cfg.MaxOffset)
		}
		h.insts = append(h.insts, in)
	}
	defer h.stopAll()
	for _, in := range h.insts {
		if err := in.start(); err != nil {
			return nil, err
		}
	}
	for _, in := range h.insts {
		if err := in.waitReady(time.Minute); err != nil {
			return nil, err
		}
	}
	// Retried: under load a node may not answer one connection attempt
	// in time right after the cluster came up (a Patroni primary did not
	// answer within its 2 s per host once in CI, and the run ended before
	// any fault).
	tStart, err := h.dbNowRetry(ctx)
	if err != nil {
		return nil, err
	}
	tStart = tStart.Truncate(cfg.Period).Add(cfg.Period)
	h.logf("instances ready; injecting faults until %s", time.Now().Add(cfg.Duration).Format(time.TimeOnly))

	prodCtx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	var prodWG sync.WaitGroup
	prodWG.Add(1)
	go func() { defer prodWG.Done(); h.produce(prodCtx) }()

	faultCtx, stopFaults := context.WithTimeout(ctx, cfg.Duration)
	go h.progress(faultCtx)
	stallCtx, stopStalls := context.WithCancel(ctx)
	defer stopStalls()
	go h.stalls.run(stallCtx, h.pool)
	var patWG sync.WaitGroup
	sampleCtx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	if h.pat != nil {
		h.pat.startSampler(sampleCtx)
		prng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x706174726f6e69))
		patWG.Add(1)
		go func() { defer patWG.Done(); h.injectPatroni(faultCtx, prng) }()
	}
	h.inject(faultCtx, rng)
	// A Patroni fault under way runs to its end: the cluster whole again.
	patWG.Wait()
	stopFaults()
	if ctx.Err() != nil {
		stopProducer()
		prodWG.Wait()
		return nil, ctx.Err()
	}

	// Quiesce: no more faults; wake the paused, restart the killed.
	h.logf("faults stopped; quiescing")
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	h.restarts.Wait()
	for _, in := range h.insts {
		switch in.getState() {
		case statePaused:
			h.faults.resumed(in.incarnations()[len(in.incarnations())-1].holder, in.resume())
		case stateKilled:
			if err := in.start(); err != nil {
				return nil, err
			}
		}
	}
	for _, in := range h.insts {
		if err := in.waitReady(time.Minute); err != nil {
			h.logf("%v", err)
		}
	}
	tStop, err := h.dbNowRetry(ctx)
	if err != nil {
		return nil, err
	}
	stopProducer()
	prodWG.Wait()
	settleErr := h.settle(ctx, tStop)
	if settleErr != nil {
		h.logf("%v", settleErr)
	}
	h.stopAll()
	stopSampler()
	stopStalls()

	var unexpected []string
	incarnations := 0
	for _, in := range h.insts {
		incarnations += len(in.incarnations())
		unexpected = append(unexpected, in.unexpectedExits()...)
	}
	if h.bnc != nil && h.bnc.Exited() {
		// Not a modelled fault: the instances behind it were cut off.
		unexpected = append(unexpected, "pgbouncer exited during the run: "+h.bnc.LogTail())
	}
	h.faults.mu.Lock()
	faulted := false
	for k, n := range h.faults.n {
		faulted = faulted || (k != FaultBouncer && n > 0)
	}
	kills, stops, restarts := slices.Clone(h.faults.kills), slices.Clone(h.faults.stops), slices.Clone(h.faults.restarts)
	h.faults.mu.Unlock()
	w := cfg.worker()
	// The checks get time of their own: a run whose settling used up the
	// caller's deadline (a broken worker's rows may never settle) is still
	// checked, and its violations reported.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	checks, stats, err := check(cctx, h.pool, checkParams{
		schedules:      cfg.scheduleNames(),
		schedLease:     w.SchedLease,
		schedPoll:      w.SchedPoll,
		faulted:        faulted,
		kills:          kills,
		stops:          stops,
		restarts:       restarts,
		stalls:         h.stalls.spans(),
		groupInstances: h.groupInstances(),
		period:         cfg.Period,
		maxAttempts:    cfg.worker().MaxAttempts,
		tStart:         tStart,
		tStop:          tStop,
		elections:      h.elections(),
		unexpected:     unexpected,
		processes:      incarnations,
	})
	if err != nil {
		return nil, err
	}
	if h.probe.Name != "" {
		checks = append(checks, h.probe)
	}
	if h.pat != nil {
		pc, ps, err := h.pat.check(cctx, h.pool)
		if err != nil {
			return nil, err
		}
		checks, stats = append(checks, pc...), append(stats, ps...)
	}
	batches := ""
	for _, in := range h.insts {
		if batches != "" {
			batches += ", "
		}
		batches += fmt.Sprintf("%s %d", in.name, in.batches.Load())
	}
	stats = append(stats, Stat{Name: "batches seen", Value: batches})
	stats = append(stats, Stat{Name: "database stalls", Value: h.stalls.summary()})
	if h.bnc != nil {
		if n := len(h.bnc.KnownCrashes()); n > 0 {
			// Not ours: an upstream bug of the packaged PgBouncer, which a
			// service manager restarts. The instances behind it were cut off
			// meanwhile, as with a terminated backend.
			stats = append(stats, Stat{Name: "pgbouncer", Value: fmt.Sprintf("exited %d time(s) on its own state checks (PgBouncer's known bugs, e.g. pgbouncer/pgbouncer#822 and #801) and was started again on the same port: %s", n, strings.Join(h.bnc.KnownCrashes(), "; "))})
		}
	}
	res = &Result{
		Seed: cfg.Seed, Config: cfg, Checks: checks, Stats: stats,
		Faults: h.faultCounts(), Dir: dir, Duration: time.Since(began),
	}
	if res.Violations() == 0 && tempDir {
		_ = os.RemoveAll(dir)
		res.Dir = ""
	}
	return res, nil
}

// schedGroups are the schedule groups an instance runs: the advisory group
// when it is direct, the lease group when some instance is behind
// PgBouncer.
func (c Config) schedGroups(bouncer bool) []string {
	var gs []string
	if !bouncer {
		gs = append(gs, schedGroupAdv)
	}
	if c.Bouncer > 0 {
		gs = append(gs, schedGroupLease)
	}
	return gs
}

// groupInstances maps each schedule group to the instances running it.
func (h *harness) groupInstances() map[string][]string {
	m := map[string][]string{}
	for _, in := range h.insts {
		for _, g := range in.cfg.SchedGroups {
			m[g] = append(m[g], in.name)
		}
	}
	return m
}

// scheduleNames lists every schedule of the run.
func (c Config) scheduleNames() []string {
	var names []string
	for _, g := range c.schedGroups(false) {
		if g == schedGroupAdv && c.Bouncer == c.Instances {
			continue
		}
		for i := 0; i < c.Schedules; i++ {
			names = append(names, schedName(g, i))
		}
	}
	return names
}

func patroniNote(c Config) string {
	switch {
	case c.Patroni && c.Sync:
		return ", Patroni (2 nodes, synchronous_mode on)"
	case c.Patroni:
		return ", Patroni (2 nodes, asynchronous)"
	}
	return ""
}

func brokenNote(b string) string {
	if b == "" {
		return ""
	}
	return ", deliberately broken worker: " + b
}

func randOffset(rng *rand.Rand, maxOffset time.Duration) int64 {
	m := maxOffset.Milliseconds()
	return rng.Int64N(2*m+1) - m
}

func (h *harness) elections() []string {
	var out []string
	if h.cfg.Bouncer < h.cfg.Instances {
		out = append(out, electionDirect)
	}
	if h.cfg.Bouncer > 0 {
		out = append(out, electionBouncer)
	}
	return out
}

func (h *harness) stopAll() {
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	h.restarts.Wait()
	var wg sync.WaitGroup
	for _, in := range h.insts {
		wg.Add(1)
		go func() { defer wg.Done(); in.stop(15 * time.Second) }()
	}
	wg.Wait()
}

func (h *harness) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := h.pool.QueryRow(ctx, "SELECT now()").Scan(&t)
	return t, err
}

// dbNowRetry reads database time, retrying while the server restarts.
func (h *harness) dbNowRetry(ctx context.Context) (time.Time, error) {
	var last error
	for i := 0; i < 100; i++ {
		t, err := h.dbNow(ctx)
		if err == nil {
			return t, nil
		}
		last = err
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Time{}, last
}

// progress prints a line a minute while faults are injected.
func (h *harness) progress(ctx context.Context) {
	began := time.Now()
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var rows, open int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = h.pool.QueryRow(qctx, "SELECT count(*), count(*) FILTER (WHERE state IN ('PAUSED', 'PROCESSING')) FROM chaos_rows").Scan(&rows, &open)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.faults.mu.Lock()
		n := 0
		for _, c := range h.faults.n {
			n += c
		}
		h.faults.mu.Unlock()
		h.logf("%s: %d faults injected, %d rows (%d open)", time.Since(began).Round(time.Second), n, rows, open)
	}
}

// produce inserts new PAUSED rows at the configured rate.
func (h *harness) produce(ctx context.Context) {
	const step = 100 * time.Millisecond
	per := float64(h.cfg.RowsPerSecond) * step.Seconds()
	owed := 0.0
	t := time.NewTicker(step)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owed += per
		n := int(owed)
		if n == 0 {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := h.pool.Exec(ictx, "INSERT INTO chaos_rows (state) SELECT 'PAUSED' FROM generate_series(1, $1)", n)
		cancel()
		if err == nil {
			owed -= float64(n)
			if h.pat != nil {
				h.pat.first(time.Now(), func(e *promotion) *time.Time { return &e.firstWrite })
			}
		}
	}
}

// settle waits until every row is finished and every schedule's instants
// up to tStop are recorded and finished, or gives up after a generous
// bound: what is left then is reported by the checker.
func (h *harness) settle(ctx context.Context, tStop time.Time) error {
	w := h.cfg.worker()
	minWait := 4*h.cfg.Period + time.Second
	deadline := time.Now().Add(4*time.Minute + minWait)
	began := time.Now()
	names := h.cfg.scheduleNames()
	for {
		var open, openRuns, recorded int
		err := h.pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM chaos_rows WHERE state IN ('PAUSED', 'PROCESSING')),
			(SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule = ANY($1) AND instant <= $2
			   AND state NOT IN ('succeeded', 'failed', 'skipped')),
			(SELECT count(*) FROM pgclaim_schedules s WHERE s.name = ANY($1) AND EXISTS (
			   SELECT 1 FROM pgclaim_schedule_runs r WHERE r.schedule = s.name AND r.instant >= $2))`,
			names, tStop).Scan(&open, &openRuns, &recorded)
		if h.cfg.Broken == BrokenNoLedger {
			openRuns, recorded = 0, len(names)
		}
		if err == nil && open == 0 && openRuns == 0 && recorded == len(names) && time.Since(began) >= minWait {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("chaos: settle: %w", err)
			}
			return fmt.Errorf("chaos: %d rows still PAUSED or PROCESSING, %d schedule runs open, %d of %d schedules recorded up to the end, %s after faults stopped",
				open, openRuns, recorded, len(names), time.Since(began).Round(time.Second))
		}
		if !sleepCtx(ctx, w.SweepEvery/2) {
			return ctx.Err()
		}
	}
}

// probePooler checks that the advisory variants refuse to run behind a
// transaction-pooling PgBouncer, with gate.ErrPooler, and that the lease
// variants work there.
func probePooler(ctx context.Context, url string) Check {
	c := Check{Name: checkPooler}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		c.fail("connect through PgBouncer: %v", err)
		return c
	}
	defer pool.Close()
	g, err := gate.New(pool, gate.Config{Holder: "probe"})
	if err != nil {
		c.fail("gate.New: %v", err)
		return c
	}
	defer g.Close()
	ran := false
	fn := func(context.Context, gate.Run) error { ran = true; return nil }
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	c.Checked++
	if err := g.Once(pctx, "chaos-probe", time.Now(), fn); !errors.Is(err, gate.ErrPooler) {
		c.fail("advisory Gate.Once behind PgBouncer: got %v, want gate.ErrPooler", err)
	}
	c.Checked++
	if err := g.Exclusive(pctx, "chaos-probe", fn); !errors.Is(err, gate.ErrPooler) {
		c.fail("advisory Gate.Exclusive behind PgBouncer: got %v, want gate.ErrPooler", err)
	}
	c.Checked++
	e, err := gate.NewElector(pool, "chaos-probe", gate.ElectorConfig{Holder: "probe", TTL: time.Second})
	if err == nil {
		_, err = e.Campaign(pctx)
	}
	if !errors.Is(err, gate.ErrPooler) {
		c.fail("advisory Elector.Campaign behind PgBouncer: got %v, want gate.ErrPooler", err)
	}
	if ran {
		c.fail("an advisory job ran behind PgBouncer")
	}
	// The lease variants work there.
	c.Checked++
	l, err := gate.NewLease(pool, "chaos-probe", gate.LeaseConfig{Holder: "probe", AtMost: time.Second})
	if err == nil {
		err = l.Do(pctx, func(context.Context, gate.Run) error { return nil })
	}
	if err != nil {
		c.fail("gate.Lease behind PgBouncer: %v", err)
	}
	c.Checked++
	le, err := gate.NewElector(pool, "chaos-probe-lease", gate.ElectorConfig{Holder: "probe", Mechanism: gate.LeaseRow, TTL: time.Second})
	if err == nil {
		if _, err = le.Campaign(pctx); err == nil {
			err = le.Resign(pctx)
		}
	}
	if err != nil {
		c.fail("lease Elector behind PgBouncer: %v", err)
	}
	return c
}
