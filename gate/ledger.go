package gate

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/store"
)

// DefaultSkewTolerance is the SkewTolerance used when Config leaves it zero.
// A cron library fires a tick when the instance clock reaches it, so the
// distance to database time is the instance's clock error plus its firing
// delay: normally well under a second. A minute leaves room for a busy
// process while still catching a clock (or time zone) that is plainly wrong.
const DefaultSkewTolerance = time.Minute

// Schedule yields the scheduled instants of a job: Next returns the first
// instant strictly after t, or the zero time when there is none. robfig/cron
// v3's cron.Schedule satisfies it.
type Schedule interface {
	Next(t time.Time) time.Time
}

// Config configures a Gate. The zero value is ready to use.
type Config struct {
	// Holder identifies this instance in the ledger, in lock rows and in logs. Default:
	// "hostname:pid".
	Holder string

	// Logger receives acquired / skipped / lost / finished (acquired and skipped at debug
	// level, finished and released at info; a lost lock, a tick skipped
	// because its job's lock is held, an outcome that could not be recorded
	// at warn or error) records, each with the caller's context
	// where there is one. Default (nil): slog.Default(), so warnings and
	// errors reach the process's logger; set a logger with
	// slog.DiscardHandler to silence it.
	Logger *slog.Logger

	// Hooks observes the same events for metrics and tracing. Default:
	// no-op.
	Hooks Hooks

	// SkewTolerance bounds how far a fireAt given to Once may be from
	// database time; further away, Once refuses with ErrClockSkew. Zero
	// means DefaultSkewTolerance; negative is an error.
	SkewTolerance time.Duration

	// LockWait is how long Once and Exclusive wait for an advisory lock
	// held by another session before skipping with ErrHeld. Zero: do not
	// wait. Negative is an error. With a wait, Once looks the tick up,
	// waits for the lock unless the tick was claimed already, then claims
	// it (two more round trips), checking skew after the wait.
	LockWait time.Duration

	// LedgerOnly makes Once record ticks without taking the advisory lock.
	// Use it where session locks cannot live (a transaction-pooling
	// PgBouncer), and pair it with a Lease when runs of one job must not
	// overlap. Exclusive always takes the advisory lock.
	//
	// Without the lock nothing tells a dead run from a live one, so a tick
	// whose holder died mid-run stays marked running: ledger-only gates do
	// not mark ticks abandoned, and Prune keeps running ticks. Operators see
	// them (pgclaim ticks) and may delete or update them once they know the
	// holder is gone. All instances of a job must use the same mode: a Once
	// that takes the lock marks every running tick of the job abandoned,
	// including a live ledger-only run's.
	LedgerOnly bool
	// Retention is how long finished ticks are kept, by database time: a
	// Gate deletes older ones itself (started from Once at most every 10
	// minutes, the first 10 minutes after New; 1,000 ticks per statement,
	// each bounded to 5 s). Running ticks are kept. Default (0):
	// DefaultRetention, 7 days. KeepTicks keeps every tick. At least an
	// hour and more than SkewTolerance; CatchUp refuses a window as long.
	// Give every instance the same.
	Retention time.Duration
	// Schema is the schema pgclaim's objects live in (pgclaim.WithSchema):
	// every statement names it, so nothing depends on search_path, and the
	// jobs' advisory keys are the schema's: gates of installations in
	// other schemas of the database never see these ticks or locks.
	// Default: "", the objects found through search_path.
	Schema string
}

func (c Config) instance() instance {
	return instance{Holder: c.Holder, Logger: c.Logger, Hooks: c.Hooks, Schema: c.Schema}
}

// Gate runs jobs at most once per scheduled instant (the tick ledger in
// pgclaim_ticks) and never concurrently with another run of the same job
// (a session advisory lock held while the job runs). It is safe for
// concurrent use. Every instance builds its own Gate on the shared database.
type Gate struct {
	pool      *pgxpool.Pool
	q         *store.Queries
	probe     *store.Queries // statements rolled back (rolledBack)
	opts      instance
	tolerance time.Duration
	wait      time.Duration
	ledger    bool // LedgerOnly
	sessions  *lockcore.Ref
	// catchUp is the longest window given to CatchUp so far (ns); Prune
	// refuses ages within it.
	catchUp atomic.Int64
	schema  *qualify.Schema
	// retention (Config.Retention; negative: keep), the next pass (unix
	// ns) and the pass running (retention.go).
	retention   time.Duration
	retainBatch int32
	nextRetain  atomic.Int64
	retaining   sync.Mutex
}

