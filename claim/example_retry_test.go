package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/claim"
)

// A push whose upstream keeps failing goes back to PAUSED, claimable again a
// minute after its first failure and two minutes after its second; its
// third failure is final. The sweeper takes the same policy for rows whose
// holder died, so such a row waits the same way.
func ExampleRetryPolicy() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	// Waiting rows need a RetryAt column.
	if _, err := pool.Exec(ctx, `ALTER TABLE push_requests ADD COLUMN retry_at timestamptz`); err != nil {
		log.Fatal(err)
	}
	tbl := pushes
	tbl.RetryAt = "retry_at"
	c, err := claim.New[int64](pool, tbl, claim.Config{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		log.Fatal(err)
	}

	retry := claim.RetryPolicy{State: "PAUSED", MaxAttempts: 3, Backoff: time.Minute, MaxBackoff: time.Hour}
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{
		Work: func(ctx context.Context, tx pgx.Tx, cl claim.Claim[int64]) error {
			if cl.Key == 2 {
				return errors.New("upstream 503")
			}
			return nil
		},
		Done: "SENT", Failed: "FAILED", Retry: retry, BatchSize: 10,
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := claim.NewSweeper(c, claim.SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: retry, BatchSize: 1000}); err != nil {
		log.Fatal(err)
	}

	for {
		if _, err := w.Drain(ctx); err != nil {
			log.Fatal(err)
		}
		var status string
		var attempts int
		var wait time.Duration
		err := pool.QueryRow(ctx, `SELECT status, attempts, coalesce(retry_at - claimed_at, '0')
			FROM push_requests WHERE id = 2`).Scan(&status, &attempts, &wait)
		if err != nil {
			log.Fatal(err)
		}
		if status != "PAUSED" {
			fmt.Printf("attempt %d failed: %s\n", attempts, status)
			break
		}
		fmt.Printf("attempt %d failed: %s, claimable %v after the claim\n", attempts, status, wait.Truncate(time.Minute))
		// The wait passes.
		if _, err := pool.Exec(ctx, `UPDATE push_requests SET retry_at = now() WHERE id = 2`); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// attempt 1 failed: PAUSED, claimable 1m0s after the claim
	// attempt 2 failed: PAUSED, claimable 2m0s after the claim
	// attempt 3 failed: FAILED
}
