package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/claim"
)

// NewWorker checks every state against the state column: a Done state its
// CHECK constraint rejects fails here, naming the field, instead of rolling
// back every finished claim. A missing partial index is only a warning.
func ExampleWorker_Verify() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	_, err := pool.Exec(ctx, `ALTER TABLE push_requests ADD CONSTRAINT push_status_check
		CHECK (status IN ('PAUSED', 'PROCESSING', 'SENT', 'FAILED'))`)
	if err != nil {
		log.Fatal(err)
	}

	c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		log.Fatal(err)
	}
	work := func(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error { return nil }
	_, err = claim.NewWorker(c, claim.WorkerConfig[int64]{Work: work, Done: "DONE", Failed: "FAILED", BatchSize: 100})
	fmt.Println(errors.Is(err, claim.ErrInvalid), err)

	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{Work: work, Done: "SENT", Failed: "FAILED", BatchSize: 100})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP INDEX push_requests_paused_idx`); err != nil {
		log.Fatal(err)
	}
	err = w.Verify(ctx)
	fmt.Println(errors.Is(err, claim.ErrMissingIndex), errors.Is(err, claim.ErrInvalid))
	// Output:
	// true claim: WorkerConfig.Done: state "DONE" is rejected by CHECK constraint "push_status_check" of table "push_requests" on column "status" (allowed: PAUSED, PROCESSING, SENT, FAILED)
	// true false
}
