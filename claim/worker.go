package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// ErrPanic is matched by the error recorded for work that panicked.
var ErrPanic = errors.New("claim: work panicked")

// callWork runs f, turning a panic into an error matching ErrPanic.
func callWork(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, r, debug.Stack())
		}
	}()
	return f()
}

// cleanupTimeout bounds the statements that give a claim back or record its
// failure after the work's context has ended.
const cleanupTimeout = 10 * time.Second

// validity is how long a claim, or a heartbeat that extended it, keeps its
// work going, counted from when the statement was sent: three quarters of
// the lease, a quarter short of the moment the row's lease can run out in
// the database and another worker claim it.
func validity(lease time.Duration) time.Duration { return lease - lease/4 }

// WorkerConfig configures a Worker.
type WorkerConfig[K any] struct {
	// Work does the work for one claim. It runs inside tx, the transaction
	// that then finishes the claim: effects written through tx commit
	// together with the move to Done, and roll back if the claim was lost
	// meanwhile — exactly once for effects that live in the database.
	// Returning an error (or panicking) rolls tx back and records a
	// failure. ctx is cancelled when a heartbeat finds the claim lost, and
	// after StopTimeout once the worker is stopping. Required.
	Work func(ctx context.Context, tx pgx.Tx, c Claim[K]) error
	// Done is the state of a row whose work succeeded. Required.
	Done string
	// Failed is the state of a row whose work failed and has no attempts
	// left. Required. With Table.Reason, the work's error text (at most
	// 2,000 bytes) is recorded with the move to Failed or Retry.State.
	Failed string
	// Retry, when its State is set, sends a row whose work failed while
	// Table.Attempts is below Retry.MaxAttempts to Retry.State (typically
	// Config.From, so the row is claimed again), not to Failed; with
	// Retry.Backoff the row waits before it may be claimed again, the wait
	// computed from the claim's Attempts. The zero value: every failure
	// is final.
	Retry RetryPolicy
	// BatchSize is the most rows claimed by one statement. Required.
	BatchSize int
	// Args bind the placeholders of the claimer's Config.Where.
	Args []any
	// SkipVerify keeps NewWorker from checking the table and the states
	// against the database. By default NewWorker runs Worker.Verify and
	// returns what it finds wrong (an error matching ErrInvalid: build it
	// after the migrations that create the table); a missing partial
	// index (ErrMissingIndex), or a database it cannot ask within 10
	// seconds, is logged at warn level and does not fail it.
	SkipVerify bool
	// Concurrency is the most claims worked on at once (0 means 1). Each
	// needs a connection for its transaction; size the pool for
	// Concurrency plus two (claims and heartbeats).
	Concurrency int
	// PollInterval is how long the worker waits after finding nothing to
	// claim, unless it is woken earlier (default 1s). On a *pgxpool.Pool
	// the worker listens for announcements of claimable rows (the trigger
	// pgclaim_notify_on attaches to the table, or Notify) and claims the
	// moment one arrives; the poll is the safety net that finds rows whose
	// announcement was lost, or written without one. It also wakes when a
	// row it sent back with a Retry.Backoff becomes claimable. While the
	// worker listens (Run), its poll is shared with the other workers of
	// the process claiming the same rows (same pool, claimer statement and
	// Args): PollInterval after the latest claim of any of them.
	PollInterval time.Duration
	// Recover, when set, is the sweeper that gives back the rows of holders
	// that died (a Sweeper built on the same claimer, typically with a
	// Retry whose State is Config.From): the worker sweeps with it when it
	// starts and then every RecoverEvery, and claims at once what it
	// returned to From. Drain then also waits, sweeping, for the rows other
	// holders have in Config.To (within Config.Where), so that it returns
	// once every row is finished or failed — not while a dead instance's
	// rows wait for their lease to run out. With a claimer Lease, a row a
	// killed holder left is worked again within Lease + RecoverEvery.
	// Default nil: no sweeping (run a Sweeper of your own).
	Recover *Sweeper[K]
	// RecoverEvery is how often the worker sweeps with Recover (default:
	// the claimer's Lease, or one minute without one).
	RecoverEvery time.Duration
	// PollOnly keeps the worker from listening: it finds rows by its poll
	// alone. Listening costs no connection of its own (one per pool and
	// process, shared with every Worker and Scheduler on the pool); behind
	// a connection pooler in transaction mode, where LISTEN cannot work,
	// the worker polls anyway and says so once. Default false.
	PollOnly bool
	// StopTimeout is how long in-flight work may continue after the
	// worker's context is cancelled before its own context is cancelled
	// (0: wait for it to finish). Work ended by that cancellation is
	// released, not failed.
	StopTimeout time.Duration
}

