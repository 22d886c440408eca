package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/internal/qualify"
)

// DBTX is what every operation runs on: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it, as does the DBTX interface sqlc generates for pgx.
// Passing a pgx.Tx (see Claimer.WithTx) makes the operation part of the
// caller's transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Claimer.
type Config struct {
	// From is the state rows are claimed from (for example "PAUSED").
	// Required.
	From string
	// To is the state a claimed row is in while its holder works on it
	// (for example "PROCESSING"). Required; must differ from From.
	To string
	// Holder is written to Table.ClaimedBy. Default: DefaultHolder().
	Holder string
	// Lease, when positive, sets Table.LeaseUntil to database time plus
	// Lease at every claim (the table must have LeaseUntil). Zero means
	// claims carry no lease, and LeaseUntil (if configured) is set to NULL.
	Lease time.Duration
	// Order is an SQL ORDER BY list deciding which rows ClaimBatch takes
	// first, for example "created_at, id". It is trusted SQL: never build
	// it from user input. Default: the key column, ascending.
	Order string
	// Where is an optional SQL condition that ClaimBatch adds to its
	// selection, for example "tenant_id = $1 AND priority > $2". It is
	// trusted SQL: never build it from user input; pass values as
	// parameters $1, $2, ... bound by ClaimBatch's args.
	Where string
	// Spread makes ClaimBatch start at a random claimable row rather than
	// at the first in key order: it samples a few pages of the table
	// (TABLESAMPLE SYSTEM) for a claimable row, takes rows in key order
	// from there, and goes on from the first row when it reaches the last
	// (from the first row, as without Spread, when the sample finds none).
	// Many claimers (many instances of a service) then take rows from
	// different parts of a backlog. Without it every claim starts at the
	// same first rows, where it steps over the rows other claims hold
	// locked and over the index entries of rows claimed a moment ago, a
	// walk that grows with the number of claimers (docs/BENCHMARKS.md,
	// "instances": at 64 instance processes, 3.1× the rows per second).
	// Rows are then not claimed in key order, and how long a row waits is
	// not bounded by its place in that order: each batch of n reaches it
	// with a chance of about n in the number of claimable rows. It helps
	// where claimable rows make up much of the table; where they are few
	// among many finished rows, most samples find none. It cannot be
	// combined with Order. Default: false.
	Spread bool
	// Logger receives what the claimer and the workers and sweepers built
	// on it log, each record with the context of the call it is about:
	// claims and releases at Debug; lost claims, failed work, swept rows
	// and missing indexes at Warn; a worker's releases on stop at Info; and
	// failures of the worker's and the sweeper's own statements at Error.
	// Default: slog.Default() as of New; pass a logger with
	// slog.DiscardHandler to silence it (a claimer is cheap: give a worker
	// or a sweeper that should log elsewhere a claimer of its own).
	Logger *slog.Logger
	// Hooks, when set, receives an Event for every statement that moves
	// rows or finds claims lost, for metrics and tracing; sweepers and
	// workers built on the claimer report to it too.
	Hooks Hooks
	// Schema is the schema pgclaim's objects live in (pgclaim.WithSchema):
	// the claims take their fencing tokens from its pgclaim_fence(). It
	// says nothing about Table.Name, which names its own schema. Default:
	// "", pgclaim_fence() found through search_path.
	Schema string
}

// Claim is one row held by a claimer.
type Claim[K any] struct {
	// Key is the claimed row's key.
	Key K
	// Fence is the fencing token stamped in Table.Fence by this claim; 0
	// when the table has no Fence column.
	Fence int64
	// ClaimedAt is the database time stamped in Table.ClaimedAt.
	ClaimedAt time.Time
	// Attempts is Table.Attempts after this claim (1 on the first claim);
	// 0 when the table has no Attempts column.
	Attempts int
}

// Claimer claims rows of one table from one state to another and finishes
// them, fenced by each claim's fencing token (Claim.Fence). It is safe for concurrent use. Every method runs on
// the DBTX the claimer is bound to; WithTx binds a copy to a transaction.
type Claimer[K any] struct {
	db DBTX
	c  *core
}

// core is the immutable part shared by a Claimer and its WithTx copies.
type core struct {
	t           *table
	from, to    string
	holder      string
	lease       time.Duration
	whereParams int
	log         *slog.Logger
	hooks       Hooks

	// The statements, built by build (sql.go).
	sqlClaim, sqlBatch                    query
	sqlFinishBatch, sqlExtend, sqlRelease query
	sqlHeartbeat, sqlHeld                 query
	sqlOpen                               query // rows within Config.Where in To
	// sqlFinish[reason][retry] is Finish, that with reason also sets
	// Table.Reason and with retry Table.RetryAt: empty when the table lacks
	// the column.
	sqlFinish [2][2]query
}

// DefaultHolder returns the default instance identity, "hostname:pid".
func DefaultHolder() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "unknown"
	}
	return h + ":" + strconv.Itoa(os.Getpid())
}

// logger returns l, or when l is nil slog.Default(): the default for every
// Logger field of the package's configurations.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// readCommitted is how pgclaim begins every transaction of its own.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// txBeginner is a DBTX that can begin a transaction of its own (a pool or a
// connection); a pgx.Tx cannot.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// serializationFailure reports whether err is SQLSTATE 40001.
func serializationFailure(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40001"
}

