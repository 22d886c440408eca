package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

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