// Worker drains rows in the claimer's From state: it claims batches, runs
// the work for each claim in its own transaction with bounded concurrency,
// extends leases while work runs (when the claimer has a Lease), and
// finishes each claim as Done, Retry.State or Failed. A Worker may be run more
// than once, but each run is independent.
//
// Deadlines. With a Lease, a claim counts as held for three quarters of the
// lease after the statement that claimed or last extended it was sent; a
// heartbeat runs every Lease/3 (Lease/12 after a failed one) and each is
// bounded by that validity. When a claim's validity runs out (the database
// stopped answering: a silent network, a failover), its work's context is
// cancelled, and with it the in-transaction finish and commit; the claim
// is counted lost and no further statement is sent for it. So a worker cut
// off from the database stops processing a row at least Lease/4 before the
// row's lease lets another worker claim it (docs/RELIABILITY.md, "Silent
// network"). Claim statements are bounded by the lease; the statements
// that give a claim back or record a failure, after the work, by 10
// seconds. Choose a Lease well above a heartbeat's round trip under load:
// a claim whose heartbeat takes longer than three quarters of the lease is
// given up. Without a Lease nothing bounds the work or its finish: rows
// are recovered by a Sweeper's StaleAfter, which the worker does not know.
type Worker[K any] struct {
	c     *Claimer[K]
	begin func(context.Context) (pgx.Tx, error)
	cfg   WorkerConfig[K]
}

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// NewWorker returns a worker for c's rows. c must run on a pool (or another
// DBTX with a Begin method) and its table must have a Fence column. It
// validates cfg and returns an error naming the first bad field; then,
// unless cfg.SkipVerify is set, it checks the table and every state against
// the database (Worker.Verify), so that a state the column rejects fails
// here rather than on every claim.
//
// The worker begins every work transaction READ COMMITTED (on a DBTX with a
// BeginTx method, such as *pgxpool.Pool), whatever default_transaction_isolation
// the database, role or pool sets: the heartbeat extends the leases of rows
// whose work is under way, and only at read committed can the work's
// transaction then finish them. Its other statements behave as described at
// Claimer.WithTx.
func NewWorker[K any](c *Claimer[K], cfg WorkerConfig[K]) (*Worker[K], error) {
	if c == nil {
		return nil, invalid("NewWorker: claimer", "must not be nil")
	}
	b, ok := c.db.(beginner)
	if !ok {
		return nil, invalid("NewWorker: claimer", "must run on a DBTX with a Begin method, such as *pgxpool.Pool")
	}
	t := c.c.t
	if err := t.needs("Table.Fence", t.fence, "Worker"); err != nil {
		return nil, err
	}
	state := func(field, s string) error {
		switch {
		case s == "":
			return invalid(field, "must not be empty")
		case s == c.c.to:
			return invalid(field, fmt.Sprintf("must differ from Config.To (%q)", s))
		}
		return nil
	}
	for _, e := range []error{
		state("WorkerConfig.Done", cfg.Done),
		state("WorkerConfig.Failed", cfg.Failed),
		cfg.Retry.check("WorkerConfig.Retry", c.c),
	} {
		if e != nil {
			return nil, e
		}
	}
	switch {
	case cfg.Work == nil:
		return nil, invalid("WorkerConfig.Work", "must not be nil")
	case cfg.BatchSize <= 0:
		return nil, invalid("WorkerConfig.BatchSize", "must be positive")
	case cfg.Concurrency < 0:
		return nil, invalid("WorkerConfig.Concurrency", "must not be negative")
	case cfg.PollInterval < 0:
		return nil, invalid("WorkerConfig.PollInterval", "must not be negative")
	case cfg.StopTimeout < 0:
		return nil, invalid("WorkerConfig.StopTimeout", "must not be negative")
	case cfg.RecoverEvery < 0:
		return nil, invalid("WorkerConfig.RecoverEvery", "must not be negative")
	case cfg.RecoverEvery > 0 && cfg.Recover == nil:
		return nil, invalid("WorkerConfig.Recover", "must be set when WorkerConfig.RecoverEvery is")
	case cfg.Recover != nil && cfg.Recover.c.c != c.c:
		return nil, invalid("WorkerConfig.Recover", "must be a Sweeper built on the worker's claimer")
	case len(cfg.Args) != c.c.whereParams:
		return nil, invalid("WorkerConfig.Args", fmt.Sprintf("Config.Where uses %d parameters, got %d", c.c.whereParams, len(cfg.Args)))
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Recover != nil && cfg.RecoverEvery == 0 {
		cfg.RecoverEvery = time.Minute
		if c.c.lease > 0 && c.c.t.leaseUntil != "" {
			cfg.RecoverEvery = c.c.lease
		}
	}
	w := &Worker[K]{c: c, begin: b.Begin, cfg: cfg}
	if tb, ok := c.db.(txBeginner); ok {
		w.begin = func(ctx context.Context) (pgx.Tx, error) { return tb.BeginTx(ctx, readCommitted) }
	}
	if !cfg.SkipVerify {
		if err := verifyOnNew("NewWorker", c.c, w.Verify); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Run works on claims until ctx is cancelled, polling every PollInterval
// when there is nothing to claim. On cancellation it stops claiming,
// releases claims whose work has not started, lets in-flight work finish
// (see StopTimeout), and returns nil: a clean shutdown leaves no row of
// its own in To. It returns the counts of this run.
//
// A failure that retrying cannot cure ends the run the same way, and Run
// returns an error matching ErrInvalid that names the state or the option
// at fault and wraps the server's error: a claim statement the table
// refuses (a column Config.Where, Order or the Table names that does not
// exist, a From or To state the column's enum or CHECK constraint
// rejects), or a finish to Done, Failed or Retry.State that the table refuses. A
// claim whose work succeeded but whose move to Done was refused is not
// counted as succeeded: its transaction rolls back and the row is moved to
// Failed (not Retry.State: the same finish would be refused again). Other
// failures of a claim statement (a lost connection, a timeout) are logged
// and retried after PollInterval.
func (w *Worker[K]) Run(ctx context.Context) (Stats, error) {
	return w.run(ctx, false)
}

// Drain works on claims until nothing is left to claim and no work is in
// flight (rows moved to a Retry.State equal to From are claimed again), then
// returns. Cancelling ctx stops it like Run, and Drain then returns
// ctx.Err(); a failure that cannot go away ends it with an error as it
// ends Run. It suits a scheduled job: "at 09:00, resume every paused row".
func (w *Worker[K]) Drain(ctx context.Context) (Stats, error) {
	st, err := w.run(ctx, true)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return st, err
}

// entry is one claim held by a run.
type entry[K any] struct {
	cl   Claim[K]
	lost atomic.Bool
	// finishing is set before the first statement that finishes, fails or
	// releases the claim: from then on that statement, not the heartbeat,
	// reports the claim if it is lost.
	finishing atomic.Bool
	cancel    context.CancelFunc
	// valid is the claim's validity (with a lease; nil without): when
	// it runs out, expired is set and the work's context cancelled.
	valid   *lockcore.Validity
	expired atomic.Bool
}

// expire ends e's work once its validity has run out.
func (r *run[K]) expire(e *entry[K]) {
	r.mu.Lock()
	e.expired.Store(true)
	cancel := e.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

type run[K any] struct {
	w        *Worker[K]
	stopping context.Context // the caller's ctx: done means stop
	workCtx  context.Context // for work and statements: ends StopTimeout after stop

	mu    sync.Mutex
	st    Stats
	err   error // the first failure that cannot go away: ends the run
	stop  context.CancelFunc
	held  map[*entry[K]]struct{}
	freed chan struct{} // a slot was freed (for Drain's polling)
	// retries wakes the run when rows it sent back with a backoff become
	// claimable.
	retries *retryClock
	// onReader: the last claim reached a read-only server (readonly.go).
	onReader bool
}

// fail records err, a failure that cannot go away, as the run's result (the
// first one wins) and stops the run as a cancellation would.
func (r *run[K]) fail(err error) {
	r.mu.Lock()
	first := r.err == nil
	if first {
		r.err = err
	}
	r.mu.Unlock()
	if first {
		r.w.c.c.report(r.workCtx, Event{}, rec(slog.LevelError, "claim: worker: stopping on a failure that cannot go away", slog.Any("error", err)))
	}
	r.stop()
}

// refused returns the error of a run that ends because the table refused to
// move a row to state, the value of field.
func refused(field, state string, err error) error {
	if pgerr.Permanent(err) {
		return fmt.Errorf("claim: worker: moving a row to %s %q: %w", field, state, pgerr.Explain(err))
	}
	return fmt.Errorf("claim: worker: moving a row to %s %q: %w: the table refuses it: %w", field, state, ErrInvalid, err)
}

func (r *run[K]) count(f func(*Stats)) {
	r.mu.Lock()
	f(&r.st)
	r.mu.Unlock()
}

func (w *Worker[K]) run(ctx context.Context, drain bool) (Stats, error) {
	// ctx, from here on, also ends when the run fails for good (run.fail).
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	if w.cfg.StopTimeout > 0 {
		stop := context.AfterFunc(ctx, func() {
			t := time.AfterFunc(w.cfg.StopTimeout, cancelWork)
			context.AfterFunc(workCtx, func() { t.Stop() })
		})
		defer stop()
	}
	r := &run[K]{
		w:        w,
		stopping: ctx,
		workCtx:  workCtx,
		stop:     stopRun,
		held:     map[*entry[K]]struct{}{},
		freed:    make(chan struct{}, 1),
	}

	hbDone := make(chan struct{})
	hbCtx, stopHB := context.WithCancel(workCtx)
	lease := w.c.c.lease
	if w.c.c.t.leaseUntil == "" {
		lease = 0
	}
	if lease > 0 {
		go func() {
			defer close(hbDone)
			r.heartbeats(hbCtx, lease)
		}()
	} else {
		close(hbDone)
	}
	defer func() {
		stopHB()
		<-hbDone
	}()

	// Wake-ups: announcements of claimable rows (sub, nil when polling
	// only) and the moments rows this run sent back become claimable.
	woken := make(chan struct{}, 1)
	r.retries = &retryClock{wake: func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	}}
	defer r.retries.stop()
	sub, announced := w.subscribe(ctx)
	var heard <-chan struct{}
	if sub != nil {
		defer sub.Close()
		heard = sub.Wake()
	}
	toldMode := sub == nil
	if w.cfg.Recover != nil {
		stopRecovery := r.recover(ctx, woken)
		defer stopRecovery()
	}

	sem := make(chan struct{}, w.cfg.Concurrency)
	var wg sync.WaitGroup
	inflight := func() int { return len(sem) }
	group := joinPollGroup(w)
	defer leavePollGroup(group)
	// wait waits for the next poll, PollInterval after from (the last
	// claim's start, so that its connection goes back to the pool idle for
	// less than the interval), or for a wake-up. While notifications
	// arrive (Run, not Drain), the poll is the group's: PollInterval after
	// the latest claim of any worker of this process claiming the same
	// rows.
	//
	// The poll takes its connection from the pool pollAhead before it is
	// due (held, for the claim), so that the pool hands back the connection
	// of the last poll, idle for just under a PollInterval of 1 s, without
	// the ping pgxpool sends first for one idle over a second.
	var held *pgxpool.Conn
	defer func() {
		if held != nil {
			held.Release()
		}
	}()
	pool, _ := w.c.db.(*pgxpool.Pool)
	wait := func(from time.Time, onFreed bool) {
		if !toldMode {
			toldMode = w.tellMode(ctx, sub, announced)
		}
		shared := !drain && sub != nil && sub.Listening()
		if shared {
			from = later(from, group.latest())
		}
		due := from.Add(w.cfg.PollInterval)
		ahead := time.Duration(0)
		if pool != nil && inflight() < cap(sem) {
			ahead = pollAhead
		}
		t := time.NewTimer(time.Until(due) - ahead)
		defer t.Stop()
		// freed: returns (Drain) or, listening, marks the worker idle again
		// once its work ends; an announcement goes to a worker with room
		// first.
		var freed <-chan struct{}
		if onFreed || sub != nil {
			freed = r.freed
		}
		if sub != nil {
			sub.Idle(inflight() < cap(sem))
			defer sub.Idle(false)
		}
	waiting:
		for {
			select {
			case <-ctx.Done():
			case <-t.C:
				if shared {
					var mine bool
					if due, mine = group.turn(time.Now(), ahead, w.cfg.PollInterval); !mine {
						t.Reset(time.Until(due) - ahead) // another worker of the group claimed since, or polls now
						continue waiting
					}
				}
				if ahead > 0 {
					held = takeAhead(ctx, pool, due, heard, woken)
				}
			case <-freed:
				if !onFreed {
					sub.Idle(inflight() < cap(sem))
					continue waiting
				}
			case <-heard:
			case <-woken:
			}
			break
		}
		if !toldMode {
			toldMode = w.tellMode(ctx, sub, announced)
		}
	}

loop:
	for ctx.Err() == nil {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		// Work still in flight may yet put rows back (Retry.State); only a claim
		// that finds nothing after all work has ended means drained.
		busy := inflight() > 1
		// Claims use workCtx, not ctx: a claim statement cancelled half-way
		// could commit rows this run would never learn of. With a lease
		// such rows go back (to a Sweeper) when it runs out, so the claim
		// is bounded by the lease: an answer later than that holds
		// nothing.
		claimCtx, claimCancel := workCtx, context.CancelFunc(func() {})
		if lease > 0 {
			claimCtx, claimCancel = context.WithTimeout(workCtx, lease)
		}
		claimer := w.c
		if held != nil {
			claimer = &Claimer[K]{db: held, c: w.c.c}
		}
		sent := time.Now()
		cls, err := claimer.ClaimBatch(claimCtx, w.cfg.BatchSize, w.cfg.Args...)
		claimCancel()
		if held != nil {
			held.Release()
			held = nil
		}
		if err != nil {
			<-sem
			if workCtx.Err() != nil {
				break
			}
			if pgerr.Permanent(err) {
				r.fail(fmt.Errorf("claim: worker: claiming rows from Config.From %q to Config.To %q: %w", w.c.c.from, w.c.c.to, pgerr.Explain(err)))
				break
			}
			if permanent(err) {
				r.fail(fmt.Errorf("claim: worker: claiming rows from Config.From %q to Config.To %q: %w: the table refuses the statement: %w",
					w.c.c.from, w.c.c.to, ErrInvalid, err))
				break
			}
			if pgerr.ReadOnly(err) {
				r.readOnly(ctx, err)
			} else {
				w.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: worker: claim batch failed", slog.Any("error", err)))
			}
			wait(time.Now(), false)
			continue
		}
		r.writable(ctx)
		group.claimed(sent)
		if len(cls) == 0 {
			<-sem
			if drain && !busy && !r.othersHold(ctx) {
				break
			}
			wait(sent, drain)
			continue
		}
		if sub != nil && len(cls) == w.cfg.BatchSize {
			sub.Relay() // more may wait: another idle worker of the table claims too
		}
		es := make([]*entry[K], len(cls))
		r.mu.Lock()
		r.st.Claimed += len(cls)
		for i, cl := range cls {
			e := &entry[K]{cl: cl}
			if lease > 0 {
				e.valid = lockcore.NewValidity(sent, validity(lease), func() { r.expire(e) })
			}
			es[i] = e
			r.held[e] = struct{}{}
		}
		r.mu.Unlock()
		for i, e := range es {
			if i > 0 {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					for _, e := range es[i:] {
						r.release(e)
						r.drop(e)
					}
					break loop
				}
			}
			wg.Add(1)
			go func() {
				defer func() {
					r.drop(e)
					<-sem
					select {
					case r.freed <- struct{}{}:
					default:
					}
					wg.Done()
				}()
				r.process(e)
			}()
		}
		if len(cls) < w.cfg.BatchSize && !drain && sub != nil && sub.Listening() {
			// This claim took every row claimable: the next ones are
			// announced, so claim again when told (or at the poll), not
			// at once to find nothing.
			wait(sent, false)
		}
	}
	wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st, r.err
}

func (r *run[K]) drop(e *entry[K]) {
	r.mu.Lock()
	delete(r.held, e)
	r.mu.Unlock()
	if e.valid != nil {
		e.valid.Stop()
	}
}

// cleanupCtx is for statements that must run after the work's context
// ended: giving a claim back or recording a failure.
func (r *run[K]) cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.workCtx), cleanupTimeout)
}

