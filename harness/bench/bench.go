package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Scenarios lists the scenario names in the order they run.
var Scenarios = []string{"claims", "baselines", "gates", "sweeper", "failover", "scale", "instances", "schedules", "herd", "latency"}

// Config configures a benchmark run.
type Config struct {
	// Quick runs every scenario at a small scale (a few minutes on two
	// cores), still checking for duplicates.
	Quick bool
	// DatabaseURL names a server to run on; the role needs CREATEDB, since
	// every scenario gets a fresh database. Empty: provision one like the
	// tests do (pgtest.Start).
	DatabaseURL string
	// Scenarios selects scenarios by name (see Scenarios); empty runs all.
	Scenarios []string
	// SVG, when set, is the path the claim-throughput chart is written to.
	SVG string
	// Progress receives progress lines (typically os.Stderr); nil discards.
	Progress io.Writer
	// HerdRoom, when set, runs the herd scenario at equal room only: the
	// shapes of herdRoomShapes, pgclaim's MaxConcurrent and River's
	// MaxWorkers both HerdRoom.
	HerdRoom int

	// params overrides the sizes chosen by Quick (tests).
	params *params
	// server, when set, is used instead of provisioning one (tests); it is
	// not closed.
	server *pgtest.Server
}

// params are the sizes of a run.
type params struct {
	// claims: N PAUSED rows claimed and finished by K workers in batches.
	ClaimRows    int
	ClaimWorkers []int
	ClaimBatches []int
	ClaimTimeBox time.Duration // a combination stops claiming after this long

	// baselines
	FieldInstances []int   // the SELECT-then-CAS loop, K instances
	BulkRepeats    int     // bulk UPDATE runs (median reported)
	Compare        []point // (workers, batch) for hand-written SQL and claim.Worker
	CompareRepeats int     // alternating runs of hand-written SQL and pgclaim
	WorkerRows     int     // rows for the claim.Worker drain

	GateDuration   time.Duration
	GateRounds     int // the duration is split into rounds that take turns
	GateContenders []int

	SweepRows     int
	SweepBatch    int
	SweepSweepers []int
	SweepTimeBox  time.Duration // sweeping stops after this long if rows remain
	SweepRepeats  int           // runs of each approach, taking turns; the fastest is reported

	FailoverRounds int
	FailoverLong   bool // include the default-TTL SIGKILL case (TTL-bound)

	ScaleSizes          []int64
	ScaleClaimable      int
	ScaleBatch          int
	ScaleSamples        int
	ScaleNoIndexMax     int64
	ScaleNoIndexSamples int

	// instances: each count of instance processes in turn, each for
	// InstanceWindow, on a table of InstanceRows PAUSED rows.
	Instances      []int
	InstanceRows   int
	InstanceWindow time.Duration
	InstanceProcs  int // GOMAXPROCS of each instance process

	// schedules: SchedInstances schedulers; the idle phase with
	// SchedSchedules yearly schedules, the due-every-second phases (the
	// scheduler, then gate.Once on a timer) once per SchedBusySchedules
	// size. Each phase starts up for SchedWarmup (the idle one up to
	// SchedSettle more, until its statement rate settles), then is
	// measured for SchedIdle or SchedBusy. The catch-up phases work off a
	// backlog of each SchedBacklogs size, one instance, with session and
	// with lease locks.
	SchedInstances     int
	SchedSchedules     int
	SchedBusySchedules []int
	SchedWarmup        time.Duration
	SchedSettle        time.Duration
	SchedIdle          time.Duration
	SchedBusy          time.Duration
	SchedBacklogs      []int

	// herd: each shape in turn, each side in turn (see herdShape).
	HerdShapes []herdShape

	// latency: LatencySamples rows, one every LatencyInterval, per worker
	// measured; its idle cost over LatencyIdle, LatencySettle after it
	// listens; River's client too when LatencyRiver. The stampede:
	// LatencyStampede instances × workers, LatencyStampedeSamples rows.
	// The trigger's cost to the claims: LatencyClaimWorkers workers on
	// LatencyClaimRows rows per batch size, LatencyClaimRepeats runs each
	// way.
	LatencySamples         int
	LatencyInterval        time.Duration
	LatencyIdle            time.Duration
	LatencySettle          time.Duration
	LatencyRiver           bool
	LatencyStampede        stampede
	LatencyStampedeSamples int
	LatencyClaimWorkers    int
	LatencyClaimRows       int
	LatencyClaimBatches    []int
	LatencyClaimRepeats    int
}

// stampede is a shape of the latency scenario's stampede.
type stampede struct{ Instances, Workers int }

type point struct{ Workers, Batch int }