// New returns a Gate using pool, which must reach a database migrated with
// pgclaim.Migrate: New checks that with one query (bounded by 10 s), and
// refuses a database without pgclaim's tables with an error wrapping
// ErrInvalid that names them and the fix (a database it cannot reach then
// is a warning in the log, not an error: the service may start while the
// server restarts; NewLease and NewElector do the same). The advisory locks
// are held on one connection taken out of pool (see DedicatedSessions), kept
// until Close.
func New(pool *pgxpool.Pool, cfg Config) (*Gate, error) {
	if pool == nil {
		return nil, invalid("pool", "must not be nil")
	}
	if cfg.SkewTolerance < 0 {
		return nil, invalid("Config.SkewTolerance", "must not be negative")
	}
	if cfg.LockWait < 0 {
		return nil, invalid("Config.LockWait", "must not be negative")
	}
	tol := cfg.SkewTolerance
	if tol == 0 {
		tol = DefaultSkewTolerance
	}
	if err := checkSchemaName("Config", cfg.Schema); err != nil {
		return nil, err
	}
	if err := checkRetention(cfg.Retention, tol); err != nil {
		return nil, err
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	schema := qualify.New(cfg.Schema)
	q := store.New(schema.Wrap(lockcore.ReadCommitted{Pool: pool}))
	opts := cfg.instance().withDefaults()
	if err := checkSchema(opts.Logger, q, schema.Object("pgclaim_ticks"), schema.Object("pgclaim_fence_seq"),
		schema.Object("pgclaim_fence()"), schema.Object("pgclaim_raise(text,text)")); err != nil {
		return nil, err
	}
	g := &Gate{
		pool:        pool,
		q:           q,
		probe:       store.New(schema.Wrap(lockcore.RolledBack{Pool: pool})),
		opts:        opts,
		tolerance:   tol,
		wait:        cfg.LockWait,
		ledger:      cfg.LedgerOnly,
		sessions:    lockcore.Share(pool, schema),
		schema:      schema,
		retention:   cfg.Retention,
		retainBatch: retainBatch,
	}
	g.nextRetain.Store(time.Now().Add(jittered(retainEvery)).UnixNano())
	return g, nil
}

// Holder returns the identity this gate records runs under.
func (g *Gate) Holder() string { return g.opts.Holder }

// SkewTolerance returns how far from database time a fireAt given to Once
// may be: Config.SkewTolerance, or DefaultSkewTolerance when that was zero.
// The cronx adapters default their MaxDelay to it, since a run that starts
// later than that after its instant would be refused anyway.
func (g *Gate) SkewTolerance() time.Duration { return g.tolerance }

// DedicatedSessions is how many connections a Gate holds besides its pool:
// the one session its advisory locks are held on, whatever the number of
// jobs — one per pool in a process, shared by every Gate and
// schedule.Scheduler on that pool. With Config.LedgerOnly it holds none.
const DedicatedSessions = 1

// Close closes the session its locks are held on. Runs in progress finish
// normally; calls after Close return ErrClosed. The pool is not closed.
func (g *Gate) Close() {
	g.sessions.Close()
}

// Once runs fn for the tick (name, fireAt) unless some instance has claimed
// that tick already, and returns fn's error. Every instance computes the
// same fireAt from the shared schedule, so one INSERT … ON CONFLICT DO
// NOTHING into pgclaim_ticks decides which one runs it, whatever the clock
// skew between them. fireAt is truncated to microseconds, Postgres's
// precision.
//
// In the same statement, once its insert has won the tick, Once takes the
// job's advisory lock, so a run never overlaps another run of the same job
// (a slow previous tick, a manual Exclusive run); the lock is held on a
// dedicated connection that is watched while fn runs. See Exclusive for
// what happens when it is lost. When the lock is held elsewhere the
// statement undoes its insert by raising an error (SQLSTATE PGC01, "the
// job's lock is held by another run"), so the server's log shows an ERROR
// line for each tick skipped that way; Once returns a *HeldError. A fire
// time refused for clock skew (below) is refused the same way, with
// SQLSTATE PGC02 and an ERROR line.
//
// Holding the lock, the claim also marks the job's ticks still running as
// abandoned: they were left by holders whose session ended before their run
// finished (see "Abandoned ticks" in the package documentation), and each is
// reported with EventAbandoned.
//
// Once returns an error wrapping ErrSkipped when the tick was claimed
// already, ErrHeld when another run of the job holds the lock (the tick is
// then not recorded; the error is a *HeldError naming the holder), ErrClockSkew
// when fireAt is further than Config.SkewTolerance from database time (a
// *SkewError carrying the database time), and ErrLockLost when the lock was
// lost while fn ran. The ledger row records holder, fence, start, finish and
// the outcome (succeeded, failed with the error text, lost, or abandoned
// when ctx ended first or fn panicked).
func (g *Gate) Once(ctx context.Context, name string, fireAt time.Time, fn Func) error {
	if err := checkName("name", name); err != nil {
		return err
	}
	if fireAt.IsZero() {
		return invalid("fireAt", "must not be zero")
	}
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	g.maybeRetain()
	tol := g.tolerance.Microseconds()
	return explain(ctx, g.pool, g.schema, g.once(ctx, name, fireAt.Truncate(time.Microsecond), &tol, fn))
}

// CatchUp runs the tick that was missed while no instance was up: it takes
// the latest instant of sched within the window before database time and,
// unless some instance has claimed that tick already, runs fn for it through
// the ledger exactly as Once would (without the skew check, since the
// instant is old on purpose). Earlier missed instants are not run: the
// latest one stands for them (Kubernetes CronJob's policy with
// startingDeadlineSeconds). Call it at start-up; several instances may call
// it at once.
//
// CatchUp returns an error wrapping ErrSkipped when there is no instant in
// the window or its tick was claimed already, and otherwise what Once
// returns. Keep ledger retention (Prune) longer than window, or pruned ticks
// look missed; the Gate's Prune refuses an age within the longest window
// given to its CatchUp.
func (g *Gate) CatchUp(ctx context.Context, name string, sched Schedule, window time.Duration, fn Func) error {
	if err := checkName("name", name); err != nil {
		return err
	}
	if sched == nil {
		return invalid("sched", "must not be nil")
	}
	if window <= 0 {
		return invalid("window", "must be positive")
	}
	if g.retention > 0 && window >= g.retention {
		return invalid("window", fmt.Sprintf("%s is not shorter than Config.Retention (%s): CatchUp could take a deleted tick for a missed one; raise Config.Retention (or gate.KeepTicks)", window, g.retention))
	}
	if fn == nil {
		return invalid("fn", "must not be nil")
	}
	for w := g.catchUp.Load(); int64(window) > w && !g.catchUp.CompareAndSwap(w, int64(window)); w = g.catchUp.Load() {
	}
	now, err := g.q.DBNow(ctx)
	if err != nil {
		return fmt.Errorf("gate: catch-up %q: read database time: %w", name, err)
	}
	at, err := latest(sched, now.Time.Add(-window), now.Time)
	if err != nil {
		return fmt.Errorf("gate: catch-up %q: %w", name, err)
	}
	if at.IsZero() {
		g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, Holder: g.opts.Holder})
		return fmt.Errorf("%w: catch-up %q: no scheduled instant in the last %s", ErrSkipped, name, window)
	}
	return g.once(ctx, name, at.Truncate(time.Microsecond), nil, fn)
}