func (r *run[K]) release(e *entry[K]) {
	e.finishing.Store(true)
	ctx, cancel := r.cleanupCtx()
	defer cancel()
	err := r.w.c.release(ctx, e.cl, rec(slog.LevelInfo, "claim: worker: released on stop",
		slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence)))
	r.settle(ctx, e, err, "Config.From", r.w.c.c.from, func(s *Stats) { s.Released++ }, "claim: worker: release failed")
}

// settle counts how a statement that gave e's claim back, or recorded its
// failure, moving the row to state (the value of field), ended: ErrLost as
// lost; another error as unrecorded, logged at error level as msg with
// attrs (a refusal by the table also ends the run: see refused); nil
// through done.
func (r *run[K]) settle(ctx context.Context, e *entry[K], err error, field, state string, done func(*Stats), msg string, attrs ...slog.Attr) {
	switch {
	case errors.Is(err, ErrLost):
		r.count(func(s *Stats) { s.Lost++ })
	case err != nil:
		r.count(func(s *Stats) { s.Unrecorded++ })
		if permanent(err) {
			r.fail(refused(field, state, err))
		}
		attrs = append([]slog.Attr{slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence)}, append(attrs, slog.Any("error", err))...)
		r.w.c.c.report(ctx, Event{}, rec(slog.LevelError, msg, attrs...))
	default:
		r.count(done)
	}
}

