package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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

// once claims the tick (name, at) and runs fn. tol is the skew tolerance in
// microseconds, nil for none. The claim is one ClaimTick statement: through
// the pool for LedgerOnly; otherwise on a dedicated session, taking the
// job's advisory lock in the same statement, or after waiting for it
// (Config.LockWait, ClaimTickHeld).
func (g *Gate) once(ctx context.Context, name string, at time.Time, tol *int64, fn Func) error {
	lockcore.GrowStack() // see there: a cron library calls Once on a new goroutine
	ts := pgtype.Timestamptz{Time: at, Valid: true}
	p := store.ClaimTickParams{Job: name, FireAt: ts, LockMode: "none", ToleranceUs: tol, Holder: g.opts.Holder}
	if g.ledger {
		row, err := g.q.ClaimTick(ctx, p)
		if err != nil {
			if lost := g.claimLost(ctx, name, at, err); lost != nil {
				return lost
			}
			return fmt.Errorf("gate: %q: claim tick: %w", name, err)
		}
		run := Run{Name: name, FireAt: at, Holder: g.opts.Holder, Fence: row.Fence}
		g.opts.emit(ctx, Event{Kind: EventAcquired, Name: name, FireAt: at, Holder: run.Holder, Fence: run.Fence})
		return g.opts.runHeld(ctx, run, ledgerHold{g: g, run: run}, fn, true)
	}

	p.LockClass, p.LockKey = schemaKey(g.opts.Schema, name)
	free, ok := g.sessions.Reserve(ctx, p.LockClass, p.LockKey, g.wait)
	if !ok {
		// A run of this process holds the job's lock (or is taking it):
		// the server cannot tell, the session being the same.
		return g.heldSkip(ctx, name, at)
	}
	held := false
	defer func() {
		if !held {
			free()
		}
	}()
	s, err := g.sessions.Get(ctx)
	if err != nil {
		return err
	}
	p.LockMode = "try"
	sent := time.Now()
	var row store.ClaimTickRow
	if g.wait > 0 {
		var ok bool
		if row, ok, err = g.claimAfterWait(ctx, s, p, &sent); !ok {
			return err
		}
	} else {
		row, err = s.Q.ClaimTick(ctx, p)
		if err != nil {
			// A tick claimed already, a refused fire time and a lock
			// held elsewhere abort nothing on the session, which holds
			// no lock then.
			if lost := g.claimLost(ctx, name, at, err); lost != nil {
				g.sessions.Put(s)
				return lost
			}
			s.Close()
			return fmt.Errorf("gate: %q: claim tick: %w", name, err)
		}
	}
	// Only a claim that won the tick looks for a dead holder's tick
	// (ClaimTick reports stale only then).
	if row.Stale {
		if err := g.abandonStale(ctx, s, name, p.LockClass, p.LockKey, row.Fence); err != nil {
			return g.claimBroken(ctx, name, at, row.Fence, err)
		}
	}
	run := Run{Name: name, FireAt: at, Holder: g.opts.Holder, Fence: row.Fence}
	held = true
	return g.hold(ctx, s, sent, run, fn, tickRelease{g: g, class: p.LockClass, key: p.LockKey}, free)
}

