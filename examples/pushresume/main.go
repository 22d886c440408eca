// Command pushresume is pgclaim's field scenario end to end: a push service
// running as Active and Standby on one PostgreSQL database, whose 09:00 job
// resumes paused pushes, and whose every instance cleans up requests left
// PROCESSING by a crashed server when it starts.
//
// Run the demo (it provisions Postgres itself):
//
//	go run ./examples/pushresume
//
// See --help for the scenario and the flags. The hidden "instance"
// subcommand is one server of the service; the demo starts two of them as
// separate processes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const usage = `pushresume: the field scenario of pgclaim, end to end.

A notification service runs on two servers, Active and Standby, with the same
code on the same database. Every day at 09:00 a job resumes paused pushes;
with a scheduler on both servers it used to fire twice, and every paused push
was sent twice. At start-up every server must also fail requests a crashed
server left PROCESSING for more than 24 hours, on both servers, because after
a crash the Standby is the one starting.

This demo provisions PostgreSQL (--database-url or DATABASE_URL if set, else
a container when Docker answers, else a throwaway cluster from the local
PostgreSQL binaries), seeds paused pushes plus a few requests stuck since
yesterday, and starts two instances as separate processes:

  1. Each instance migrates (pgclaim's tables and its own), runs the start-up
     sweep (stuck for over 24h → FAILED), and stands in the leader election.
     The first one up is elected: the Active.
  2. The demo clock sets 09:00 one second ahead; both schedulers fire the
     same tick (job push-resume, that instant). The tick ledger lets one run;
     the other skips. (A standby lets the Active go first by --standby-delay,
     so the Active normally runs it; were the Active down, the standby would.)
  3. The run claims paused pushes in batches (PAUSED → PROCESSING with a
     fencing token and a lease) and "sends" each one: a row in sent_pushes
     written in the transaction that finishes the claim as SENT.
  4. Mid-run the demo kills the Active with SIGKILL. Its advisory locks go
     with its session; its claims stay PROCESSING until their lease runs out.
  5. The Standby's elector takes over (after --ttl, as a killed leader cannot
     hand over). As the new Active it finishes the cut-short run: due pushes
     still PAUSED while no run holds the job's lock are resumed under that
     lock, and its sweeps move the dead Active's expired claims back to
     PAUSED for another attempt (FAILED once --max-attempts are used), to be
     resumed in turn. The 09:00 tick stays in the ledger once, under the
     instance that started it.
  6. The killed server comes back (as in the field), runs its start-up sweep
     and catch-up (the 09:00 tick is in the ledger: nothing to catch up), and
     stands by. The demo stops everything and checks the database.

It ends with a table per instance (ticks run/skipped, rows resumed, pushes
sent, rows swept) and the overall figures: pushes sent, duplicate sends (must
be 0), rows left PROCESSING (must be 0). The exit status is 1 when any
invariant failed.

Usage:
  go run ./examples/pushresume [flags]

Flags:
`

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// mainArgs runs the demo, or an instance when args start with "instance".
func mainArgs(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "instance" {
		return runInstance(args[1:], stdin, stdout, stderr)
	}
	fs := flag.NewFlagSet("pushresume", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := demoConfig{Out: stdout, Stderr: stderr}
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "an existing database to run in (default: $DATABASE_URL; when neither is set, Postgres is provisioned); its push_requests and sent_pushes are emptied first")
	fs.IntVar(&cfg.Pushes, "pushes", 200, "paused pushes to seed")
	fs.IntVar(&cfg.Stuck, "stuck", 3, "requests a crashed server left PROCESSING since yesterday")
	fs.IntVar(&cfg.KillAfter, "kill-after", 0, "SIGKILL the Active once it has started this many sends (default 2/5 of --pushes)")
	fs.BoolVar(&cfg.NoKill, "no-kill", false, "let the Active finish: no failover")
	fs.BoolVar(&cfg.NoRestart, "no-restart", false, "do not bring the killed server back at the end")
	fs.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "give up after this long")
	ic := &cfg.Instance
	fs.DurationVar(&ic.SendDelay, "send-delay", 20*time.Millisecond, "time one push takes to send")
	fs.IntVar(&ic.Batch, "batch", 10, "pushes claimed per statement")
	fs.DurationVar(&ic.Lease, "lease", 2*time.Second, "claim lease: how soon a dead instance's claims can be swept")
	fs.DurationVar(&ic.TTL, "ttl", time.Second, "elector TTL: how soon a standby leads after the leader dies")
	fs.DurationVar(&ic.StaleAfter, "stale-after", 24*time.Hour, "the start-up rule: PROCESSING longer than this → FAILED")
	fs.IntVar(&ic.MaxAttempts, "max-attempts", 3, "claims a push gets before a stale claim fails it")
	fs.DurationVar(&ic.SweepEvery, "sweep-every", 250*time.Millisecond, "how often the Active sweeps and looks for a cut-short run")
	fs.DurationVar(&ic.StandbyDelay, "standby-delay", 300*time.Millisecond, "how long a standby lets the Active take a tick first")
	fs.DurationVar(&ic.CatchUp, "catch-up", time.Hour, "start-up catch-up window for a missed tick")
	fs.BoolVar(&ic.Verbose, "v", false, "the instances log pgclaim's records to standard error")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pushresume: unexpected argument %q (see --help)\n", fs.Arg(0))
		return 2
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = os.Getenv("DATABASE_URL")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := runDemo(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "pushresume:", err)
		return 1
	}
	if !res.OK {
		return 1
	}
	return 0
}