func fullParams() *params {
	return &params{
		ClaimRows:    200_000,
		ClaimWorkers: []int{1, 2, 4, 8, 16},
		ClaimBatches: []int{1, 10, 100, 1000},
		ClaimTimeBox: 12 * time.Second,

		FieldInstances: []int{2, 8},
		BulkRepeats:    3,
		Compare:        []point{{8, 1}, {2, 100}, {8, 100}},
		CompareRepeats: 3,
		WorkerRows:     50_000,

		GateDuration:   4 * time.Second,
		GateRounds:     4,
		GateContenders: []int{1, 8},

		SweepRows:     1_000_000,
		SweepBatch:    1000,
		SweepSweepers: []int{1, 2},
		SweepTimeBox:  100 * time.Second,
		SweepRepeats:  2,

		FailoverRounds: 10,
		FailoverLong:   true,

		ScaleSizes:          []int64{10_000, 100_000, 1_000_000, 10_000_000},
		ScaleClaimable:      1000,
		ScaleBatch:          100,
		ScaleSamples:        200,
		ScaleNoIndexMax:     1_000_000,
		ScaleNoIndexSamples: 20,

		Instances:      []int{8, 32, 64},
		InstanceRows:   1_000_000,
		InstanceWindow: 10 * time.Second,
		InstanceProcs:  1,

		SchedInstances:     8,
		SchedSchedules:     200,
		SchedBusySchedules: []int{5, 25, 200},
		SchedWarmup:        5 * time.Second,
		SchedSettle:        60 * time.Second,
		SchedIdle:          20 * time.Second,
		SchedBusy:          20 * time.Second,
		SchedBacklogs:      []int{50, 2000},

		HerdShapes: []herdShape{
			{Instances: 8, Schedules: 50, Period: 10 * time.Second, Instants: 3, Sides: []string{"pgclaim", "river"}},
			{Instances: 8, Schedules: 500, Period: 10 * time.Second, Instants: 3, Sides: []string{"pgclaim", "river"}},
			// Equal room: River with the room pgclaim's default gives
			// (8 × 100 ≥ 500: every job in one wave on both sides).
			herdRoomShapes(100)[0],
			// pgclaim with room for 400 of the 500 at once: the last 100
			// start when the first jobs end.
			{Instances: 8, Schedules: 500, Period: 10 * time.Second, Instants: 3, MaxConcurrent: 50, Sides: []string{"pgclaim"}},
			{Instances: 8, Schedules: 200, Period: time.Second, Instants: 20, Sides: []string{"pgclaim", "river"}},
			{Instances: 8, Schedules: 200, Period: 10 * time.Second, Instants: 3, Sides: []string{"robfig", "pgclaim"}},
			// 64 × (MaxConns + the dedicated sessions) does not fit in 100
			// connections: the server is sized to the stated budget.
			{Instances: 64, Schedules: 100, Period: 10 * time.Second, Instants: 3, MaxConnections: 64*(herdPoolConns+schedDedicated) + 10, Sides: []string{"pgclaim", "river"}},
			herdRoomShapes(100)[1],
			// The same, each instance a process of its own, as a service's
			// instances run.
			{Instances: 64, Schedules: 100, Period: 10 * time.Second, Instants: 3, MaxConnections: 64*(herdPoolConns+schedDedicated) + 10, Processes: true, Sides: []string{"pgclaim"}},
			// And behind PgBouncer in transaction mode on a stock server:
			// lease locks, the server's connections PgBouncer's pool.
			{Instances: 64, Schedules: 100, Period: 10 * time.Second, Instants: 3, Processes: true, Bouncer: true, Sides: []string{"pgclaim"}},
		},

		LatencySamples:         100,
		LatencyInterval:        100 * time.Millisecond,
		LatencyIdle:            10 * time.Second,
		LatencySettle:          11 * time.Second,
		LatencyRiver:           true,
		LatencyStampede:        stampede{Instances: 8, Workers: 2},
		LatencyStampedeSamples: 100,
		LatencyClaimWorkers:    8,
		LatencyClaimRows:       200_000,
		LatencyClaimBatches:    []int{10, 100},
		LatencyClaimRepeats:    2,
	}
}

func quickParams() *params {
	return &params{
		ClaimRows:    20_000,
		ClaimWorkers: []int{1, 2, 8},
		ClaimBatches: []int{10, 100},
		ClaimTimeBox: 4 * time.Second,

		FieldInstances: []int{2},
		BulkRepeats:    1,
		Compare:        []point{{8, 100}},
		CompareRepeats: 1,
		WorkerRows:     5_000,

		GateDuration:   1 * time.Second,
		GateRounds:     2,
		GateContenders: []int{1, 8},

		SweepRows:     50_000,
		SweepBatch:    1000,
		SweepSweepers: []int{1, 2},
		SweepTimeBox:  30 * time.Second,

		FailoverRounds: 3,
		FailoverLong:   false,

		ScaleSizes:          []int64{10_000, 100_000},
		ScaleClaimable:      1000,
		ScaleBatch:          100,
		ScaleSamples:        50,
		ScaleNoIndexMax:     100_000,
		ScaleNoIndexSamples: 5,

		Instances:      []int{2, 8},
		InstanceRows:   100_000,
		InstanceWindow: 3 * time.Second,
		InstanceProcs:  1,

		SchedInstances:     4,
		SchedSchedules:     25,
		SchedBusySchedules: []int{25},
		SchedWarmup:        2 * time.Second,
		SchedSettle:        10 * time.Second,
		SchedIdle:          4 * time.Second,
		SchedBusy:          5 * time.Second,
		SchedBacklogs:      []int{50, 500},

		// River's side needs a build of its own module: left out here.
		HerdShapes: []herdShape{{Instances: 4, Schedules: 50, Period: 10 * time.Second, Instants: 2, Sides: []string{"pgclaim"}}},

		// River left out as in herd; the idle windows short (a poll every
		// second: two of them).
		LatencySamples:         20,
		LatencyInterval:        100 * time.Millisecond,
		LatencyIdle:            2 * time.Second,
		LatencySettle:          time.Second,
		LatencyStampede:        stampede{Instances: 8, Workers: 2},
		LatencyStampedeSamples: 20,
		LatencyClaimWorkers:    8,
		LatencyClaimRows:       20_000,
		LatencyClaimBatches:    []int{100},
		LatencyClaimRepeats:    1,
	}
}

