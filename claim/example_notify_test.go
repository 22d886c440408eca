package claim_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/claim"
)

// A worker that would poll once an hour starts a push the moment the API
// inserts it: the table's trigger announces the row at the INSERT's commit.
// A producer writing to a table without the trigger announces its rows with
// claim.Notify in its own transaction.
func ExampleNotify() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `DELETE FROM push_requests`); err != nil {
		log.Fatal(err)
	}

	// Once, as the table's owner, in the application's migration.
	if _, err := pool.Exec(ctx, `SELECT pgclaim_notify_on('push_requests'::regclass, 'status', 'PAUSED')`); err != nil {
		log.Fatal(err)
	}

	c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING", Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	started := make(chan int64)
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{
		Work: func(ctx context.Context, tx pgx.Tx, cl claim.Claim[int64]) error {
			started <- cl.Key
			return nil
		},
		Done: "SENT", Failed: "FAILED", BatchSize: 10,
		PollInterval: time.Hour, // the safety net; the announcement is what starts work
	})
	if err != nil {
		log.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _, _ = w.Run(wctx) }()
	defer func() { stop(); <-ran }()
	time.Sleep(200 * time.Millisecond) // the worker has found nothing and waits

	// The API's INSERT, from any code: the trigger announces it.
	if _, err := pool.Exec(ctx, `INSERT INTO push_requests (id, status) VALUES (1, 'PAUSED')`); err != nil {
		log.Fatal(err)
	}
	fmt.Println("started push", <-started)

	// A producer announcing its own rows, at its transaction's commit.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO push_requests (id, status) VALUES (2, 'PAUSED')`); err != nil {
			return err
		}
		return claim.Notify(ctx, tx, "push_requests", "PAUSED")
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("started push", <-started)
	// Output:
	// started push 1
	// started push 2
}
