package schedule

import (
	"context"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/budget"
	"github.com/pgclaim/pgclaim/internal/listen"
	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/store"
)

// Run describes one attempt of a run, passed to its Job.
type Run struct {
	// Schedule is the schedule's name.
	Schedule string
	// Instant is the scheduled instant (UTC, microseconds), or the
	// database time of the trigger for a triggered run.
	Instant time.Time
	// Kind is "scheduled", "triggered" or "backfill".
	Kind string
	// Attempt counts the attempts of this instant, 1 for the first.
	Attempt int
	// Fence is the attempt's fencing token from pgclaim_fence(): greater
	// than every earlier attempt's, across server restarts and primary
	// promotions. Pass it to the systems the job writes to, so they can
	// refuse a stale attempt.
	Fence int64
	// Holder is this instance's identity.
	Holder string
}

// Job is the work of a schedule. ctx is cancelled when the attempt's
// exclusivity is lost (the cause wraps ErrLost), when a newer instant
// replaces it (OverlapReplace; the cause wraps ErrLost too), or when Run's
// context ends. A
// nil return records the instant succeeded; an error (or a panic) is a
// failed attempt, retried per the schedule's RetryPolicy.
type Job func(ctx context.Context, run Run) error

// DedicatedSessions is how many connections a running Scheduler holds
// besides its pool's (which bounds everything else it and its jobs do): the
// session holding the advisory locks of every schedule it runs — one per
// pool in a process, shared with every Gate on the same pool — and one
// listening for notifications, also one per pool in a process, shared with
// every Scheduler and claim.Worker on the same pool. With Config.LeaseLocks it holds none. An
// instance's budget is therefore the pool's MaxConns + DedicatedSessions,
// whatever the number of schedules and gates.
const DedicatedSessions = budget.DedicatedSessions

// Config configures a Scheduler. The zero value is ready to use.
type Config struct {
	// Holder identifies this instance in runs and logs. Default
	// "hostname:pid".
	Holder string
	// Logger receives the scheduler's records (see Event). Default (nil):
	// slog.Default(); silence it with a logger on slog.DiscardHandler.
	Logger *slog.Logger
	// Hooks observes every Event. Default: none.
	Hooks Hooks
	// LeaseLocks makes the scheduler hold a lease row (pgclaim_locks) per
	// schedule instead of a session advisory lock, and poll instead of
	// listening: for pools behind a transaction-pooling PgBouncer. A run
	// whose holder died is then taken over once its lease expires, rather
	// than at once.
	LeaseLocks bool
	// PollInterval bounds how long pause, resume and trigger take to reach
	// this instance when a notification is lost (or with LeaseLocks, where
	// nothing listens), and how soon a run whose holder died is found. A
	// pending run of a schedule whose lock another runner holds is left to
	// that runner, and found by the first poll after it lets go.
	// Default 1 s.
	PollInterval time.Duration
	// Grace is how late an instant may be recorded and still be on time;
	// an instant recorded later (or one a later instant overtook) is
	// missed, reported, and decided by the catch-up policy. Default 30 s.
	Grace time.Duration
	// MaxConcurrent bounds how many schedules this instance attends at
	// once — running an attempt, or recording what came due — so that its
	// jobs queue here rather than on the pool. At the limit it leaves due
	// schedules alone until one of its own finishes; instances with room
	// take them meanwhile, and the slots that free up go to the runs
	// nobody has started. Default 100: it bounds goroutines and jobs, not
	// connections (the pool's MaxConns bounds those, and jobs that query
	// wait for the pool as they would anywhere). For every schedule due at
	// one moment to start at once, set it to at least their number divided
	// by the instances; lower it to bound the jobs running together.
	MaxConcurrent int
	// Retention is how long the finished runs (succeeded, failed, skipped)
	// of the schedules registered with this scheduler are kept, by database
	// time: a running scheduler deletes older ones itself, in batches of
	// 1,000 rows each bounded to 5 s, a minute after Run starts and then
	// every 10 minutes. A pruned instant is never recorded again (see
	// Prune). Definition.Retention overrides it per schedule; a schedule
	// whose CatchUpWindow is as long keeps its runs. Default (0):
	// DefaultRetention, 7 days. KeepRuns keeps every run. At least an
	// hour.
	Retention time.Duration
	// Schema is the schema pgclaim's objects live in (pgclaim.WithSchema):
	// every statement names it, so nothing depends on search_path, and
	// schedulers of installations in other schemas of the database never
	// see these schedules, their runs or their locks. Default: "", the
	// objects found through search_path.
	Schema string
}