// claimAfterWait waits for the job's lock on s (Config.LockWait), then
// claims the tick with ClaimTickHeld; but a tick claimed already is not
// waited for (its run may be what holds the lock). ok is false when the
// tick is not claimed, with what Once returns; s has then been kept or
// closed. sent is set to when the claim was sent.
func (g *Gate) claimAfterWait(ctx context.Context, s *lockcore.Session, p store.ClaimTickParams, sent *time.Time) (store.ClaimTickRow, bool, error) {
	name, at := p.Job, p.FireAt.Time
	h, err := s.Q.HeldTick(ctx, store.HeldTickParams{Job: name, FireAt: p.FireAt})
	if err != nil {
		s.Close()
		return store.ClaimTickRow{}, false, fmt.Errorf("gate: %q: look up tick: %w", name, err)
	}
	if h.Claimed {
		g.sessions.Put(s)
		return store.ClaimTickRow{}, false, g.skipped(ctx, name, at, errTaken)
	}
	_, locked, err := g.lock(ctx, s, name, p.LockClass, p.LockKey)
	if err != nil {
		return store.ClaimTickRow{}, false, err
	}
	if !locked {
		return store.ClaimTickRow{}, false, g.heldSkip(ctx, name, at)
	}
	*sent = time.Now()
	row, err := s.Q.ClaimTickHeld(ctx, store.ClaimTickHeldParams{
		LockMode: "held", Job: name, LockClass: p.LockClass, LockKey: p.LockKey,
		ToleranceUs: p.ToleranceUs, FireAt: p.FireAt, Holder: p.Holder,
	})
	if err != nil {
		s.Close()
		return store.ClaimTickRow{}, false, fmt.Errorf("gate: %q: claim tick: %w", name, err)
	}
	if row.Fence == 0 {
		if row.LeftLocked {
			s.Close() // not expected: the lock would be left held; drop the session
		} else {
			g.sessions.Put(s)
		}
		return store.ClaimTickRow{}, false, g.notClaimed(ctx, name, at, row)
	}
	return store.ClaimTickRow{Fence: row.Fence, Stale: row.Stale}, true, nil
}

// ClaimTick's refusals, each an error that aborted the statement and with
// it the tick's insert (pgclaim_raise, migration 00008): the insert won
// the tick while the job's lock was held elsewhere, or the fire time is out
// of tolerance (the message ends with database time, in microseconds since
// 1970).
const (
	refusedCode = "PGC01"
	skewedCode  = "PGC02"
)

// claimLost returns what Once returns for a ClaimTick that did not claim
// the tick, with err the statement's error: the tick was claimed already
// (no row), its fire time was refused, or the job's lock is held
// elsewhere. It returns nil for any other error.
func (g *Gate) claimLost(ctx context.Context, name string, at time.Time, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return g.skipped(ctx, name, at, errTaken)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return nil
	}
	switch pe.Code {
	case refusedCode:
		return g.heldSkip(ctx, name, at)
	case skewedCode:
		i := strings.LastIndexByte(pe.Message, ' ')
		us, perr := strconv.ParseInt(pe.Message[i+1:], 10, 64)
		if perr != nil {
			return nil
		}
		return g.skewed(ctx, name, at, time.UnixMicro(us))
	}
	return nil
}

// notClaimed reports a claim after a wait for the lock that did not get
// the tick: its fire time was refused, or the tick was claimed already.
// The claim released the lock.
func (g *Gate) notClaimed(ctx context.Context, name string, at time.Time, row store.ClaimTickHeldRow) error {
	switch {
	case !row.InTolerance:
		return g.skewed(ctx, name, at, row.DbNow.Time)
	case row.Taken:
		return g.skipped(ctx, name, at, errTaken)
	default:
		return g.heldSkip(ctx, name, at)
	}
}

// abandonStale marks abandoned the ticks of job still running (but the one
// with ownFence, this run's), which a claim found while holding the job's
// lock: their holders' sessions had ended. It reports each with
// EventAbandoned. On error s has been closed, and with it any lock it held.
func (g *Gate) abandonStale(ctx context.Context, s *lockcore.Session, job string, class, key int32, ownFence int64) error {
	r, err := s.Q.AbandonTicks(ctx, store.AbandonTicksParams{
		LockClass: class, LockKey: key, Job: job, OwnFence: ownFence,
		Error: "gate: abandoned: the holder's session ended before the run finished (found by " + g.opts.Holder + ")",
	})
	if err == nil && r.Locked && !r.Unlocked {
		err = errors.New("unlock not confirmed")
	}
	if err != nil {
		s.Close() // the lock count is unknown: drop the session
		return fmt.Errorf("gate: %q: mark abandoned ticks: %w", job, err)
	}
	for i := range min(len(r.FireAt), len(r.Holder), len(r.Fence)) {
		g.opts.emit(ctx, Event{
			Kind: EventAbandoned, Name: job, FireAt: r.FireAt[i].Time, Holder: g.opts.Holder, Fence: r.Fence[i],
			Outcome: OutcomeAbandoned,
			Err:     fmt.Errorf("run of %q by %s was abandoned: its session ended before the run finished", job, r.Holder[i]),
		})
	}
	return nil
}

