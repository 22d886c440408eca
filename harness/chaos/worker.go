package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
)

// Names shared by the worker and the checker.
const (
	electionDirect  = "chaos-leader/adv"   // advisory elector, direct instances
	electionBouncer = "chaos-leader/lease" // lease elector, instances behind PgBouncer
	// tickJob is the gate.Once job every instance fires each second of
	// its own clock (LedgerOnly behind PgBouncer).
	tickJob        = "chaos-tick"
	appNamePrefix  = "chaos-i" // application_name of instance connections
	harnessAppName = "chaos-harness"
)

// envWorker names the environment variable that turns a process started by
// the harness into an instance: it holds the instance's workerConfig as JSON.
const envWorker = "PGCLAIM_CHAOS_WORKER"

// Broken modes: each removes one guard, so that the checker can be shown to
// catch what the guard prevents.
const (
	// BrokenNoFence finishes claims without the fencing token and state
	// check: a zombie's finish lands on a row that was swept and claimed
	// again.
	BrokenNoFence = "nofence"
	// BrokenNoGuard sweeps without the state guard, as a rescuer that
	// overwrites rows finished meanwhile: finished rows are run again.
	BrokenNoGuard = "noguard"
	// BrokenNoLedger runs every schedule's every instant in every
	// instance, without the scheduler and its ledger, and every tick of
	// the gate.Once job without the gate.
	BrokenNoLedger = "noledger"
	// BrokenNoSchedFence writes the schedules' attempts and effects
	// without checking the run's fence, and its job ignores its context: a
	// runner stopped past its lease writes after its run was taken over,
	// or completes it.
	BrokenNoSchedFence = "noschedfence"
)

var brokenModes = []string{BrokenNoFence, BrokenNoGuard, BrokenNoLedger, BrokenNoSchedFence}

// workerConfig is one instance's configuration, passed by the harness.
type workerConfig struct {
	Name        string // instance name, e.g. "i2"
	Incarnation int    // how many times this instance was started before
	URL         string // connection string (direct, or through PgBouncer)
	Bouncer     bool   // behind PgBouncer: lease schedules, lease elector
	OffsetMS    int64  // initial clock offset
	Broken      string
	Acks        bool // report acknowledged commits (msgAckRows, msgAckRun)

	Period         time.Duration // the schedules' period
	Window         time.Duration // the schedules' catch-up window
	Schedules      int           // schedules per group
	SchedGroups    []string      // groups this instance runs (schedGroupAdv, schedGroupLease)
	SchedWork      time.Duration // longest a schedule's job works
	SchedLease     time.Duration // the schedules' Definition.Lease
	SchedPoll      time.Duration // schedule.Config.PollInterval
	SchedAttempts  int           // the schedules' RetryPolicy.MaxAttempts
	PollEvery      time.Duration // drain loop's wait when nothing is claimable
	BatchSize      int
	WorkPerRow     time.Duration
	RowLease       time.Duration // claim lease; the sweeper takes rows back after it
	SweepEvery     time.Duration
	MaxAttempts    int
	ElectorTTL     time.Duration
	HeartbeatEvery time.Duration // leader's fenced writes
	FailPermille   int           // rows whose work fails for good
	RetryPermille  int           // rows whose work fails once in a while
	Seed           int64
}

// holder is the identity of one incarnation of an instance, as recorded in
// the ledger, terms, claims and effects: "i2#3:pid".
func (c workerConfig) holder() string {
	return fmt.Sprintf("%s#%d:%d", c.Name, c.Incarnation, os.Getpid())
}

// Messages from an instance to the harness, one per line on stdout.
const (
	msgReady      = "READY"
	msgBatchStart = "B"
	msgBatchEnd   = "E"
	msgRunStart   = "S" // a schedule's job started
	msgRunEnd     = "s" // and ended
	// With workerConfig.Acks, commits the instance saw acknowledged:
	// "D holder id:fence ..." for rows finished DONE, "R holder schedule
	// instant-µs fence" for a schedule run's recorded success. The Patroni
	// mode compares them with what the database still has after failovers.
	msgAckRows = "D"
	msgAckRun  = "R"
)

// MaybeWorker runs this process as a chaos instance and exits, when the
// harness started it as one (see Run); otherwise it returns at once. Call
// it first thing in main, and in TestMain of tests that run the harness.
func MaybeWorker() {
	raw := os.Getenv(envWorker)
	if raw == "" {
		return
	}
	var cfg workerConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker: bad %s: %v\n", envWorker, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := runWorker(ctx, cfg, os.Stdin, os.Stdout, logger)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		logger.Error("chaos worker exits", "instance", cfg.Name, "error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// worker is one running instance.
type worker struct {
	cfg     workerConfig
	holder  string
	log     *slog.Logger
	pool    *pgxpool.Pool
	claimer *claim.Claimer[int64]
	offset  atomic.Int64
	events  chan schedEvent
	dropped atomic.Int64

	outMu sync.Mutex
	out   io.Writer
}

var rowsTable = claim.Table{
	Name:       "chaos_rows",
	Key:        "id",
	State:      "state",
	ClaimedAt:  "claimed_at",
	ClaimedBy:  "claimed_by",
	Fence:      "fence",
	LeaseUntil: "lease_until",
	Attempts:   "attempts",
	Reason:     "reason",
}

func (w *worker) say(msg string) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	_, _ = io.WriteString(w.out, msg+"\n")
}

