package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/pgclaim/pgclaim/harness/bench"
)

func init() {
	// The failover benchmark re-runs this executable as its leader and
	// standby processes; in such a child, run it and exit before main.
	bench.MaybeRunChild()
	register(command{name: "bench", summary: "benchmark claims, gates, sweeps, failover and schedules against the alternatives", run: runBench})
}

const benchAbout = `
Measures pgclaim side by side with what users would use instead, on one
PostgreSQL server in one run: row claims against the field's SELECT-then-CAS
loop and a single bulk UPDATE; gate cycles against a ShedLock-style lock table
and a bare advisory lock; the stale sweeper against one giant UPDATE; leader
failover against a polling standby; claim latency as the table grows; the
scheduler's idle cost, cost per instant and wake-up lag against gate.Once
(scenario schedules: 8 instances, 200 idle schedules, then 5, 25 and 200
due every second; 4 instances × 25 schedules with --quick); and many jobs
due at one instant on many instances of a stock server (max_connections
100) against River's periodic jobs and the robfig adapter (scenario herd:
8 × 50, 8 × 500 and 64 × 100 every 10 s, 8 × 200 every second, and 64
processes × 100 every 10 s on the server and behind PgBouncer; River's side
is built from harness/bench/herdriver, a module of its own; --quick runs
pgclaim's side at 4 × 50 only).

--herd-room N runs the herd at equal room only: pgclaim's MaxConcurrent and
River's MaxWorkers both N, at 8 × 500 and 64 × 100. With
PGCLAIM_BENCH_HERD_TRACE=FILE, every statement of the herd's pgclaim pools
goes to FILE, one line each: instance, statement name, start (Unix µs),
duration (µs), rows.

Without --database-url a throwaway PostgreSQL is provisioned as the tests do
(PGCLAIM_TEST_DATABASE_URL, a container, or local PostgreSQL binaries).
DATABASE_URL is deliberately not read: the benchmark creates and drops
databases and loads millions of rows. With --database-url the role needs
CREATEDB; each scenario runs in a fresh database that is dropped afterwards.

Progress goes to stderr, the tables (or JSON, or Markdown) to stdout. The
exit status is 1 when a duplicate (or another invariant check) was counted.
Absolute figures drift between runs and machines; read the ratios, which are
measured side by side in one run.`

func runBench(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "bench", "bench [--quick] [--scenarios LIST] [--svg FILE] [--markdown] [--database-url URL] [--json]", benchAbout)
	quick := f.Bool("quick", false, "small sizes: a few minutes on two cores, duplicate checks still on")
	scenarios := f.String("scenarios", "", "comma-separated scenarios to run: "+strings.Join(bench.Scenarios, ",")+" (default: all)")
	svg := f.String("svg", "", "write the claim-throughput chart (SVG) to this file")
	markdown := f.Bool("markdown", false, "print the report as Markdown instead of plain tables")
	cpuprofile := f.String("cpuprofile", "", "write a CPU profile of this process (the client side) to this file")
	jsonFile := f.String("json-file", "", "also write the JSON report to this file")
	herdRoom := f.Int("herd-room", 0, "run the herd scenario at equal room only: pgclaim's MaxConcurrent and River's MaxWorkers both N, at 8 × 500 and 64 × 100")
	f.Lookup("database-url").Usage = "run on this server instead of a throwaway one (the role needs CREATEDB; DATABASE_URL is not read)"
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if f.json && *markdown {
		return usagef("--json and --markdown exclude each other")
	}
	if *herdRoom < 0 {
		return usagef("--herd-room must not be negative")
	}
	cfg := bench.Config{Quick: *quick, DatabaseURL: f.url, SVG: *svg, Progress: e.progress, HerdRoom: *herdRoom}
	if *scenarios != "" {
		cfg.Scenarios = strings.Split(*scenarios, ",")
		for _, s := range cfg.Scenarios {
			if !contains(bench.Scenarios, strings.TrimSpace(s)) {
				return usagef("unknown scenario %q (known: %s)", s, strings.Join(bench.Scenarios, ", "))
			}
		}
	}
	if *cpuprofile != "" {
		pf, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		var werr error
		switch {
		case f.json:
			werr = rep.WriteJSON(e.stdout)
		case *markdown:
			werr = rep.WriteMarkdown(e.stdout)
		default:
			werr = rep.WriteText(e.stdout)
		}
		if werr != nil && err == nil {
			err = werr
		}
		if *jsonFile != "" {
			if werr := writeJSONFile(*jsonFile, rep); werr != nil && err == nil {
				err = werr
			}
		}
	}
	if errors.Is(err, bench.ErrChecksFailed) {
		return failf("a duplicate means an effect happened twice: report it with the output above",
			"invariant checks failed: %s", strings.Join(rep.Problems(), "; "))
	}
	if err != nil {
		return fmt.Errorf("%w", err)
	}
	return nil
}

func writeJSONFile(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
