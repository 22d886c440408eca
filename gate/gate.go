package gate

// This file holds what every gate mechanism shares: sentinel errors, the
// settings common to all of them (Holder, Logger, Hooks), the Run handed to a job, outcomes, and the
// Hooks interface. See doc.go for the package overview.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/qualify"
	"github.com/pgclaim/pgclaim/store"
)

// Sentinel errors. Compare with errors.Is; returned errors usually wrap one of
// these with the job or lock name.
var (
	// ErrSkipped means the job did not run because another run owns it: the
	// tick is already in the ledger, or the lock is held elsewhere. Skipping is
	// the normal outcome on every instance but one; callers usually treat it
	// as success.
	ErrSkipped = errors.New("gate: skipped")

	// ErrHeld means the lock (advisory, lease or election) is held by another
	// holder. It wraps ErrSkipped, so errors.Is(err, ErrSkipped) also holds.
	ErrHeld = fmt.Errorf("%w: lock held elsewhere", ErrSkipped)

	// ErrLockLost means exclusion was lost while the job was running: the
	// session holding the advisory lock died (backend terminated, server
	// restart, network) or the lease was taken over. The job's context was
	// cancelled when the loss was seen.
	ErrLockLost = errors.New("gate: lock lost while running")

	// ErrClockSkew means a scheduled instant is further from database time
	// than the configured tolerance: the instance clock (or the schedule) is
	// off, and running would guess which tick is meant.
	ErrClockSkew = errors.New("gate: fire time too far from database time")

	// ErrClosed means the gate (or lock, or elector) was closed.
	ErrClosed = lockcore.ErrClosed

	// ErrInvalid is wrapped by every error about bad input (an empty name, a
	// nil function, a meaningless duration). The message names the field.
	ErrInvalid = errors.New("gate: invalid argument")
)

// fieldError reports bad input for one named field. It reads
// "gate: <field>: <msg>" and unwraps to ErrInvalid.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return "gate: " + e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return ErrInvalid }

// invalid returns an error naming field that wraps ErrInvalid.
func invalid(field, msg string) error { return &fieldError{field: field, msg: msg} }

// schemaTimeout bounds the schema check of the constructors.
const schemaTimeout = 10 * time.Second

// checkSchema returns an error wrapping ErrInvalid, naming the fix, when
// the database behind q lacks any of the relations pgclaim's migrations
// create that names lists. A database it cannot ask within schemaTimeout
// (restarting, unreachable) is logged to log at warn level and not an
// error: nothing is known to be wrong, and the first statement will tell.
func checkSchema(log *slog.Logger, q *store.Queries, names ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
	defer cancel()
	missing, err := q.MissingRelations(ctx, names)
	if err != nil {
		log.Warn("gate: could not check pgclaim's tables", "tables", names, "error", err)
		return nil
	}
	if len(missing) > 0 {
		return invalid("pool", "the database has no "+strings.Join(missing, ", ")+": apply pgclaim's migrations (pgclaim.Migrate)")
	}
	return nil
}

// named is what a Lease and an Elector are built on: a pool, the queries
// through it (each statement its own READ COMMITTED transaction; see
// isolation.go) and the lock or election name.
type named struct {
	pool   *pgxpool.Pool
	q      *store.Queries
	name   string
	schema *qualify.Schema // pgclaim's objects' schema (nil: search_path)
}

// namedConfig is the config of a Lease or an Elector: they validate
// themselves and fill their defaults (check), and carry the shared
// settings (instance).
type namedConfig[O any] interface {
	check() (O, error)
	instance() instance
}

// newNamed validates pool and name, then opts (returned checked, with their
// defaults), then that the database has tables (see checkSchema), in that
// order.
func newNamed[O namedConfig[O]](pool *pgxpool.Pool, name string, opts O, tables ...string) (named, O, error) {
	if pool == nil {
		return named{}, opts, invalid("pool", "must not be nil")
	}
	if err := checkName("name", name); err != nil {
		return named{}, opts, err
	}
	o, err := opts.check()
	if err != nil {
		return named{}, opts, err
	}
	schema := qualify.New(o.instance().Schema)
	q := store.New(schema.Wrap(lockcore.ReadCommitted{Pool: pool}))
	for i, t := range tables {
		tables[i] = schema.Object(t)
	}
	if err := checkSchema(o.instance().Logger, q, tables...); err != nil {
		return named{}, opts, err
	}
	return named{pool: pool, q: q, name: name, schema: schema}, o, nil
}

// checkName validates a job, lock or election name given as field.
func checkName(field, name string) error {
	if name == "" {
		return invalid(field, "must not be empty")
	}
	return nil
}

// instance holds the settings every gate mechanism shares (Holder, Logger
// and Hooks of Config, LeaseConfig and ElectorConfig), with their defaults.
type instance struct {
	Holder string
	Logger *slog.Logger
	Hooks  Hooks
	Schema string // pgclaim's schema (Config.Schema); "": search_path
}

// checkSchemaName validates the Schema field of the config named config.
func checkSchemaName(config, schema string) error {
	if msg := qualify.Check(schema); msg != "" {
		return invalid(config+".Schema", msg)
	}
	return nil
}

