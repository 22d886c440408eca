package claim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
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

// Claim moves the row with the given key from From to To if it is in From,
// stamping claimed_at (database time), claimed_by, a fresh fencing token
// and attempts+1. It returns ErrNotClaimed when the row was not in From
// (another holder won, or there is no such row).
func (c *Claimer[K]) Claim(ctx context.Context, key K) (Claim[K], error) {
	args := c.c.sqlClaim.bind(key)
	cl := Claim[K]{Key: key}
	var attempts int64
	start := time.Now()
	err := c.stmt(ctx, func(db DBTX) error {
		return db.QueryRow(ctx, c.c.sqlClaim.text, args...).Scan(&cl.ClaimedAt, &cl.Fence, &attempts)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		c.c.report(ctx, Event{Kind: EventNotClaimed, Rows: 1, Duration: time.Since(start)})
		return Claim[K]{}, ErrNotClaimed
	}
	if err != nil {
		return Claim[K]{}, fmt.Errorf("claim: Claim: %w", err)
	}
	cl.Attempts = int(attempts)
	c.c.report(ctx, Event{Kind: EventClaimed, State: c.c.to, Rows: 1, Duration: time.Since(start)},
		rec(slog.LevelDebug, "claim: claimed", slog.String("table", c.c.t.qname), slog.Any("key", key), slog.Int64("fence", cl.Fence)))
	return cl, nil
}

// ClaimBatch claims up to n rows in From in one statement, picking them in
// Config.Order and skipping rows locked by other transactions (FOR UPDATE
// SKIP LOCKED), so concurrent claimers never receive the same row and never
// wait for each other. args bind the placeholders of Config.Where. Each
// claimed row gets its own fresh fencing token. The returned claims are in no
// particular order; an empty slice means nothing was claimable.
func (c *Claimer[K]) ClaimBatch(ctx context.Context, n int, args ...any) ([]Claim[K], error) {
	return c.claimBatch(ctx, n, args)
}

func (c *Claimer[K]) claimBatch(ctx context.Context, n int, where []any) ([]Claim[K], error) {
	if n <= 0 {
		return nil, invalid("ClaimBatch: n", "must be positive")
	}
	if len(where) != c.c.whereParams {
		return nil, invalid("ClaimBatch: args", fmt.Sprintf("Config.Where uses %d parameters, got %d", c.c.whereParams, len(where)))
	}
	args := c.c.sqlBatch.bind(append(slices.Clip(where), n)...)
	start := time.Now()
	out := make([]Claim[K], 0, n)
	err := c.stmt(ctx, func(db DBTX) error {
		out = out[:0]
		rows, err := db.Query(ctx, c.c.sqlBatch.text, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var cl Claim[K]
			var attempts int64
			if err := rows.Scan(&cl.Key, &cl.ClaimedAt, &cl.Fence, &attempts); err != nil {
				rows.Close()
				return err
			}
			cl.Attempts = int(attempts)
			out = append(out, cl)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("claim: ClaimBatch: %w", err)
	}
	ev := Event{Kind: EventClaimed, State: c.c.to, Rows: len(out), Duration: time.Since(start)}
	if len(out) == 0 {
		c.c.report(ctx, ev)
		return out, nil
	}
	c.c.report(ctx, ev, rec(slog.LevelDebug, "claim: claimed batch",
		slog.String("table", c.c.t.qname), slog.Int("rows", len(out)), slog.Int64("fence", out[0].Fence)))
	return out, nil
}

func (c *Claimer[K]) checkState(op, state string) error {
	if state == "" {
		return invalid(op+": state", "must not be empty")
	}
	if state == c.c.to {
		return invalid(op+": state", fmt.Sprintf("must differ from Config.To (%q)", state))
	}
	return c.c.t.needs("Table.Fence", c.c.t.fence, op)
}

// lost is the log record of a claim op found no longer held.
func (c *Claimer[K]) lost(op string, cl Claim[K]) record {
	return rec(slog.LevelWarn, "claim: claim lost", slog.String("op", op), slog.String("table", c.c.t.qname),
		slog.Any("key", cl.Key), slog.Int64("fence", cl.Fence))
}

// Finish moves the claimed row from To to state, only if it is still in To
// with this claim's token. Otherwise it returns ErrLost and changes nothing.
// It needs Table.Fence; state must not be empty or equal To.
func (c *Claimer[K]) Finish(ctx context.Context, cl Claim[K], state string) error {
	if err := c.checkState("Finish", state); err != nil {
		return err
	}
	return c.finish(ctx, "Finish", cl, Event{Kind: EventFinished, State: state}, nil, &c.c.sqlFinish[0][0], cl.Key, cl.Fence, state)
}

// maxReason is the most bytes of an error's text a worker records in
// Table.Reason.
const maxReason = 2000

// finishWith is Finish on behalf of a worker whose work ended with cause
// (nil on success). It also sets Table.Reason, when the table has that
// column, to the text of cause (NULL when nil), cut at maxReason bytes on a
// character boundary; and, when retryIn is positive, Table.RetryAt to
// database time plus retryIn. logs are the records that go with the move
// (see finish).
func (c *Claimer[K]) finishWith(ctx context.Context, cl Claim[K], state string, cause error, retryIn time.Duration, logs ...record) error {
	if err := c.checkState("Finish", state); err != nil {
		return err
	}
	var reason *string
	r, d := 0, 0
	if c.c.t.reason != "" {
		if cause != nil {
			text := cause.Error()
			if len(text) > maxReason {
				text = strings.ToValidUTF8(text[:maxReason], "")
			}
			reason = &text
		}
		r = 1
	}
	if retryIn > 0 && c.c.t.retryAt != "" {
		d = 1
	}
	return c.finish(ctx, "Finish", cl, Event{Kind: EventFinished, State: state, Err: cause}, logs, &c.c.sqlFinish[r][d],
		cl.Key, cl.Fence, state, reason, micros(retryIn))
}

// finish runs q, a fenced update of cl's row, with vals (see inKey),
// reports ev (with its duration) and logs when it moved the row, and
// returns ErrLost, reported as lost, when it touched no row.
func (c *Claimer[K]) finish(ctx context.Context, op string, cl Claim[K], ev Event, logs []record, q *query, vals ...any) error {
	start := time.Now()
	args := q.bind(vals...)
	var tag pgconn.CommandTag
	err := c.stmt(ctx, func(db DBTX) (err error) {
		tag, err = db.Exec(ctx, q.text, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("claim: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		c.c.report(ctx, Event{Kind: EventLost, Rows: 1, Duration: time.Since(start)}, c.lost(op, cl))
		return ErrLost
	}
	ev.Rows, ev.Duration = 1, time.Since(start)
	c.c.report(ctx, ev, logs...)
	return nil
}

// FinishBatch finishes many claims in one statement, like Finish for each:
// done holds the claims whose rows moved to state, lost the ones no longer
// held (each also logged). err reports only failures of the statement
// itself. Inside a transaction, call it before writing the effects, and
// write effects only for done. A claim passed twice is done once at most.
// The statement finds the rows by key, so it reads as many rows as there
// are claims, whatever the table's statistics say. Claims sharing a token
// (never stamped by Claim or ClaimBatch) take a statement each.
func (c *Claimer[K]) FinishBatch(ctx context.Context, cls []Claim[K], state string) (done, lost []Claim[K], err error) {
	if err := c.checkState("FinishBatch", state); err != nil {
		return nil, nil, err
	}
	if len(cls) == 0 {
		return nil, nil, nil
	}
	start := time.Now()
	ok, err := c.matchClaims(ctx, &c.c.sqlFinishBatch, cls, state)
	if err != nil {
		return nil, nil, fmt.Errorf("claim: FinishBatch: %w", err)
	}
	took := time.Since(start)
	done = make([]Claim[K], 0, len(cls))
	var logs []record
	for i, cl := range cls {
		if ok[i] {
			done = append(done, cl)
		} else {
			lost = append(lost, cl)
			logs = append(logs, c.lost("FinishBatch", cl))
		}
	}
	c.c.report(ctx, Event{Kind: EventFinished, State: state, Rows: len(done), Duration: took})
	c.c.report(ctx, Event{Kind: EventLost, Rows: len(lost), Duration: took}, logs...)
	return done, lost, nil
}

// matchClaims runs q, a statement over the claims cls bound as inKey
// (keys) and inFence (tokens), then vals, that returns the position of the claim each
// row it touched matched (see claimsCond), and reports per claim whether it
// matched. The claims go in sorted by token. A claim whose token is already
// in the statement (the same claim passed twice, or a token stamped on
// several rows by the caller's own SQL) goes to a further statement, so that
// no statement holds a token twice; the same claim passed twice therefore
// matches at most once in a statement that moves the row.
func (c *Claimer[K]) matchClaims(ctx context.Context, q *query, cls []Claim[K], vals ...any) ([]bool, error) {
	order := make([]int, len(cls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cls[a].Fence, cls[b].Fence) })
	// rounds[r] holds the r-th claim of every token, in token order.
	rounds := [][]int{make([]int, 0, len(cls))}
	for i := 0; i < len(order); {
		j := i + 1
		for j < len(order) && cls[order[j]].Fence == cls[order[i]].Fence {
			j++
		}
		for r := range j - i {
			if r == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[r] = append(rounds[r], order[i+r])
		}
		i = j
	}
	ok := make([]bool, len(cls))
	for _, round := range rounds {
		keys := make([]K, len(round))
		fences := make([]int64, len(round))
		for i, at := range round {
			keys[i], fences[i] = cls[at].Key, cls[at].Fence
		}
		args := q.bind(append([]any{keys, fences}, vals...)...)
		var matched []int
		err := c.stmt(ctx, func(db DBTX) error {
			matched = matched[:0]
			rows, err := db.Query(ctx, q.text, args...)
			if err != nil {
				return err
			}
			for rows.Next() {
				var p int64
				if err := rows.Scan(&p); err != nil {
					rows.Close()
					return err
				}
				if p >= 1 && int(p) <= len(round) {
					matched = append(matched, round[p-1])
				}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
		for _, i := range matched {
			ok[i] = true
		}
	}
	return ok, nil
}

// Extend sets the claimed row's lease to database time plus d, only if the
// row is still held with this claim's token; otherwise ErrLost. It returns
// the new lease end. It needs Table.Fence and Table.LeaseUntil.
func (c *Claimer[K]) Extend(ctx context.Context, cl Claim[K], d time.Duration) (time.Time, error) {
	if err := c.c.t.needs("Table.Fence", c.c.t.fence, "Extend"); err != nil {
		return time.Time{}, err
	}
	if err := c.c.t.needs("Table.LeaseUntil", c.c.t.leaseUntil, "Extend"); err != nil {
		return time.Time{}, err
	}
	if d < time.Microsecond {
		return time.Time{}, invalid("Extend: d", "must be positive")
	}
	args := c.c.sqlExtend.bind(cl.Key, cl.Fence, micros(d))
	var until time.Time
	start := time.Now()
	err := c.stmt(ctx, func(db DBTX) error {
		return db.QueryRow(ctx, c.c.sqlExtend.text, args...).Scan(&until)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		c.c.report(ctx, Event{Kind: EventLost, Rows: 1, Duration: time.Since(start)}, c.lost("Extend", cl))
		return time.Time{}, ErrLost
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("claim: Extend: %w", err)
	}
	return until, nil
}

// Release gives the claimed row back: it moves from To to From, only if it
// is still held with this claim's token; otherwise ErrLost. Attempts is
// decremented, so a released claim does not count as an attempt. It needs
// Table.Fence.
func (c *Claimer[K]) Release(ctx context.Context, cl Claim[K]) error {
	return c.release(ctx, cl)
}

// release is Release, writing logs (the worker's) after its own record
// when the row moved.
func (c *Claimer[K]) release(ctx context.Context, cl Claim[K], logs ...record) error {
	if err := c.c.t.needs("Table.Fence", c.c.t.fence, "Release"); err != nil {
		return err
	}
	released := rec(slog.LevelDebug, "claim: released", slog.String("table", c.c.t.qname), slog.Any("key", cl.Key), slog.Int64("fence", cl.Fence))
	return c.finish(ctx, "Release", cl, Event{Kind: EventReleased, State: c.c.from}, append([]record{released}, logs...),
		&c.c.sqlRelease, cl.Key, cl.Fence)
}

// heartbeat extends the leases of many claims in one statement. It returns,
// per claim, whether the claim is known to be lost: neither extended nor
// still held (a row locked by another transaction is skipped, not waited
// for, and counts as held while its token is unchanged). finishing(i), asked
// after the statements, reports that claim i's holder has begun finishing
// it: a finish that commits meanwhile also leaves the row neither extended
// nor held, and the finish itself reports a claim it finds lost; such a
// claim is not lost here. Without finishing, no claim is finishing. Each
// lost claim is reported and logged (the worker's heartbeat is the only
// caller).
func (c *Claimer[K]) heartbeat(ctx context.Context, cls []Claim[K], d time.Duration, finishing ...func(i int) bool) ([]bool, error) {
	start := time.Now()
	ext, err := c.matchClaims(ctx, &c.c.sqlHeartbeat, cls, micros(d))
	if err != nil {
		return nil, err
	}
	all := true
	for _, ok := range ext {
		all = all && ok
	}
	lost := make([]bool, len(cls))
	if all {
		return lost, nil
	}
	held, err := c.matchClaims(ctx, &c.c.sqlHeld, cls)
	if err != nil {
		return nil, err
	}
	var logs []record
	for i := range lost {
		lost[i] = !ext[i] && !held[i] && (len(finishing) == 0 || !finishing[0](i))
		if lost[i] {
			logs = append(logs, rec(slog.LevelWarn, "claim: worker: heartbeat found claim lost",
				slog.Any("key", cls[i].Key), slog.Int64("fence", cls[i].Fence)))
		}
	}
	c.c.report(ctx, Event{Kind: EventLost, Rows: len(logs), Duration: time.Since(start)}, logs...)
	return lost, nil
}
