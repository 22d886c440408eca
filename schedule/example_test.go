package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// Two instances of a service run the same scheduler over the schedule
// stored in the database; an operator triggers a run, which one of them
// runs, once.
func Example() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stopped sync.WaitGroup
	defer stopped.Wait()
	defer cancel()

	ran := make(chan schedule.Run) // the job waits until the example reads
	resume := func(ctx context.Context, run schedule.Run) error {
		// Do the work through claims, or idempotently keyed by run.Instant;
		// run.Fence orders attempts.
		ran <- run
		return nil
	}
	def := schedule.Definition{
		Name:     "push-resume",
		Spec:     "0 9 * * *", // 09:00 every day
		TimeZone: "Europe/Berlin",
		Version:  1,
		CatchUp:  schedule.CatchUpLatest,
		Retry:    schedule.RetryPolicy{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute},
	}
	var instances []*schedule.Scheduler
	for _, holder := range []string{"active", "standby"} {
		pool, err := db.OpenPool(ctx)
		if err != nil {
			panic(err)
		}
		s, err := schedule.New(pool, schedule.Config{Holder: holder, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			panic(err)
		}
		if err := s.Register(ctx, def, resume); err != nil {
			panic(err)
		}
		stopped.Add(1)
		go func() { defer stopped.Done(); _ = s.Run(ctx) }()
		instances = append(instances, s)
	}

	// An operator asks for a run now, twice: one run.
	first, created, _ := instances[0].Trigger(ctx, "push-resume")
	again, createdAgain, _ := instances[1].Trigger(ctx, "push-resume")
	fmt.Println("same run:", first.Equal(again), created, createdAgain)
	run := <-ran
	fmt.Println(run.Schedule, run.Kind, "attempt", run.Attempt)
	// Output:
	// same run: true true false
	// push-resume triggered attempt 1
}

// exampleDatabase gives the example a database with pgclaim's schema.
func exampleDatabase() (*pgtest.Database, func()) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		panic(err)
	}
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		panic(err)
	}
	return db, func() {
		_ = db.Drop(ctx)
		_ = srv.Close()
	}
}
