package claim

// Claiming rows: one by its key, or a batch of those claimable.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

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