// Scheduler runs the schedules registered with it, in every instance that
// runs one; see the package doc.
type Scheduler struct {
	pool   *pgxpool.Pool
	q      *store.Queries // outside transactions: reads only
	rc     *store.Queries // each statement its own READ COMMITTED transaction (stmts)
	holder string
	log    *slog.Logger
	hooks  Hooks
	cfg    Config
	locks  locker
	schema *qualify.Schema // Config.Schema

	refusals refusals                        // connections refused by the database: back-off and reports
	readOnly onReader                        // statements refused by a read-only server (readonly.go)
	reads    batcher[string, readResult]     // the runners' state reads (reads.go)
	seizes   batcher[leaseCall, int64]       // session locks' lease seizes (lock.go)
	acquires batcher[leaseCall, int64]       // lease locks' acquisitions (lock.go)
	releases batcher[releaseCall, struct{}]  // lease releases, both kinds of lock (lock.go)
	records  batcher[recordCall, int64]      // the runners' recorded instants (record.go)
	claims   batcher[claimCall, claimResult] // the runners' claims (attempt.go)
	starts   batcher[startCall, startResult] // the common path's starts (startdue.go)
	finishes batcher[finishCall, bool]       // the attempts' outcomes (attempt.go)
	// retainBatch is the most runs one retention statement deletes
	// (retainBatch; smaller in tests).
	retainBatch int32
	clock       dbClock        // the database's time (clock.go)
	stalled     atomic.Bool    // tests: keepers freeze, as in a stopped process
	zombies     sync.WaitGroup // attempts replaced (overlap replace) still running

	// sub is Run's subscription to the pool's listening session (nil
	// while not running, or with LeaseLocks).
	sub atomic.Pointer[listen.Sub]

	mu      sync.Mutex
	entries map[string]*entry
	changed chan struct{} // a registration while running
	running bool
}

// entry is a schedule this instance runs.
type entry struct {
	name      string
	job       Job
	retention time.Duration // Definition.Retention; 0: Config.Retention
	st        *stored       // last read; nil until read
	poke      chan struct{}
}

// New returns a scheduler on pool. It validates cfg; it does not touch the
// database.
func New(pool *pgxpool.Pool, cfg Config) (*Scheduler, error) {
	switch {
	case pool == nil:
		return nil, invalid("pool", "must not be nil")
	case cfg.PollInterval < 0:
		return nil, invalid("Config.PollInterval", "must not be negative")
	case cfg.Grace < 0:
		return nil, invalid("Config.Grace", "must not be negative")
	case cfg.MaxConcurrent < 0:
		return nil, invalid("Config.MaxConcurrent", "must not be negative")
	}
	if msg := qualify.Check(cfg.Schema); msg != "" {
		return nil, invalid("Config.Schema", msg)
	}
	schema := qualify.New(cfg.Schema)
	if cfg.Holder == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "pid"
		}
		cfg.Holder = host + ":" + strconv.Itoa(os.Getpid())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Hooks == nil {
		cfg.Hooks = noHooks{}
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Grace == 0 {
		cfg.Grace = 30 * time.Second
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = 100
	}
	if err := checkRetention("Config.Retention", cfg.Retention, 0); err != nil {
		return nil, err
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	s := &Scheduler{
		pool: pool, q: store.New(schema.Wrap(pool)), rc: store.New(schema.Wrap(lockcore.ReadCommitted{Pool: pool})), schema: schema,
		holder: cfg.Holder, log: cfg.Logger, hooks: cfg.Hooks, cfg: cfg,
		entries: map[string]*entry{}, changed: make(chan struct{}, 1), retainBatch: retainBatch,
	}
	s.reads.send = s.readStates
	s.seizes.send = s.seizeLeases
	s.acquires.send = s.acquireLeases
	s.records.send = s.recordMany
	s.claims.send = s.claimMany
	s.starts.send, s.starts.gather = s.startMany, startGather
	s.finishes.send, s.finishes.gather = s.finishMany, finishGather
	s.releases.send, s.releases.gather = s.releaseLeases, releaseGather
	s.locks = s.newLocker()
	return s, nil
}

// newLocker returns a locker of the kind Config.LeaseLocks says. A session
// locker's sessions are the process's for s's pool (lockcore.Share): one
// of this scheduler's lockers and another exclude each other in the
// process as on the server.
func (s *Scheduler) newLocker() locker {
	if s.cfg.LeaseLocks {
		return &leaseLocker{s: s}
	}
	return &sessionLocker{s: s}
}

// tx runs fn in a READ COMMITTED transaction on the pool, whatever
// isolation the database, role or pool defaults to.
func (s *Scheduler) tx(ctx context.Context, fn func(q *store.Queries) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		return fn(store.New(s.schema.Wrap(tx)))
	})
}

