package pgclaim_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/cronx/robfig"
	"github.com/pgclaim/pgclaim/gate"
)

// Every instance migrates at start-up; concurrent calls are safe.
func ExampleMigrate() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgclaim.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	status, err := pgclaim.MigrationStatus(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range status {
		fmt.Println(m.Version, m.Name, m.Applied)
	}
}

// A service embedding pgclaim: migrate and sweep at start-up on every
// instance, resume paused pushes once per 09:00 tick across all instances,
// and write each push's effect in the transaction that finishes its claim.
// This is the README's quickstart.
func Example_service() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, pool); err != nil { // every instance, at start-up
		log.Fatal(err)
	}
	pushes, err := claim.New[int64](pool, claim.Table{Name: "push_requests", Key: "id", State: "status",
		ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence", Attempts: "attempts"},
		claim.Options{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		log.Fatal(err)
	}
	sweeper, _ := claim.NewSweeper(pushes, claim.SweeperConfig[int64]{StaleAfter: 24 * time.Hour, Failed: "FAILED", BatchSize: 1000})
	if _, err := sweeper.Sweep(ctx); err != nil { // start-up clean-up, on every instance
		log.Fatal(err)
	}
	worker, _ := claim.NewWorker(pushes, claim.WorkerConfig[int64]{Done: "SENT", Failed: "FAILED", BatchSize: 100,
		Work: func(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error {
			_, err := tx.Exec(ctx, "INSERT INTO sent_pushes (push_id, fence) VALUES ($1, $2)", c.Key, c.Token)
			return err // committed with the move to SENT, or not at all
		}})
	g, _ := gate.New(pool, gate.Config{})
	sched, _ := cron.ParseStandard("CRON_TZ=Asia/Seoul 0 9 * * *") // a spec without CRON_TZ needs robfig.Options.Location
	job, err := robfig.NewJob(g, "push-resume", sched, func(ctx context.Context, run gate.Run) error {
		_, err := worker.Drain(ctx) // once per 09:00 tick, across all instances
		return err
	}, robfig.Options{})
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New()
	c.Schedule(sched, job)
	c.Run()
}