func (r *run[K]) process(e *entry[K]) {
	w := r.w
	if r.stopping.Err() != nil {
		r.release(e)
		return
	}
	ctx, cancel := context.WithCancel(r.workCtx)
	defer cancel()
	r.mu.Lock()
	e.cancel = cancel
	lost := e.lost.Load() || e.expired.Load()
	r.mu.Unlock()
	if lost {
		r.count(func(s *Stats) { s.Lost++ })
		return
	}

	tx, err := w.begin(ctx)
	if err != nil {
		w.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: worker: begin failed", slog.Any("key", e.cl.Key), slog.Any("error", err)))
		r.release(e)
		return
	}
	werr := callWork(func() error { return w.cfg.Work(ctx, tx, e.cl) })
	e.finishing.Store(true)
	final := false // a failure no retry can cure: straight to Failed
	if werr == nil {
		ferr := w.c.WithTx(tx).finishWith(ctx, e.cl, w.cfg.Done, nil, 0)
		if ferr != nil && permanent(ferr) {
			ferr = refused("WorkerConfig.Done", w.cfg.Done, ferr)
			r.fail(ferr)
			final = true
		}
		if ferr == nil {
			ferr = tx.Commit(ctx)
		}
		if ferr == nil {
			r.count(func(s *Stats) { s.Succeeded++ })
			return
		}
		if errors.Is(ferr, ErrLost) {
			r.rollback(tx)
			r.count(func(s *Stats) { s.Lost++ })
			return
		}
		werr = ferr
	}
	r.rollback(tx)

	if e.lost.Load() {
		r.count(func(s *Stats) { s.Lost++ })
		w.c.c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: claim lost during work",
			slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence), slog.Any("error", werr)))
		return
	}
	if e.expired.Load() {
		r.count(func(s *Stats) { s.Lost++ })
		w.c.c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: claim not confirmed within three quarters of its lease; work stopped, the row goes back when its lease runs out",
			slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence), slog.Any("error", werr)))
		return
	}
	if r.stopping.Err() != nil && ctx.Err() != nil && (errors.Is(werr, context.Canceled) || errors.Is(werr, context.DeadlineExceeded)) {
		r.release(e)
		return
	}
	state, retry := w.cfg.Failed, false
	var retryIn time.Duration
	if p := w.cfg.Retry; p.State != "" && e.cl.Attempts < p.MaxAttempts && !final {
		state, retry, retryIn = p.State, true, p.wait(e.cl.Attempts)
	}
	cctx, ccancel := r.cleanupCtx()
	defer ccancel()
	err = w.c.finishWith(cctx, e.cl, state, werr, retryIn, rec(slog.LevelWarn, "claim: worker: work failed",
		slog.Any("key", e.cl.Key), slog.Int64("fence", e.cl.Fence), slog.Int("attempts", e.cl.Attempts),
		slog.String("state", state), slog.Any("error", werr)))
	field := "WorkerConfig.Failed"
	if retry {
		field = "WorkerConfig.Retry.State"
	}
	if err == nil && retry && retryIn > 0 {
		r.retries.add(retryIn)
	}
	r.settle(cctx, e, err, field, state, func(s *Stats) {
		if retry {
			s.Retried++
		} else {
			s.Failed++
		}
	}, "claim: worker: recording failure failed", slog.Any("work_error", werr))
}