// claimBroken handles a claim whose session failed (and was closed) after
// the tick was inserted with fence, 0 for none: the job cannot run without
// its lock, so its tick is recorded as not run, and err is returned.
func (g *Gate) claimBroken(ctx context.Context, name string, at time.Time, fence int64, err error) error {
	if fence == 0 {
		return err
	}
	out := Outcome(lockcore.Classify(ctx, err))
	rctx, cancel := releaseCtx(ctx)
	defer cancel()
	run := Run{Name: name, FireAt: at, Holder: g.opts.Holder, Fence: fence}
	if rerr := g.finishTick(rctx, run, out, fmt.Errorf("gate: job not run: %w", err)); rerr != nil {
		g.opts.Logger.ErrorContext(ctx, "gate: record tick outcome", "name", name, "fire_at", at, "outcome", string(out), "error", rerr)
	}
	return err
}

// errTaken is the ErrSkipped returned for a tick claimed already.
var errTaken = fmt.Errorf("%w: tick claimed already", ErrSkipped)

// skipped reports a skip and returns why, naming the tick.
func (g *Gate) skipped(ctx context.Context, name string, at time.Time, why error) error {
	g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, FireAt: at, Holder: g.opts.Holder, Err: why})
	return &skipError{why: why, name: name, at: at}
}

// skipError is what skipped returns: why, for the tick (name, at), or for
// name alone when at is zero. Every instance but one gets it for each tick,
// so its text is built only when it is read.
type skipError struct {
	why  error
	name string
	at   time.Time
}

func (e *skipError) Error() string {
	if e.at.IsZero() {
		return fmt.Sprintf("%v: %q", e.why, e.name)
	}
	return fmt.Sprintf("%v: %q at %s", e.why, e.name, e.at.Format(time.RFC3339Nano))
}

func (e *skipError) Unwrap() error { return e.why }

// errLockBusy is the ErrHeld of a tick skipped because another run of its
// job holds the job's lock.
var errLockBusy = fmt.Errorf("%w: the job's lock is held by another run; this tick is not run", ErrHeld)

// heldSkip reports a tick that Once skipped because the job's lock is held
// elsewhere, and returns a *HeldError. It looks at the ledger once more: a
// tick claimed meanwhile by an instance racing this one is a normal skip
// (errTaken); otherwise the tick is run nowhere, which is reported at warn
// level with the run holding the lock (the job's latest running tick), when
// the ledger shows one.
func (g *Gate) heldSkip(ctx context.Context, name string, at time.Time) error {
	ts := pgtype.Timestamptz{Time: at, Valid: true}
	// Another instance may be claiming the tick right now, which no
	// snapshot shows yet: one whose insert waited for this claim's and
	// went on when it was undone, or (after Config.LockWait) the lock's
	// holder itself, between taking the lock and committing its claim. The
	// probe waits for such a claim to end. Without it, instances firing
	// one tick together reported it held, "not run", while it ran.
	claimed, err := g.probe.ProbeTick(ctx, store.ProbeTickParams{Job: name, FireAt: ts})
	if err == nil && claimed {
		return g.skipped(ctx, name, at, errTaken)
	}
	h, herr := g.q.HeldTick(ctx, store.HeldTickParams{Job: name, FireAt: ts})
	if err == nil {
		err = herr
	}
	if err == nil && h.Claimed {
		return g.skipped(ctx, name, at, errTaken)
	}
	var why error
	held := &HeldError{Name: name, FireAt: at}
	switch {
	case err != nil:
		why = fmt.Errorf("%w (holder unknown: %v)", errLockBusy, err)
	case h.RunningFireAt.Valid:
		why = fmt.Errorf("%w: held by the run of %s by %s, running since %s", errLockBusy,
			h.RunningFireAt.Time.Format(time.RFC3339Nano), h.Holder, h.RunningSince.Time.Format(time.RFC3339Nano))
		held.Holder, held.HolderFireAt, held.Since = h.Holder, h.RunningFireAt.Time, h.RunningSince.Time
	default:
		why = fmt.Errorf("%w: held by a run not in the ledger (an Exclusive run of %q)", errLockBusy, name)
	}
	g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, FireAt: at, Holder: g.opts.Holder, Err: why, HeldBy: h.Holder})
	held.err = fmt.Errorf("%w: %q at %s", why, name, at.Format(time.RFC3339Nano))
	return held
}