// maxCatchUpSteps bounds the walk over a schedule in CatchUp.
const maxCatchUpSteps = 10_000_000

// latest returns the last instant of sched in (from, to], or the zero time.
func latest(sched Schedule, from, to time.Time) (time.Time, error) {
	var last time.Time
	t := from
	for i := 0; ; i++ {
		if i == maxCatchUpSteps {
			return time.Time{}, fmt.Errorf("schedule has more than %d instants in the window", maxCatchUpSteps)
		}
		next := sched.Next(t)
		if next.IsZero() || next.After(to) {
			return last, nil
		}
		if !next.After(t) {
			return time.Time{}, fmt.Errorf("schedule does not advance: Next(%s) = %s", t, next)
		}
		last, t = next, next
	}
}

// Prune deletes finished ticks whose instant and start are both older than
// olderThan (by database time) and returns how many it deleted. Ticks still
// marked running are kept.
//
// olderThan must exceed the gate's SkewTolerance: an instance firing late,
// within the tolerance, would otherwise claim a pruned tick again and run
// it twice. It must also exceed every catch-up window, or CatchUp would take
// pruned ticks for missed ones: Prune refuses an age within the longest
// window given to this Gate's CatchUp so far. Give every instance's Prune an
// age past the longest window any instance uses (the CatchUp calls of other
// instances are not known here). A refused age is an error wrapping
// ErrInvalid that names the setting it falls within.
func (g *Gate) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, invalid("olderThan", "must be positive")
	}
	if olderThan <= g.tolerance {
		return 0, invalid("olderThan", fmt.Sprintf("%v does not exceed Config.SkewTolerance (%v): an instance firing late could claim a pruned tick again", olderThan, g.tolerance))
	}
	if w := time.Duration(g.catchUp.Load()); olderThan <= w {
		return 0, invalid("olderThan", fmt.Sprintf("%v does not exceed the CatchUp window (%v) given to this gate: CatchUp would run a pruned tick again", olderThan, w))
	}
	n, err := g.q.PruneTicks(ctx, olderThan.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("gate: prune ticks: %w", err)
	}
	return n, nil
}
