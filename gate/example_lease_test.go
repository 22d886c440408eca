package gate_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// Two instances run the same job under one lease: the first runs it with a
// fencing token, the second finds the lease held and skips. Released after a
// fast run, the lease stays held for AtLeast, so an instance that fires a
// moment later skips as well.
func ExampleLease_Do() {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx) // a throwaway server; use your own pool
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Drop(ctx)

	newInstance := func(holder string) *gate.Lease {
		l, err := gate.NewLease(db.Pool, "push-resume", gate.LeaseConfig{
			AtMost:  time.Minute,     // a crashed holder blocks the job at most this long
			AtLeast: 5 * time.Second, // a fast run still keeps the lease this long
			Holder:  holder,
		})
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	active, standby := newInstance("app-1:8101"), newInstance("app-2:8103")

	err = active.Do(ctx, func(ctx context.Context, run gate.Run) error {
		fmt.Println(run.Holder, "resumes pushes; fenced:", run.Fence > 0)
		err := standby.Do(ctx, func(context.Context, gate.Run) error { return nil })
		fmt.Println("meanwhile", "app-2:8103", "skips:", errors.Is(err, gate.ErrSkipped))
		return nil
	})
	fmt.Println("active:", err)
	err = standby.Do(ctx, func(context.Context, gate.Run) error { return nil })
	fmt.Println("just after the run, app-2:8103 skips:", errors.Is(err, gate.ErrHeld))
	// Output:
	// app-1:8101 resumes pushes; fenced: true
	// meanwhile app-2:8103 skips: true
	// active: <nil>
	// just after the run, app-2:8103 skips: true
}

// Active/Standby: every instance runs the scheduler under Run; only the
// leader's runs, and when it dies a standby takes over. Leadership ends with
// the context handed to the function.
func ExampleElector_Run() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app") // migrated with pgclaim.Migrate
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	e, err := gate.NewElector(pool, "scheduler", gate.ElectorConfig{TTL: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	err = e.Run(ctx, func(leaderCtx context.Context, run gate.Run) error {
		log.Printf("%s leads (fence %d)", run.Holder, run.Fence)
		// start the scheduler here …
		<-leaderCtx.Done() // resigned, lost, or shutting down
		// … and stop it here.
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Print(err)
	}
}