func (r *run[K]) rollback(tx pgx.Tx) {
	ctx, cancel := r.cleanupCtx()
	defer cancel()
	_ = tx.Rollback(ctx)
}

// heartbeats extends the leases of every held claim every lease/3
// (lease/12 after a failure), each heartbeat bounded by the latest of the
// claims' validities; it confirms the validity of the claims it found held, and
// cancels the work of claims found lost.
func (r *run[K]) heartbeats(ctx context.Context, lease time.Duration) {
	t := time.NewTimer(lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(lease / 3)
		r.mu.Lock()
		es := make([]*entry[K], 0, len(r.held))
		cls := make([]Claim[K], 0, len(r.held))
		for e := range r.held {
			es = append(es, e)
			cls = append(cls, e.cl)
		}
		r.mu.Unlock()
		if len(es) == 0 {
			continue
		}
		// An answer after every claim's validity has run out confirms
		// nothing: the heartbeat is bounded by the latest.
		sent := time.Now()
		var until time.Time
		for _, e := range es {
			if u := e.valid.Until(); u.After(until) {
				until = u
			}
		}
		hctx, cancel := context.WithDeadline(ctx, until)
		lost, err := r.w.c.heartbeat(hctx, cls, lease, func(i int) bool { return es[i].finishing.Load() })
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.w.c.c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: heartbeat failed", slog.Any("error", err)))
			}
			t.Reset(lease / 12)
			continue
		}
		for i, l := range lost {
			if !l {
				// Extended, or locked by a transaction with its
				// token unchanged (the work's own, which no other
				// claim or sweep can pass while it lasts).
				es[i].valid.Confirm(sent)
				continue
			}
			e := es[i]
			r.mu.Lock()
			e.lost.Store(true)
			cancel := e.cancel
			r.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		}
	}
}