// stmt runs one statement through f, which reads all of its results, on the
// claimer's db.
//
// Every statement here acts on rows that others change concurrently, and
// relies on read committed semantics for that: an UPDATE or a SELECT FOR
// UPDATE that meets a row changed by a transaction that committed after the
// statement began re-checks its condition on the new version of the row.
// Above read committed (default_transaction_isolation set by the database,
// the role, or the pool's RuntimeParams) the same statement fails with
// SQLSTATE 40001 instead; and when it does not fail, it saw no such change to
// the rows it touched and its answer is the one read committed gives. So
// stmt runs f once as it is, one round trip at whatever level the session
// defaults to, and only when that fails with 40001 (so only above read
// committed, under contention) runs it again in a transaction begun READ
// COMMITTED, where it re-checks instead of failing. The failed attempt
// changed nothing: it ran in a transaction of its own, rolled back.
//
// On a DBTX that cannot begin a transaction, typically the caller's pgx.Tx
// (see WithTx), the 40001 has aborted the caller's transaction and nothing
// can be re-run in it: stmt returns an error that matches ErrInvalid and
// names transaction_isolation, wrapping the server's error.
func (c *Claimer[K]) stmt(ctx context.Context, f func(DBTX) error) error {
	err := f(c.db)
	if !serializationFailure(err) {
		return c.explain(ctx, err) // a missing privilege names the grant
	}
	b, ok := c.db.(txBeginner)
	if !ok {
		return fmt.Errorf("%w: transaction_isolation: the transaction runs above read committed and a row changed after its snapshot, "+
			"so the statement could not re-check it; the transaction is aborted: roll it back, and begin it READ COMMITTED "+
			"(pgx.TxOptions{IsoLevel: pgx.ReadCommitted}): %w", ErrInvalid, err)
	}
	tx, err := b.BeginTx(ctx, readCommitted)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// New returns a claimer for rows of tbl moving from cfg.From to cfg.To,
// running on db. It validates tbl and cfg and returns an error naming the
// first bad field; it does not contact the database (see Verify).
//
// K is the Go type of the key column: int64, string, [16]byte,
// pgtype.UUID, uuid.UUID or any other type pgx maps to it.
func New[K any](db DBTX, tbl Table, cfg Config) (*Claimer[K], error) {
	if db == nil {
		return nil, invalid("db", "must not be nil")
	}
	t, err := tbl.validate()
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.From == "":
		return nil, invalid("Config.From", "must not be empty")
	case cfg.To == "":
		return nil, invalid("Config.To", "must not be empty")
	case cfg.From == cfg.To:
		return nil, invalid("Config.To", fmt.Sprintf("must differ from Config.From (both %q)", cfg.From))
	case cfg.Lease < 0:
		return nil, invalid("Config.Lease", "must not be negative")
	case cfg.Lease > 0 && t.leaseUntil == "":
		return nil, t.needs("Table.LeaseUntil", t.leaseUntil, "Config.Lease")
	case cfg.Lease > 0 && cfg.Lease < time.Microsecond:
		return nil, invalid("Config.Lease", "must be at least 1µs")
	case cfg.Spread && strings.TrimSpace(cfg.Order) != "":
		return nil, invalid("Config.Spread", "cannot be combined with Config.Order: a spread claim takes rows in key order from a random row")
	}
	if msg := qualify.Check(cfg.Schema); msg != "" {
		return nil, invalid("Config.Schema", msg)
	}
	t.pgclaim = qualify.New(cfg.Schema)
	n, err := countParams(cfg.Where)
	if err != nil {
		return nil, err
	}
	c := &core{
		t:           t,
		from:        cfg.From,
		to:          cfg.To,
		holder:      cfg.Holder,
		lease:       cfg.Lease,
		whereParams: n,
		log:         cfg.Logger,
		hooks:       cfg.Hooks,
	}
	if c.holder == "" {
		c.holder = DefaultHolder()
	}
	c.log = logger(c.log)
	c.build(cfg)
	return &Claimer[K]{db: db, c: c}, nil
}

// micros converts d to whole microseconds for an interval parameter.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// WithTx returns a copy of the claimer that runs on db, typically the
// caller's pgx.Tx, so that a claim or finish commits or rolls back with the
// caller's own writes.
//
// Isolation. On a pool or a connection, every method holds whatever
// default_transaction_isolation the database, role or pool sets: a statement
// that meets a row another transaction changed meanwhile, and fails with
// SQLSTATE 40001 above read committed, is run again in a transaction begun
// READ COMMITTED, which re-checks the row instead (a Claim that lost the row
// returns ErrNotClaimed, a Finish or Extend of a row whose lease a heartbeat
// just extended succeeds). The caller's transaction is the caller's: at READ
// COMMITTED every method behaves as on a pool. Above it, a statement that
// meets a row changed after the transaction's snapshot (a claim by another
// holder, a lease extended by a heartbeat or by Extend on the pool, a sweep)
// cannot re-check it, and the server has aborted the transaction; the method
// then returns an error that matches ErrInvalid and names
// transaction_isolation, wrapping the server's 40001. Begin a transaction
// that claims, finishes, extends or releases rows others may touch with
// pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, as the Worker does.
func (c *Claimer[K]) WithTx(db DBTX) *Claimer[K] {
	return &Claimer[K]{db: db, c: c.c}
}

// Verify checks that the table exists with the configured columns, each of
// a usable type (State text, varchar, char or an enum; ClaimedAt,
// LeaseUntil and RetryAt timestamptz; Fence bigint; Attempts an integer;
// ClaimedBy text or varchar; Reason text), that Key has a unique index of its own, and that pgclaim's fencing
// sequence exists when Fence is set; and that Config.From and Config.To
// are allowed by the state column: labels of its enum, and allowed by its
// CHECK constraints in the simple forms Worker.Verify lists. The error
// names every field (and state) that is wrong and matches ErrInvalid.
// Worker.Verify and Sweeper.Verify check their own states too, and warn
// about missing partial indexes.
func (c *Claimer[K]) Verify(ctx context.Context) error {
	return c.verify(ctx, verifySpec{})
}
