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
	// The schedule's zone (Asia/Seoul) resolves on a machine without a
	// zone database too.
	_ "time/tzdata"
)

const usage = `pushresume: the field scenario of pgclaim, end to end.

A notification service runs on two servers, Active and Standby, with the same
code on the same database. Every day at 09:00 (Asia/Seoul) a job resumes
paused pushes; with a scheduler on both servers it used to fire twice, and
every paused push was sent twice. At start-up every server must also fail
requests a crashed server left PROCESSING for more than 24 hours, on both
servers, because after a crash the Standby is the one starting.

This demo provisions PostgreSQL (--database-url or DATABASE_URL if set, else
a container when Docker answers, else a throwaway cluster from the local
PostgreSQL binaries), seeds paused pushes plus a few requests stuck since
yesterday, and starts two instances as separate processes:

  1. Each instance migrates (pgclaim's tables and its own; the second of
     its migrations attaches pgclaim's notification trigger to push_requests
     for rows entering READY), runs the start-up sweep (claimed over 24h ago
     → FAILED), and starts a claim worker (package claim: READY →
     PROCESSING → SENT) and pgclaim's scheduler (package schedule). Both run
     the same worker and the same scheduler; neither is special. The
     workers listen for the trigger's announcements; their poll
     (--worker-poll) is only the safety net. Paused pushes are in no state a
     worker claims: nothing is sent before 09:00.
  2. The demo clock moves 09:00 two seconds ahead: each instance registers
     the schedule push-resume (daily at that time of day in Asia/Seoul, the
     same definition on both). At 09:00 both schedulers wake; the one that
     takes the schedule's lock records the instant in the ledger
     (pgclaim_schedule_runs, one row per instant) and runs attempt 1 with a
     fresh fence. The other does nothing for it.
  3. The run resumes the pushes paused before 09:00 in one statement
     (PAUSED → READY). Its commit carries the trigger's NOTIFY: both
     workers claim at once, in batches (READY → PROCESSING with a fencing
     token and a lease), and "send" each push: a row in sent_pushes written
     in the transaction that finishes the claim as SENT. The demo prints
     how soon after the resume's COMMIT each worker started its first push.
     The run then waits until none of those rows is READY or PROCESSING.
  4. Mid-run the demo kills the instance running it with SIGKILL (the
     Active or the Standby: the scheduler prefers neither; the story below
     calls it the runner). Its advisory lock goes with its session; its
     worker's claims stay PROCESSING until their lease runs out. The other
     worker keeps sending.
  5. The other instance's scheduler finds the lock free within its --poll
     and takes the run over as attempt 2, with a higher fence. Attempt 2
     finds nothing left PAUSED (attempt 1's resume committed), waits for the
     dead worker's leases to run out and sweeps those rows back to READY
     (FAILED once --max-attempts are used); the trigger announces them and
     the live worker sends them. Rows already sent stay SENT. The instant
     ends succeeded, once, at attempt 2.
  6. The killed server comes back (as in the field), runs its start-up sweep,
     registers the schedule (the ledger has the 09:00 run: nothing to catch
     up) and stands by. The demo stops everything and checks the database.

It ends with a table per instance (attempts run, rows resumed, rows claimed,
pushes sent, rows swept), the 09:00 instant's ledger row, and the overall
figures: pushes sent, duplicate sends (must be 0), rows left PROCESSING or
READY (must be 0), and the pickup (the resume's COMMIT sent → the first push
started, measured on this host's clock, not asserted). The exit status is 1
when any invariant failed.

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
	fs.IntVar(&cfg.KillAfter, "kill-after", 0, "SIGKILL the instance running the 09:00 run once this many sends have started, on both instances together (default 2/5 of --pushes)")
	fs.BoolVar(&cfg.NoKill, "no-kill", false, "let the 09:00 run finish: no failover")
	fs.BoolVar(&cfg.NoRestart, "no-restart", false, "do not bring the killed server back at the end")
	fs.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.StringVar(&cfg.Serve, "serve", "", "serve pgclaim's status page (read-only) on `HOST:PORT`, e.g. 127.0.0.1:8080, while the scenario runs and after it until interrupted")
	ic := &cfg.Instance
	fs.DurationVar(&ic.SendDelay, "send-delay", 20*time.Millisecond, "time one push takes to send")
	fs.IntVar(&ic.Batch, "batch", 10, "pushes claimed per statement")
	fs.DurationVar(&ic.Lease, "lease", 2*time.Second, "claim lease: how soon a dead instance's claims can be swept")
	fs.DurationVar(&ic.StaleAfter, "stale-after", 24*time.Hour, "the start-up rule: claimed longer ago than this → FAILED")
	fs.IntVar(&ic.MaxAttempts, "max-attempts", 3, "claims a push gets before a stale claim fails it")
	fs.DurationVar(&ic.SweepEvery, "sweep-every", 250*time.Millisecond, "how often the 09:00 run, waiting for its pushes to be sent, sweeps for a dead instance's claims")
	fs.DurationVar(&ic.Poll, "poll", time.Second, "the schedulers' poll: how soon a dead runner's instant is taken over")
	fs.DurationVar(&ic.WorkerPoll, "worker-poll", 10*time.Second, "the claim workers' poll, their safety net: they claim READY rows when the table's trigger announces them")
	fs.DurationVar(&ic.CatchUp, "catch-up", time.Hour, "the schedule's catch-up window for a missed 09:00")
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
