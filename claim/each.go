package claim

import (
	"context"
	"errors"
	"fmt"
)

// Stats counts what a worker loop or Each did.
type Stats struct {
	// Claimed is the number of rows this caller claimed.
	Claimed int
	// Skipped is the number of candidates another holder claimed first
	// (Each only).
	Skipped int
	// Succeeded is the number of claims whose work succeeded and whose
	// finish committed.
	Succeeded int
	// Failed is the number of claims whose work failed (or panicked): the
	// Worker moved them to its Failed state; Each returns their errors.
	Failed int
	// Retried is the number of failed claims moved to Retry.State
	// because attempts remained.
	Retried int
	// Lost is the number of claims found lost before they could be
	// finished (swept or reclaimed meanwhile); their effects were rolled
	// back.
	Lost int
	// Released is the number of claims given back unfinished on shutdown.
	Released int
	// Unrecorded is the number of claims (Worker only) whose outcome could
	// not be written: recording a failure (the move to Failed or Retry.State) or
	// a release failed. Each such row stays in To under its claim until a
	// Sweeper moves it, and each is logged; when the cause cannot go away,
	// Run and Drain also return an error (see Worker.Run).
	Unrecorded int
}

// Each is the compare-and-swap loop for callers whose claim statement is
// their own (typically an sqlc-generated :execrows method such as
// "UPDATE push SET status = 'PROCESSING' WHERE id = $1 AND status = 'PAUSED'").
// For every key in order, it calls cas; 1 row affected means this caller won
// the row and work runs, 0 means another holder won and the key is
// skipped. Each stops at the first cas error (or when ctx is done) and
// returns it with the counts so far; more than one row affected is reported
// as an error, since the key is then not unique. Errors from work are
// counted in Stats.Failed and returned joined, each naming its key, after
// the loop has gone through every key.
func Each[K any](ctx context.Context, keys []K, cas func(context.Context, K) (int64, error), work func(context.Context, K) error) (Stats, error) {
	var st Stats
	if cas == nil {
		return st, invalid("Each: cas", "must not be nil")
	}
	if work == nil {
		return st, invalid("Each: work", "must not be nil")
	}
	var werrs []error
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return st, errors.Join(append(werrs, err)...)
		}
		n, err := cas(ctx, k)
		if err != nil {
			return st, errors.Join(append(werrs, fmt.Errorf("claim: Each: key %v: %w", k, err))...)
		}
		switch n {
		case 0:
			st.Skipped++
			continue
		case 1:
			st.Claimed++
		default:
			return st, errors.Join(append(werrs, fmt.Errorf("claim: Each: key %v: compare-and-swap changed %d rows; the key must be unique", k, n))...)
		}
		if err := callWork(func() error { return work(ctx, k) }); err != nil {
			st.Failed++
			werrs = append(werrs, fmt.Errorf("claim: Each: key %v: %w", k, err))
			continue
		}
		st.Succeeded++
	}
	return st, errors.Join(werrs...)
}
