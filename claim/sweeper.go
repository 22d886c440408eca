package claim

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// SweeperConfig configures a Sweeper.
type SweeperConfig[K any] struct {
	// StaleAfter makes a row claimed without a lease stale once its
	// Table.ClaimedAt is older than this (database time). Rows with a lease
	// (Table.LeaseUntil not NULL) are stale once the lease has passed,
	// whatever StaleAfter says. Required unless the table has LeaseUntil
	// and the claimer has a Config.Lease, in which case zero means: sweep
	// expired leases only. (A claimer without a Lease sets LeaseUntil to
	// NULL, so with zero the row of a holder that died would never be
	// swept; NewSweeper refuses that. A sweeper of rows claimed elsewhere
	// with leases takes a claimer with the same Lease.) A row whose
	// ClaimedAt is NULL (moved to To by a statement that did not stamp it)
	// is never stale by StaleAfter.
	StaleAfter time.Duration
	// Failed is the state stale rows move to when no attempts remain.
	// Required.
	Failed string
	// Retry, when its State is set, sends a stale row whose Table.Attempts
	// is below Retry.MaxAttempts to Retry.State (typically Config.From),
	// not to Failed. With Retry.Backoff the row is not claimed again before
	// database time plus the wait computed from its attempts (it sets
	// Table.RetryAt), so that a row whose work keeps killing its holder is
	// not picked up again at once by every instance. The zero value: every
	// stale row goes to Failed.
	Retry RetryPolicy
	// FailAfter, when positive, sends a stale row claimed longer than
	// FailAfter ago (Table.ClaimedAt, database time) to Failed whatever
	// its attempts; younger stale rows go to Retry.State while attempts
	// remain.
	// It only chooses where a stale row goes: it does not make a row stale,
	// and a row under a live lease is never swept. With a leased claimer,
	// StaleAfter zero and FailAfter 24h, one Sweeper sends rows whose lease
	// expired back for a retry and fails those claimed more than a day
	// ago, with no Where. The choice is re-checked on the locked row like
	// staleness. Needs Retry.State.
	FailAfter time.Duration
	// BatchSize is the most rows one statement moves (and locks), for
	// example 1000. Required.
	BatchSize int
	// Where is an optional SQL condition narrowing the rows swept, with
	// placeholders $1, $2, ... bound to Args. It is trusted SQL: never
	// build it from user input.
	Where string
	// Args bind the placeholders of Where.
	Args []any
	// OnSwept, when set, is called after each batch with the rows it
	// moved (already committed when the sweeper runs on a pool).
	OnSwept func(ctx context.Context, swept []Swept[K])
	// SkipVerify keeps NewSweeper from checking the table and the states
	// against the database. By default NewSweeper runs Sweeper.Verify and
	// returns what it finds wrong (an error matching ErrInvalid: build it
	// after the migrations that create the table); a missing partial
	// index (ErrMissingIndex), or a database it cannot ask within 10
	// seconds, is logged at warn level and does not fail it.
	SkipVerify bool
}

// Swept is one row moved out of the processing state by a sweeper.
type Swept[K any] struct {
	// Key is the row's key.
	Key K
	// State is the state the row was moved to (Failed or Retry.State).
	State string
	// Fence is the fencing token of the claim that went stale (0 without
	// Table.Fence); that holder can no longer finish the row.
	Fence int64
	// ClaimedBy is the holder of that claim ("" without Table.ClaimedBy).
	ClaimedBy string
	// ClaimedAt is when that claim was made.
	ClaimedAt time.Time
	// Attempts is the row's attempts count (0 without Table.Attempts).
	Attempts int
	// Reason says why the row was swept, as recorded in Table.Reason when
	// the table has that column, for example "claim: swept: lease
	// expired at 2026-11-29T09:00:05.123456Z (claim by app-1:8103, fence
	// 42, attempt 1)".
	Reason string
}

