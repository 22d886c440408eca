package gate

// An election's lock key, the Mechanism that holds its leadership, and
// the Elector's configuration.

import (
	"fmt"
	"log/slog"
	"time"
)

// ElectionClass is the first half of the advisory lock key of every
// election: the bytes "pgce" read as a big-endian int32 (0x70676365 =
// 1885823845). The second half is the one AdvisoryKey computes from the
// name, so an election and an advisory gate of the same name use different
// locks and never exclude each other.
const ElectionClass int32 = 0x70676365

// ElectionKey returns the advisory lock key of the election called name:
// ElectionClass and the name's hash from AdvisoryKey.
//
// Two election names with the same 32-bit hash share one lock, and the
// advisory variant then runs them as one election: while either one's
// leader lives, the other has no leader at all (its candidates wait in
// pg_advisory_lock), for as long as that leader lives. The variant cannot
// tell the two apart without changing the key of every name, which would
// let instances of different releases lead at once. The chance that some
// pair among N election names (in one database) collides is about
// N(N-1)/2 / 2^32: 1e-8 for 10 names, 1.2e-6 for 100, 1.2e-4 for 1,000,
// 1.2% for 10,000 (election names only meet election names: advisory gates
// use AdvisoryClass). A candidate that has waited TTL for its lock looks
// for an open term of a colliding election and logs a warning naming it;
// rename one of the two, or use the lease variant (ElectorConfig.Mechanism LeaseRow),
// whose terms are keyed by the full name and never collide.
func ElectionKey(name string) (class, key int32) {
	_, key = AdvisoryKey(name)
	return ElectionClass, key
}

// electionKey is ElectionKey for an installation in schema (see schemaKey).
func electionKey(schema, name string) (class, key int32) {
	_, key = schemaKey(schema, name)
	return ElectionClass, key
}

// Mechanism is how an Elector holds leadership.
type Mechanism int

const (
	// Advisory holds a session advisory lock on a dedicated connection,
	// with standbys blocked in pg_advisory_lock: the next in line gets it
	// the moment the leader's session ends. It needs a direct connection
	// (not a transaction-pooling PgBouncer). The default.
	//
	// Connections: each candidate holds one dedicated connection, taken
	// out of the pool; the leader holds a second, opened once its term
	// has started, on which it closes its term when its lock session ends
	// (the successor waits for that close), and which it then keeps for
	// its next campaign, for up to a minute.
	Advisory Mechanism = iota

	// LeaseRow holds a lease row in pgclaim_terms renewed every TTL/4 with
	// database time; standbys try to take it every RetryInterval. It works
	// through PgBouncer in transaction pooling mode.
	LeaseRow
)

// String returns "advisory" or "lease-row".
func (m Mechanism) String() string {
	switch m {
	case Advisory:
		return "advisory"
	case LeaseRow:
		return "lease-row"
	}
	return fmt.Sprintf("Mechanism(%d)", int(m))
}

// DefaultTTL is the ElectorConfig.TTL used when none is set.
const DefaultTTL = 5 * time.Second

// ElectorConfig configure an Elector.
type ElectorConfig struct {
	// Holder identifies this instance in pgclaim_terms and in logs. Default:
	// "hostname:pid".
	Holder string

	// Logger receives leadership (acquired / lost / released) records, each with the caller's context
	// where there is one. Default (nil): slog.Default(), so warnings and
	// errors reach the process's logger; set a logger with
	// slog.DiscardHandler to silence it.
	Logger *slog.Logger

	// Hooks observes the same events for metrics and tracing. Default:
	// no-op.
	Hooks Hooks

	// Mechanism is how leadership is held: Advisory (the default) or
	// LeaseRow. All instances of one election must use the same one.
	Mechanism Mechanism

	// TTL bounds how long a leader that lost touch with the database may go
	// on unnoticed. The leader confirms its lock or lease every TTL/4 and
	// steps down (its context is cancelled) when it has not confirmed for
	// 3/4 TTL, counted from when the last confirmation was sent; each
	// confirmation is bounded by that, and closing a term by TTL. So a
	// leader whose network goes silent steps down at most 3/4 TTL after
	// the silence, at least TTL/4 before a standby can lead by either
	// variant's rule below.
	//
	// Advisory variant: when a leader's session ends, the standby next in
	// line gets the lock at once; it leads as soon as the old leader has
	// closed its term (a live leader does that right after it sees its
	// session end), or TTL after it got the lock when the old leader does
	// not (it crashed, or is cut off).
	//
	// Lease variant: a leader that stops renewing loses the lease TTL after
	// its last renewal; a standby takes it at its next try. A candidate
	// that stalls between opening its term and confirming it (a saturated
	// pool, a GC or VM pause) does not lead once its lease has run out: its
	// term ends TTL after it was opened, and a standby leads at its first
	// try after that, so within TTL + RetryInterval of the stalled start.
	//
	// Default: DefaultTTL. At least 10ms.
	TTL time.Duration

	// RetryInterval is how often a standby of the lease variant tries to
	// take the lease. Default: TTL/4. The advisory variant does not poll.
	RetryInterval time.Duration
	// Retention is how long ended terms are kept, by database time: the
	// leader deletes older ones itself (when it starts leading, at most
	// every 10 minutes, and every 10 minutes while it leads; one statement
	// bounded to 5 s). The open term is kept. Default (0):
	// DefaultRetention, 7 days. KeepTerms keeps every term. At least an
	// hour.
	Retention time.Duration
	// Schema is the schema pgclaim's objects live in (pgclaim.WithSchema);
	// its statements name it, and its advisory key is the schema's (not
	// ElectionKey). Default: "", found through search_path.
	Schema string
}

func (o ElectorConfig) instance() instance {
	return instance{Holder: o.Holder, Logger: o.Logger, Hooks: o.Hooks, Schema: o.Schema}
}

// check validates the options and fills defaults.
func (o ElectorConfig) check() (ElectorConfig, error) {
	switch {
	case o.Mechanism != Advisory && o.Mechanism != LeaseRow:
		return o, invalid("ElectorConfig.Mechanism", fmt.Sprintf("%v is neither Advisory nor LeaseRow", o.Mechanism))
	case o.TTL < 0:
		return o, invalid("ElectorConfig.TTL", "must not be negative")
	case o.TTL > 0 && o.TTL < 10*time.Millisecond:
		return o, invalid("ElectorConfig.TTL", "must be at least 10ms")
	case o.RetryInterval < 0:
		return o, invalid("ElectorConfig.RetryInterval", "must not be negative")
	}
	if err := checkSchemaName("ElectorConfig", o.Schema); err != nil {
		return o, err
	}
	if err := checkTermRetention(o.Retention); err != nil {
		return o, err
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = o.TTL / 4
	}
	in := o.instance().withDefaults()
	o.Holder, o.Logger, o.Hooks = in.Holder, in.Logger, in.Hooks
	return o, nil
}