// now is the instance's clock, offset by the injected skew. Everything the
// instance computes locally (which scheduled instant is due) uses it; every
// expiry is database time inside pgclaim.
func (w *worker) now() time.Time {
	return time.Now().Add(time.Duration(w.offset.Load()) * time.Millisecond)
}

func runWorker(ctx context.Context, cfg workerConfig, in io.Reader, out io.Writer, logger *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &worker{cfg: cfg, holder: cfg.holder(), log: logger.With("instance", cfg.Name), out: out, events: make(chan schedEvent, 4096)}
	w.offset.Store(cfg.OffsetMS)

	// Commands from the harness; its end (the harness died) ends the
	// instance.
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && f[0] == "offset" {
				if ms, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					w.offset.Store(ms)
				}
			}
		}
		cancel()
	}()

	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return err
	}
	// The claims, sweeps and elector need a few connections; the
	// schedules fire together and renew their leases every third of one,
	// so they get one per two schedules of a group (a session lock takes
	// its connection out of the pool besides).
	pcfg.MaxConns = int32(8 + len(cfg.SchedGroups)*cfg.Schedules/2)
	pcfg.HealthCheckPeriod = time.Second
	w.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer w.pool.Close()

	w.claimer, err = claim.New[int64](w.pool, rowsTable, claim.Config{
		From: "PAUSED", To: "PROCESSING", Holder: w.holder, Lease: cfg.RowLease, Logger: w.log,
	})
	if err != nil {
		return err
	}
	sweeper, err := claim.NewSweeper(w.claimer, claim.SweeperConfig[int64]{
		Failed: "FAILED", Retry: claim.RetryPolicy{State: "PAUSED", MaxAttempts: cfg.MaxAttempts}, BatchSize: 500,
		OnSwept: w.recordSwept,
	})
	if err != nil {
		return err
	}
	election := electionDirect
	if cfg.Bouncer {
		election = electionBouncer
	}
	mech := gate.Advisory
	if cfg.Bouncer {
		mech = gate.LeaseRow
	}
	elector, err := gate.NewElector(w.pool, election, gate.ElectorConfig{Holder: w.holder, Logger: w.log, Mechanism: mech, TTL: cfg.ElectorTTL})
	if err != nil {
		return err
	}

	ticks, err := gate.New(w.pool, gate.Config{Holder: w.holder, Logger: w.log, LedgerOnly: cfg.Bouncer})
	if err != nil {
		return err
	}
	defer ticks.Close()

	// Start-up sweep: rows a dead incarnation left PROCESSING go back (or
	// fail) before this one claims anything.
	for {
		_, err := w.sweep(ctx, sweeper)
		if err == nil {
			break
		}
		w.log.Warn("start-up sweep failed; retrying", "error", err)
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	var scheds []*schedule.Scheduler
	if cfg.Broken != BrokenNoLedger {
		if scheds, err = w.startSchedules(ctx); err != nil {
			return err
		}
	}
	w.say(msgReady)

	var wg sync.WaitGroup
	wg.Add(5)
	go func() { defer wg.Done(); w.tickLoop(ctx, ticks) }()
	go func() { defer wg.Done(); w.sweepLoop(ctx, sweeper) }()
	go func() { defer wg.Done(); w.drainLoop(ctx) }()
	go func() { defer wg.Done(); w.leadLoop(ctx, elector) }()
	go func() { defer wg.Done(); w.writeEvents(ctx) }()
	if cfg.Broken == BrokenNoLedger {
		wg.Add(1)
		go func() { defer wg.Done(); w.noLedgerLoop(ctx) }()
	}
	for _, s := range scheds {
		wg.Add(1)
		go func() { defer wg.Done(); w.runScheduler(ctx, s) }()
	}
	wg.Wait()
	return ctx.Err()
}

