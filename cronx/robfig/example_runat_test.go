package robfig_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/robfig"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// A test fires the 09:00 job for yesterday's 09:00 without waiting for the
// clock: the run goes through the gate like a fired one, once per instant.
func ExampleJob_RunAt() {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx) // a throwaway server; a test uses its own database
	if err != nil {
		log.Fatal(err)
	}
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		log.Fatal(err)
	}
	// The gate refuses instants further from database time than its skew
	// tolerance; a test firing yesterday's instant allows two days.
	g, err := gate.New(db.Pool, gate.Config{SkewTolerance: 48 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()

	seoul, err := time.LoadLocation("Asia/Seoul")
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New(cron.WithLocation(seoul))
	sched, err := cron.ParseStandard("0 9 * * *")
	if err != nil {
		log.Fatal(err)
	}
	job, err := robfig.NewJob(g, "push-resume", sched, func(ctx context.Context, run gate.Run) error {
		fmt.Println("resuming pushes for", run.FireAt.In(seoul).Format("15:04 MST"))
		return nil
	}, robfig.Config{Location: c.Location()})
	if err != nil {
		log.Fatal(err)
	}

	y := time.Now().In(seoul).AddDate(0, 0, -1)
	yesterday := time.Date(y.Year(), y.Month(), y.Day(), 9, 0, 0, 0, seoul)
	if err := job.RunAt(ctx, yesterday); err != nil {
		log.Fatal(err)
	}
	err = job.RunAt(ctx, yesterday)
	fmt.Println("again: skipped:", errors.Is(err, gate.ErrSkipped))
	err = job.RunAt(ctx, yesterday.Add(time.Minute))
	fmt.Println("09:01: not an instant of the schedule:", errors.Is(err, gate.ErrInvalid))
	// Output:
	// resuming pushes for 09:00 KST
	// again: skipped: true
	// 09:01: not an instant of the schedule: true
}
