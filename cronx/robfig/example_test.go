package robfig_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/robfig"
	"github.com/pgclaim/pgclaim/gate"
)

// Every instance of the service runs this at start-up: the 09:00 job then
// runs once a day across all of them, and a day missed while every instance
// was down is caught up once.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app") // migrated with pgclaim.Migrate
	if err != nil {
		log.Fatal(err)
	}
	g, err := gate.New(pool, gate.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()

	sched, err := cron.ParseStandard("CRON_TZ=Asia/Seoul 0 9 * * *")
	if err != nil {
		log.Fatal(err)
	}
	job, err := robfig.NewJob(g, "push-resume", sched, func(ctx context.Context, run gate.Run) error {
		fmt.Println("resuming paused pushes for", run.FireAt, "with fence", run.Fence)
		return nil
	}, robfig.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := job.CatchUp(ctx, 6*time.Hour); err != nil && !errors.Is(err, gate.ErrSkipped) {
		log.Print(err)
	}

	c := cron.New()
	c.Schedule(sched, job)
	c.Start()
	defer func() { <-c.Stop().Done() }()
	// … serve …
}

// Wrap fits an existing cron.Job, here alongside robfig/cron's own
// wrappers.
func ExampleWrap() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	g, err := gate.New(pool, gate.Config{Holder: "app-1"})
	if err != nil {
		log.Fatal(err)
	}
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New(cron.WithLocation(newYork))
	// No CRON_TZ: the cron reads the spec in its location; so does the job.
	sched, err := cron.ParseStandard("30 8 * * 1-5")
	if err != nil {
		log.Fatal(err)
	}
	once, err := robfig.Wrap(g, "report", sched, robfig.Config{Location: c.Location()})
	if err != nil {
		log.Fatal(err)
	}
	c.Schedule(sched, cron.NewChain(cron.Recover(cron.DefaultLogger), once).Then(cron.FuncJob(func() {
		fmt.Println("sending the report")
	})))
	c.Start()
}