// stmts runs fn's statements through the pool, each as its own READ
// COMMITTED transaction (lockcore.ReadCommitted): one round trip each,
// where tx costs two more (BEGIN, COMMIT). For statements that need not
// commit together: each of the runner's statements stands alone (a lease
// check or a fence in its own WHERE), and at READ COMMITTED each statement
// of a transaction reads its own snapshot anyway.
func (s *Scheduler) stmts(_ context.Context, fn func(q *store.Queries) error) error {
	return fn(s.rc)
}

// Register stores def by the version rule and makes this scheduler run the
// schedule's stored definition with job. Call it at start-up in every
// instance, before or while Run runs; registering the same definition
// again changes nothing.
//
// The stored definition is replaced only by a strictly higher Version.
// When the stored one differs from def (a lower version here, or an equal
// version with other settings), the instance follows the stored one:
// Register logs a warning, reports EventFollowed, and returns nil. Bad
// input returns an error naming the field (wrapping ErrInvalid) and
// nothing is written.
func (s *Scheduler) Register(ctx context.Context, def Definition, job Job) error {
	d, _, err := def.normalize()
	if err != nil {
		return err
	}
	if job == nil {
		return invalid("job", "must not be nil")
	}
	var changed bool
	err = s.tx(ctx, func(q *store.Queries) error {
		var err error
		changed, err = register(ctx, q, d)
		return err
	})
	if err != nil {
		s.reader(ctx, d.Name, err)
		return s.explain(ctx, err)
	}
	st, err := loadSchedule(ctx, s.q, d.Name)
	if err != nil {
		return s.explain(ctx, err)
	}
	// Retention is this instance's setting, not stored with the definition.
	stored := st.def
	stored.Retention = d.Retention
	if !changed && !reflect.DeepEqual(stored, d) {
		s.emit(ctx, Event{
			Kind: EventFollowed, Schedule: d.Name, Holder: s.holder,
			Reason: followReason(d, st.def),
		})
	}
	s.mu.Lock()
	e := s.entries[d.Name]
	if e == nil {
		e = &entry{name: d.Name, poke: make(chan struct{}, 1)}
		s.entries[d.Name] = e
	}
	e.job = job
	e.retention = d.Retention
	s.mu.Unlock()
	s.warnKept(ctx, d, st.def.CatchUpWindow)
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// dbNow estimates the database's time from the host's clock (dbClock). It
// only times wake-ups: every due decision
// reads now() from the server.
func (s *Scheduler) dbNow() time.Time { return s.clock.now() }

// observe records the database time read by a statement sent at sent.
func (s *Scheduler) observe(sent time.Time, db time.Time) { s.clock.observe(sent, db) }