// Sweeper moves rows stuck in the claimer's To state — their holder died or
// hung — to a failed state, or back to a retry state while attempts remain.
// Each batch is one statement that locks at most BatchSize rows with FOR
// UPDATE SKIP LOCKED and re-checks state and staleness on the locked row,
// so a row finished a moment ago is never overwritten and two sweepers
// never move the same row. All times are database time.
type Sweeper[K any] struct {
	c     *Claimer[K]
	cfg   SweeperConfig[K]
	sql   query
	batch int
}

// NewSweeper returns a sweeper for rows of c's table in c's To state. It
// runs on c's DBTX; give it a pool, so that each batch commits on its own
// (on a transaction, every batch's locks are held until it ends). It
// validates cfg and returns an error naming the first bad field; then,
// unless cfg.SkipVerify is set, it checks the table and the states against
// the database (Sweeper.Verify).
func NewSweeper[K any](c *Claimer[K], cfg SweeperConfig[K]) (*Sweeper[K], error) {
	if c == nil {
		return nil, invalid("NewSweeper: claimer", "must not be nil")
	}
	t := c.c.t
	switch {
	case cfg.Failed == "":
		return nil, invalid("SweeperConfig.Failed", "must not be empty")
	case cfg.Failed == c.c.to:
		return nil, invalid("SweeperConfig.Failed", fmt.Sprintf("must differ from Config.To (%q)", cfg.Failed))
	case cfg.StaleAfter < 0:
		return nil, invalid("SweeperConfig.StaleAfter", "must not be negative")
	case cfg.StaleAfter == 0 && t.leaseUntil == "":
		return nil, invalid("SweeperConfig.StaleAfter", "must be positive (the table has no LeaseUntil column)")
	case cfg.StaleAfter == 0 && c.c.lease == 0:
		return nil, invalid("SweeperConfig.StaleAfter", "must be positive when the claimer's Config.Lease is 0: its claims set Table.LeaseUntil to NULL, so the row of a holder that died would never be swept (sweeping leases set by other claimers: give this claimer their Lease)")
	case cfg.StaleAfter > 0 && cfg.StaleAfter < time.Microsecond:
		return nil, invalid("SweeperConfig.StaleAfter", "must be at least 1µs")
	case cfg.BatchSize <= 0:
		return nil, invalid("SweeperConfig.BatchSize", "must be positive")
	}
	if err := cfg.Retry.check("SweeperConfig.Retry", c.c); err != nil {
		return nil, err
	}
	switch {
	case cfg.FailAfter < 0:
		return nil, invalid("SweeperConfig.FailAfter", "must not be negative")
	case cfg.FailAfter > 0 && cfg.Retry.State == "":
		return nil, invalid("SweeperConfig.Retry.State", "must be set when FailAfter is (without it every stale row goes to Failed)")
	case cfg.FailAfter > 0 && cfg.FailAfter < time.Microsecond:
		return nil, invalid("SweeperConfig.FailAfter", "must be at least 1µs")
	}
	n, err := countParams(cfg.Where)
	if err != nil {
		return nil, invalid("SweeperConfig.Where", strings.TrimPrefix(err.Error(), "claim: Config.Where: "))
	}
	if n != len(cfg.Args) {
		return nil, invalid("SweeperConfig.Args", fmt.Sprintf("Where uses %d parameters, got %d", n, len(cfg.Args)))
	}
	s := &Sweeper[K]{c: c, cfg: cfg, batch: cfg.BatchSize}
	s.build()
	if !cfg.SkipVerify {
		if err := verifyOnNew("NewSweeper", c.c, s.Verify); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Sweep moves every stale row, batch by batch, until a batch comes back
// short, and returns the rows it moved (also passed to OnSwept and logged
// one record each). On error it returns the rows moved so far. Run sweeps
// at once and then periodically, so a service needs Sweep only for a
// one-off sweep, or to wait for the start-up sweep before it starts work
// (see Run).
func (s *Sweeper[K]) Sweep(ctx context.Context) ([]Swept[K], error) {
	var all []Swept[K]
	for {
		batch, err := s.sweepBatch(ctx)
		if err != nil {
			return all, err
		}
		all = append(all, batch...)
		if len(batch) < s.batch {
			return all, nil
		}
	}
}

func (s *Sweeper[K]) sweepBatch(ctx context.Context) ([]Swept[K], error) {
	start := time.Now()
	var out []Swept[K]
	// One statement; above read committed it may meet a row changed after
	// its snapshot (40001), and stmt runs it again at read committed.
	err := s.c.stmt(ctx, func(db DBTX) error {
		out = out[:0]
		rows, err := db.Query(ctx, s.sql.text, s.sql.bind()...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sw Swept[K]
			var attempts int64
			var fence *int64
			var claimedAt *time.Time
			if err := rows.Scan(&sw.Key, &sw.State, &fence, &sw.ClaimedBy, &claimedAt, &attempts, &sw.Reason); err != nil {
				return err
			}
			if fence != nil {
				sw.Fence = *fence
			}
			if claimedAt != nil {
				sw.ClaimedAt = *claimedAt
			}
			sw.Attempts = int(attempts)
			out = append(out, sw)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("claim: Sweep: %w", err)
	}
	took := time.Since(start)
	// One event per state the rows moved to and why they were stale
	// (Event.Reason), each with the records of its rows, in the order the
	// statement returned them.
	type group struct{ state, why string }
	var groups []group
	byGroup := map[group][]record{}
	for _, sw := range out {
		g := group{sw.State, SweptLeaseExpired}
		if !strings.HasPrefix(sw.Reason, "claim: swept: lease expired") {
			g.why = SweptClaimedTooLong
		}
		if _, ok := byGroup[g]; !ok {
			groups = append(groups, g)
		}
		byGroup[g] = append(byGroup[g], rec(slog.LevelWarn, "claim: swept stale row",
			slog.String("table", s.c.c.t.qname), slog.Any("key", sw.Key), slog.String("state", sw.State),
			slog.Int64("fence", sw.Fence), slog.String("claimed_by", sw.ClaimedBy),
			slog.Time("claimed_at", sw.ClaimedAt), slog.Int("attempts", sw.Attempts), slog.String("reason", sw.Reason)))
	}
	for _, g := range groups {
		logs := byGroup[g]
		s.c.c.report(ctx, Event{Kind: EventSwept, State: g.state, Reason: g.why, Rows: len(logs), Duration: took}, logs...)
	}
	if len(out) > 0 && s.cfg.OnSwept != nil {
		s.cfg.OnSwept(ctx, out)
	}
	return out, nil
}

// Run sweeps at once and then every interval until ctx is cancelled, when
// it returns nil. Failed sweeps are logged and retried an interval later;
// a refusal that cannot go away (a privilege the role lacks, a missing
// table or column, a state the table refuses) ends Run with that error,
// naming the GRANT when it is a privilege.
// Each sweep is bounded by the interval, or 10 seconds when that is longer:
// a database that stops answering (a silent network) fails the sweep
// rather than stopping Run (a sweep guards nothing: each batch commits on
// its own and re-checks every row it moves).
// Its first sweep is the start-up sweep: there is no need to call Sweep
// before it. A service that must wait for the start-up sweep before it
// starts work calls Sweep and then Run; Run's own first sweep then finds
// only the rows that went stale in between (usually none) and costs one
// statement.
func (s *Sweeper[K]) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return invalid("Sweeper.Run: every", "must be positive")
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, max(every, cleanupTimeout))
		_, err := s.Sweep(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			if refusedForGood(err) {
				return fmt.Errorf("claim: Sweeper.Run on %s: %w", s.c.c.t.qname, s.explain(ctx, err))
			}
			s.c.c.report(ctx, Event{}, rec(slog.LevelError, "claim: sweep failed",
				slog.String("table", s.c.c.t.qname), slog.Any("error", err)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refusedForGood reports whether a sweep's err cannot go away by retrying.
func refusedForGood(err error) bool { return pgerr.Permanent(err) || permanent(err) }

// explain returns err explained by the catalog (Claimer.explain), within
// cleanupTimeout.
func (s *Sweeper[K]) explain(ctx context.Context, err error) error {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return s.c.explain(ectx, err)
}
