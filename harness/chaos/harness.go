package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

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