type scenarioFunc func(ctx context.Context, e *env, p *params, r *ScenarioReport) error

var scenarioFuncs = map[string]struct {
	title string
	run   scenarioFunc
}{
	"claims":    {"Row claims: claim + finish with the effect in the finishing transaction", runClaims},
	"baselines": {"Claim baselines: the field loop, a bulk UPDATE, hand-written SQL, the worker loop", runBaselines},
	"gates":     {"Gates: acquire + release cycles, against a ShedLock-style lock table and a bare advisory lock", runGates},
	"sweeper":   {"Stale sweeper: stuck PROCESSING rows moved to FAILED", runSweeper},
	"failover":  {"Failover: time until a standby process leads", runFailover},
	"scale":     {"Scale: claim latency as the table grows, 1,000 claimable rows", runScale},
	"instances": {"Instances: claim throughput and gate costs with many instance processes against one server", runInstances},
	"schedules": {"Schedules: the scheduler's idle cost, cost per instant and wake-up lag, against gate.Once", runSchedules},
	"herd":      {"Herd: many jobs due at one instant on many instances, on a stock server, against River's periodic jobs", runHerd},
	"latency":   {"Latency: how soon an idle worker starts a new row, and what it costs idle, against River's client", runLatency},
}

// Run runs the selected scenarios and returns the report. It returns an
// error when the server could not be provisioned or a name is unknown; a
// scenario that fails is recorded in the report (see Report.Failed) and the
// others still run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	sel := Scenarios
	if len(cfg.Scenarios) > 0 {
		sel = nil
		for _, n := range cfg.Scenarios {
			n = strings.TrimSpace(n)
			if n == "" {
				continue
			}
			if _, ok := scenarioFuncs[n]; !ok {
				return nil, fmt.Errorf("bench: unknown scenario %q (known: %s)", n, strings.Join(Scenarios, ", "))
			}
			if !slices.Contains(sel, n) {
				sel = append(sel, n)
			}
		}
		// run in the canonical order
		slices.SortFunc(sel, func(a, b string) int { return slices.Index(Scenarios, a) - slices.Index(Scenarios, b) })
	}
	p := cfg.params
	if p == nil {
		p = fullParams()
		if cfg.Quick {
			p = quickParams()
		}
	}
	if cfg.HerdRoom > 0 {
		p.HerdShapes = herdRoomShapes(cfg.HerdRoom)
	}
	prog := newProgress(cfg.Progress)
	start := time.Now()
	e, err := newEnv(ctx, cfg, prog)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &Report{
		Command: commandLine(cfg),
		Quick:   cfg.Quick,
		Started: start.UTC().Truncate(time.Second),
		Machine: e.machine(ctx),
	}
	for _, name := range sel {
		sf := scenarioFuncs[name]
		sr := &ScenarioReport{Name: name, Title: sf.title}
		rep.Scenarios = append(rep.Scenarios, sr)
		prog.logf("== %s: %s", name, sf.title)
		t0 := time.Now()
		err := sf.run(ctx, e, p, sr)
		sr.Seconds = time.Since(t0).Seconds()
		if err != nil {
			sr.Error = err.Error()
			prog.logf("!! %s failed: %v", name, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	rep.Ratios = ratios(rep)
	rep.Seconds = time.Since(start).Seconds()
	if cfg.SVG != "" {
		if svg := claimsSVG(rep); svg != nil {
			if err := os.WriteFile(cfg.SVG, svg, 0o644); err != nil {
				return rep, fmt.Errorf("bench: write chart: %w", err)
			}
			prog.logf("chart written to %s", cfg.SVG)
		}
	}
	if rep.Failed() {
		return rep, ErrChecksFailed
	}
	return rep, nil
}

func commandLine(cfg Config) string {
	s := "pgclaim bench"
	if cfg.Quick {
		s += " --quick"
	}
	if len(cfg.Scenarios) > 0 {
		s += " --scenarios " + strings.Join(cfg.Scenarios, ",")
	}
	if cfg.SVG != "" {
		s += " --svg " + cfg.SVG
	}
	return s
}

func goVersion() string { return runtime.Version() }
