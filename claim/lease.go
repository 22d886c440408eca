package claim

// A claim's lease: extending it, the workers' heartbeat, and giving a
// claim back.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

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
