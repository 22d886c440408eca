package claim_test

import (
	"context"
	"fmt"
	"log"
	"sort"
	"time"

	"github.com/pgclaim/pgclaim/claim"
)

// One sweeper for the rule "lease expired: try again; claimed more than a
// day ago: FAILED", without a Where clause.
func ExampleSweeperConfig_failAfter() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	// Workers claim with a lease and extend it while they work.
	c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING", Lease: 5 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	// Push 1: its holder died a moment ago (the lease has passed).
	// Push 2: claimed two days ago, its lease has passed.
	// Push 3: claimed two days ago, its holder is still extending the lease.
	_, err = pool.Exec(ctx, `UPDATE push_requests
		SET status = 'PROCESSING', claimed_by = 'app-1:8101', fence = 40 + id, attempts = 1,
		    claimed_at = CASE WHEN id = 1 THEN now() - interval '10 minutes' ELSE now() - interval '2 days' END,
		    lease_until = CASE WHEN id = 3 THEN now() + interval '5 minutes' ELSE now() - interval '1 minute' END
		WHERE id IN (1, 2, 3)`)
	if err != nil {
		log.Fatal(err)
	}

	s, err := claim.NewSweeper(c, claim.SweeperConfig[int64]{
		// StaleAfter zero: a row is stale when its lease has passed.
		Failed:    "FAILED",
		Retry:     claim.RetryPolicy{State: "PAUSED", MaxAttempts: 5},
		FailAfter: 24 * time.Hour,
		BatchSize: 1000,
	})
	if err != nil {
		log.Fatal(err)
	}
	swept, err := s.Sweep(ctx)
	if err != nil {
		log.Fatal(err)
	}
	sort.Slice(swept, func(i, j int) bool { return swept[i].Key < swept[j].Key })
	for _, r := range swept {
		fmt.Printf("push %d -> %s\n", r.Key, r.State)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM push_requests WHERE id = 3`).Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("push 3 is", status)
	// Output:
	// push 1 -> PAUSED
	// push 2 -> FAILED
	// push 3 is PROCESSING
}
