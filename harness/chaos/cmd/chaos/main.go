package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pgclaim/pgclaim/harness/chaos"
	"github.com/pgclaim/pgclaim/pgtest"
)

func main() {
	chaos.MaybeWorker()

	var (
		cfg    chaos.Config
		faults string
	)
	flag.Int64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule (0: random, printed)")
	flag.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long faults are injected")
	flag.IntVar(&cfg.Instances, "instances", 4, "instance processes")
	flag.IntVar(&cfg.Bouncer, "bouncer", 0, "instances behind PgBouncer (default: half)")
	flag.StringVar(&faults, "faults", "all", "comma-separated faults: kill,terminate,restart,clock,pause,schedpause,bouncer; with --patroni switchover,failover,silent (and kill,terminate,clock,pause,schedpause); all (the mode's default); none")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 1500*time.Millisecond, "mean time between faults")
	flag.IntVar(&cfg.RowsPerSecond, "rate", 40, "new rows per second")
	flag.IntVar(&cfg.Schedules, "schedules", 50, "one-second schedules per group (advisory locks: direct instances; leases: every instance, when some are behind PgBouncer)")
	flag.StringVar(&cfg.Broken, "broken", "", "run a deliberately broken worker: nofence, noguard, noledger or noschedfence")
	flag.StringVar(&cfg.Dir, "logs", "", "directory for instance logs (default: temporary, kept on violations)")
	flag.BoolVar(&cfg.Patroni, "patroni", false, "run the database as a Patroni cluster (etcd + 2 PostgreSQL nodes on loopback; needs patroni and etcd-server); faults switchover,failover,silent")
	flag.BoolVar(&cfg.Sync, "sync", false, "with --patroni: synchronous_mode on (patronictl edit-config); default asynchronous")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "chaos: unexpected arguments %v\n", flag.Args())
		os.Exit(2)
	}
	fs, err := chaos.ParseFaults(faults)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if strings.TrimSpace(faults) != "all" {
		// "all" leaves the mode's default (Config.Faults nil).
		cfg.Faults = fs
		cfg.NoFaults = len(fs) == 0
	}
	cfg.Out = os.Stdout
	// The harness starts and restarts its own cluster.
	os.Unsetenv(pgtest.EnvURL)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	res.Print(os.Stdout)
	if res.Violations() > 0 {
		os.Exit(1)
	}
}