// tickLoop fires tickJob at every second of the instance's clock, each
// tick on a goroutine of its own as a cron library fires it. The job
// writes its effect; the checker counts them per fire time.
func (w *worker) tickLoop(ctx context.Context, g *gate.Gate) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		now := w.now()
		at := now.Truncate(time.Second).Add(time.Second)
		if !sleepCtx(ctx, at.Sub(now)) {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := func(ctx context.Context, run gate.Run) error {
				_, err := w.pool.Exec(ctx, `INSERT INTO chaos_tick_effects (fire_at, fence, instance) VALUES ($1, $2, $3)`,
					run.FireAt, run.Fence, w.cfg.Name)
				return err
			}
			var err error
			if w.cfg.Broken == BrokenNoLedger {
				err = job(ctx, gate.Run{Name: tickJob, FireAt: at}) // every instance runs every tick
			} else {
				err = g.Once(ctx, tickJob, at, job)
			}
			if err != nil && !errors.Is(err, gate.ErrSkipped) && ctx.Err() == nil {
				w.log.Warn("tick not run", "fire_at", at, "error", err)
			}
		}()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sweep moves stale rows once: pgclaim's sweeper, or the broken one.
func (w *worker) sweep(ctx context.Context, s *claim.Sweeper[int64]) (int, error) {
	if w.cfg.Broken == BrokenNoGuard {
		// A rescuer without the state guard: it takes any row whose lease
		// has passed, finished or not.
		rows, err := w.pool.Query(ctx, `UPDATE chaos_rows
			SET state = CASE WHEN attempts >= $1 THEN 'FAILED' ELSE 'PAUSED' END
			WHERE lease_until < now()
			RETURNING id, coalesce(fence, 0), state`, w.cfg.MaxAttempts)
		if err != nil {
			return 0, err
		}
		var swept []claim.Swept[int64]
		for rows.Next() {
			var sw claim.Swept[int64]
			if err := rows.Scan(&sw.Key, &sw.Fence, &sw.State); err != nil {
				rows.Close()
				return 0, err
			}
			swept = append(swept, sw)
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
		w.recordSwept(ctx, swept)
		return len(swept), nil
	}
	swept, err := s.Sweep(ctx)
	return len(swept), err
}

func (w *worker) sweepLoop(ctx context.Context, s *claim.Sweeper[int64]) {
	for sleepCtx(ctx, w.cfg.SweepEvery) {
		if _, err := w.sweep(ctx, s); err != nil && ctx.Err() == nil {
			w.log.Warn("sweep failed", "error", err)
		}
	}
}

// recordSwept notes swept rows for the report (best effort).
func (w *worker) recordSwept(ctx context.Context, swept []claim.Swept[int64]) {
	if len(swept) == 0 {
		return
	}
	ids := make([]int64, len(swept))
	fences := make([]int64, len(swept))
	states := make([]string, len(swept))
	for i, s := range swept {
		ids[i], fences[i], states[i] = s.Key, s.Fence, s.State
	}
	_, err := w.pool.Exec(ctx, `INSERT INTO chaos_sweeps (row_id, fence, state, instance)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], array_fill($4::text, array[cardinality($1::bigint[])]))`,
		ids, fences, states, w.holder)
	if err != nil && ctx.Err() == nil {
		w.log.Warn("record swept rows", "error", err)
	}
}

// leadLoop campaigns and, while leading, writes heartbeats fenced by the
// term: each is written only while the term is open in pgclaim_terms.
func (w *worker) leadLoop(ctx context.Context, e *gate.Elector) {
	for ctx.Err() == nil {
		err := e.Run(ctx, func(lctx context.Context, run gate.Run) error {
			t := time.NewTicker(w.cfg.HeartbeatEvery)
			defer t.Stop()
			for {
				select {
				case <-lctx.Done():
					return lctx.Err()
				case <-t.C:
				}
				_, err := w.pool.Exec(lctx, `INSERT INTO chaos_leader_log (election, term, instance, at)
					SELECT $1::text, $2::bigint, $3::text, now()
					WHERE EXISTS (
						SELECT 1 FROM pgclaim_terms
						WHERE election = $1::text AND term = $2::bigint AND holder = $3::text
						  AND ended_at IS NULL AND (lease_until IS NULL OR lease_until > now())
						FOR SHARE)`, e.Name(), run.Fence, w.holder)
				if err != nil && lctx.Err() == nil {
					w.log.Warn("leader heartbeat", "error", err)
				}
			}
		})
		if ctx.Err() == nil {
			w.log.Warn("elector stopped; campaigning again", "error", err)
			sleepCtx(ctx, 500*time.Millisecond)
		}
	}
}

// drainLoop claims batches of PAUSED rows and works them, polling when
// there is nothing to claim.
func (w *worker) drainLoop(ctx context.Context) {
	for ctx.Err() == nil {
		cls, err := w.claimer.ClaimBatch(ctx, w.cfg.BatchSize)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("claim batch", "error", err)
			}
			sleepCtx(ctx, w.cfg.PollEvery)
			continue
		}
		if len(cls) == 0 {
			sleepCtx(ctx, w.cfg.PollEvery)
			continue
		}
		w.say(msgBatchStart)
		err = w.work(ctx, cls)
		w.say(msgBatchEnd)
		if err != nil && ctx.Err() == nil {
			w.log.Warn("batch", "error", err)
		}
	}
}
