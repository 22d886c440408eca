package gocron_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	pggocron "github.com/pgclaim/pgclaim/cronx/gocron"
	"github.com/pgclaim/pgclaim/gate"
)

// Every instance of the service runs this at start-up. The 09:00 job goes
// through the tick ledger and runs once a day across all instances.
func ExampleNewTask() {
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

	const crontab = "0 9 * * *"
	seoul, err := time.LoadLocation("Asia/Seoul")
	if err != nil {
		log.Fatal(err)
	}
	sched, err := pggocron.CronSchedule(crontab, false, seoul)
	if err != nil {
		log.Fatal(err)
	}
	task, err := pggocron.NewTask(g, "push-resume", sched, func(ctx context.Context, run gate.Run) error {
		fmt.Println("resuming paused pushes for", run.FireAt, "with fence", run.Fence)
		return nil
	}, pggocron.TaskConfig{})
	if err != nil {
		log.Fatal(err)
	}

	s, err := gocron.NewScheduler(gocron.WithLocation(seoul))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob(crontab, false), task, gocron.WithName("push-resume")); err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer func() { _ = s.Shutdown() }()
	// … serve …
}

// A scheduler-wide Locker: each job holds a lease named after it while it
// runs, and for at least two seconds after it started, so an instance
// whose clock is up to two seconds late finds it held.
func ExampleLocker() {
	pool, err := pgxpool.New(context.Background(), "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	locker, err := pggocron.NewLocker(pool, gate.LeaseConfig{AtMost: time.Minute, AtLeast: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() {
		fmt.Println("refreshing the cache")
	}), gocron.WithName("cache-refresh")); err != nil {
		log.Fatal(err)
	}
	s.Start()
}

// Active/Standby: only the leader's scheduler runs jobs; a standby takes
// over when the leader stops or loses its connection.
func ExampleElector() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	ge, err := gate.NewElector(pool, "scheduler", gate.ElectorConfig{})
	if err != nil {
		log.Fatal(err)
	}
	elector, err := pggocron.NewElector(ge)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = elector.Run(ctx) }()

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.DurationJob(10*time.Second), gocron.NewTask(func() {
		fmt.Println("sweeping")
	}), gocron.WithName("sweep")); err != nil {
		log.Fatal(err)
	}
	s.Start()
}