// schemaKey is the advisory key of name for an installation in schema:
// AdvisoryKey(name) in the default one, a key of the schema's otherwise,
// so that installations in different schemas never exclude each other.
func schemaKey(schema, name string) (class, key int32) {
	if schema == "" {
		return AdvisoryKey(name)
	}
	return AdvisoryKey(schema + ":" + name)
}

// withDefaults fills unset fields. It never fails: a Holder can always be
// derived.
func (o instance) withDefaults() instance {
	if o.Holder == "" {
		o.Holder = defaultHolder()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Hooks == nil {
		o.Hooks = noHooks{}
	}
	return o
}

// defaultHolder is "hostname:pid", or "pid:<pid>" when the host name is
// unavailable.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "pid"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// Run describes one execution granted by a gate. It is passed to the job.
type Run struct {
	// Name is the job, lock or election name.
	Name string
	// FireAt is the scheduled instant (truncated to microseconds) for ledger
	// runs; zero for runs that are not ticks.
	FireAt time.Time
	// Holder is the identity this run was recorded under.
	Holder string
	// Fence is a fencing token from pgclaim_fence(), durable before the run
	// starts: greater than the token of every grant made before this one,
	// of any kind, across server restarts and primary promotions
	// (asynchronous or synchronous replication; see docs/claim.md for what
	// that needs of the server). Pass it to the systems the job writes to
	// so they can reject a stale holder.
	Fence int64
}

// Func is the job a gate runs. ctx is cancelled when the run must stop: the
// caller's context ended, or exclusion was lost (then the run reports
// ErrLockLost).
type Func func(ctx context.Context, run Run) error

// Outcome is how a run ended, as stored in pgclaim_ticks.outcome.
type Outcome string

// Outcomes of a run.
const (
	OutcomeSucceeded = Outcome(lockcore.Succeeded) // "succeeded": the job returned nil
	OutcomeFailed    = Outcome(lockcore.Failed)    // "failed": the job returned an error
	OutcomeLost      = Outcome(lockcore.Lost)      // "lost": exclusion was lost while running
	OutcomeAbandoned = Outcome(lockcore.Abandoned) // "abandoned": the caller's context ended, the job panicked, or its holder died
)

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventAcquired: the tick or lock was won; the job is about to run.
	EventAcquired EventKind = iota + 1
	// EventSkipped: another run owns the tick or lock; the job did not run.
	// Err says why: it wraps ErrClockSkew for an instant too far from
	// database time, ErrHeld for a lock or lease held elsewhere, and
	// ErrSkipped for a tick claimed already; it is nil when CatchUp found
	// no instant to run.
	// A tick of Once skipped because another run of the job still holds
	// its lock (a run longer than the schedule's period, or an Exclusive
	// run) has Err wrapping ErrHeld and HeldBy set, and is logged at warn
	// level: nobody runs that tick. A tick claimed already is logged at
	// debug level: it ran, or runs, elsewhere.
	EventSkipped
	// EventLost: exclusion was lost while the job was running.
	EventLost
	// EventFinished: the job returned; Outcome, Duration and Err are set.
	EventFinished
	// EventReleased: a lease or a leadership was given up by its holder
	// (Release, Resign); Duration is how long it was held.
	EventReleased
	// EventAbandoned: taking a job's advisory lock, this instance found a
	// tick of the job still marked running, left by a holder whose session
	// had ended (a killed process, a lost connection), and recorded it as
	// abandoned. FireAt and Fence are that tick's, Outcome is
	// OutcomeAbandoned and Err names its holder; Holder is this instance.
	EventAbandoned
)

// String returns "acquired", "skipped", "lost", "finished", "released" or
// "abandoned".
func (k EventKind) String() string {
	switch k {
	case EventAcquired:
		return "acquired"
	case EventSkipped:
		return "skipped"
	case EventLost:
		return "lost"
	case EventFinished:
		return "finished"
	case EventReleased:
		return "released"
	case EventAbandoned:
		return "abandoned"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one observation reported to Hooks.
type Event struct {
	Kind   EventKind
	Name   string    // job, lock or election name
	FireAt time.Time // scheduled instant for ledger runs; zero otherwise
	Holder string    // this instance's identity
	Fence  int64     // fencing token of the run, when one was issued

	// Set for EventFinished (Outcome also for EventAbandoned, Duration also
	// for EventReleased).
	Outcome  Outcome
	Duration time.Duration // how long the job ran
	Err      error         // the job's error (or ErrLockLost); nil on success; why, for skips and abandoned ticks

	// HeldBy is set for an EventSkipped of a tick whose job's lock was held
	// by another run (Err wraps ErrHeld; the tick was not run and is not in
	// the ledger): the holder of the job's latest running tick, whose run
	// holds the lock, or "" when the ledger shows none (an Exclusive run of
	// the same name holds it). Such a skip is logged at warn level.
	HeldBy string
}

// Hooks receives events for metrics and tracing. Observe may be called from
// several goroutines at once (EventLost comes from the goroutine watching the
// connection) and must not block. ctx is the context of the call the event
// belongs to (Once, Exclusive, TryAcquire, Do, Campaign, Run, Release,
// Resign...); for an event found by background work (a lock, lease or
// leadership lost, seen by its watcher), one carrying the values of the
// context that acquired it. The log record of the event is written with the
// same ctx.
type Hooks interface {
	Observe(ctx context.Context, e Event)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f HooksFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

type noHooks struct{}

func (noHooks) Observe(context.Context, Event) {}