// skewed returns the *SkewError for fireAt at, measured against dbNow.
func (g *Gate) skewed(ctx context.Context, name string, at, dbNow time.Time) error {
	err := &SkewError{Name: name, FireAt: at, DBNow: dbNow, Tolerance: g.tolerance,
		err: fmt.Errorf("%w: %q at %s is %s from database time %s (tolerance %s)",
			ErrClockSkew, name, at.Format(time.RFC3339Nano), at.Sub(dbNow), dbNow.Format(time.RFC3339Nano), g.tolerance)}
	g.opts.emit(ctx, Event{Kind: EventSkipped, Name: name, FireAt: at, Holder: g.opts.Holder, Err: err})
	return err
}

// ledgerHold is the hold of a LedgerOnly run: the tick's row, which no
// keeper can find lost; the release records the outcome through the pool.
type ledgerHold struct {
	g   *Gate
	run Run
}

func (ledgerHold) Context() context.Context { return neverLost }

func (h ledgerHold) Release(ctx context.Context, out lockcore.Outcome, jobErr error) (error, error) {
	if err := h.g.finishTick(ctx, h.run, Outcome(out), jobErr); err != nil {
		h.g.opts.Logger.ErrorContext(ctx, "gate: record tick outcome", "name", h.run.Name, "fire_at", h.run.FireAt, "outcome", string(out), "error", err)
	}
	return nil, nil
}

// finishTick records a run's outcome through the pool, retrying while ctx
// allows: after a server restart the pool's first connections are dead.
func (g *Gate) finishTick(ctx context.Context, run Run, out Outcome, jobErr error) error {
	p := store.FinishTickParams{
		Outcome: string(out), Error: errText(jobErr), Job: run.Name,
		FireAt: pgtype.Timestamptz{Time: run.FireAt, Valid: true}, Fence: run.Fence,
	}
	backoff := 50 * time.Millisecond
	for {
		_, err := g.q.FinishTick(ctx, p)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// errText is err's message for the ledger, nil for nil.
func errText(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

// tickRelease ends a ledger run held under the advisory lock.
type tickRelease struct {
	g          *Gate
	class, key int32
}

func (r tickRelease) release(ctx context.Context, s *lockcore.Session, run Run, out Outcome, jobErr error) (bool, error) {
	unlocked, err := s.Q.FinishTickUnlock(ctx, store.FinishTickUnlockParams{
		LockClass: r.class, LockKey: r.key, Outcome: string(out), Error: errText(jobErr),
		Job: run.Name, FireAt: pgtype.Timestamptz{Time: run.FireAt, Valid: true}, Fence: run.Fence,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// Not expected: the tick was not running under this fence, so
		// the statement finished nothing and unlocked nothing.
		r.g.opts.Logger.ErrorContext(ctx, "gate: tick was not running at finish", "name", run.Name, "fire_at", run.FireAt, "fence", run.Fence)
		unlocked, err = s.Q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: r.class, LockKey: r.key})
	}
	if err != nil {
		return false, err
	}
	return unlocked, nil
}

func (r tickRelease) record(ctx context.Context, run Run, out Outcome, jobErr error) error {
	return r.g.finishTick(ctx, run, out, jobErr)
}
