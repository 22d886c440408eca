package pgclaim_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/cronx/robfig"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

var (
	srvOnce sync.Once
	srv     *pgtest.Server
)

// exampleDB returns a pool on a throwaway, empty database; in an
// application this is your pool on the service's database.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	srvOnce.Do(func() {
		var err error
		if srv, err = pgtest.Start(ctx); err != nil {
			log.Fatal(err)
		}
	})
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "example_empty", Unmigrated: true})
	if err != nil {
		log.Fatal(err)
	}
	return db.Pool, func() { _ = db.Drop(ctx) }
}

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

// A service applies its own goose migrations beside pgclaim's, at start-up
// in every instance: its own version table and lock key, so neither set of
// migrations sees the other and instances starting together apply each
// file once. In a service the files are embedded:
//
//	//go:embed migrations/*.sql
//	var files embed.FS
//	appMigrations, _ := fs.Sub(files, "migrations")
func ExampleMigrateFS() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	appMigrations := fstest.MapFS{
		"00001_push_requests.sql": {Data: []byte(`-- +goose Up
CREATE TABLE push_requests (id bigint PRIMARY KEY, status text NOT NULL);
-- +goose Down
DROP TABLE push_requests;`)},
		"00002_sent_pushes.sql": {Data: []byte(`-- +goose Up
CREATE TABLE sent_pushes (push_id bigint PRIMARY KEY, fence bigint NOT NULL);
-- +goose Down
DROP TABLE sent_pushes;`)},
	}
	opts := pgclaim.MigrateOptions{
		Table:  "pushes_schema_version", // not goose_db_version, not pgclaim's
		LockID: 0x707573686573,          // "pushes": a key of the service's own
	}

	if err := pgclaim.Migrate(ctx, pool); err != nil { // pgclaim's tables first
		log.Fatal(err)
	}
	applied, err := pgclaim.MigrateFS(ctx, pool, appMigrations, opts)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range applied {
		fmt.Println("applied", m.Version, m.Name)
	}
	// The next start-up finds nothing pending.
	applied, err = pgclaim.MigrateFS(ctx, pool, appMigrations, opts)
	fmt.Println("next start-up applies", len(applied), err)

	_, err = pgclaim.MigrateFS(ctx, pool, appMigrations, pgclaim.MigrateOptions{Table: "pushes_schema_version"})
	fmt.Println(err)
	// Output:
	// applied 1 00001_push_requests.sql
	// applied 2 00002_sent_pushes.sql
	// next start-up applies 0 <nil>
	// pgclaim: MigrateOptions.LockID: must not be zero: pick a key of your own
}

// A service embedding pgclaim: migrate and sweep at start-up on every
// instance, resume paused pushes once per 09:00 tick across all instances,
// and write each push's effect in the transaction that finishes its claim.
// This is the cron-adapter variant (gate + robfig/cron, at most once per
// tick) of the README's Quickstart, which runs the job on package schedule
// (exactly once per instant); docs/gates.md compares the two.
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
		claim.Config{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		log.Fatal(err)
	}
	// NewSweeper and NewWorker check the table and its states: build them
	// after the migrations.
	sweeper, err := claim.NewSweeper(pushes, claim.SweeperConfig[int64]{StaleAfter: 24 * time.Hour, Failed: "FAILED", BatchSize: 1000})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sweeper.Sweep(ctx); err != nil { // start-up clean-up, on every instance
		log.Fatal(err)
	}
	worker, err := claim.NewWorker(pushes, claim.WorkerConfig[int64]{Done: "SENT", Failed: "FAILED", BatchSize: 100,
		Work: func(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error {
			_, err := tx.Exec(ctx, "INSERT INTO sent_pushes (push_id, fence) VALUES ($1, $2)", c.Key, c.Fence)
			return err // committed with the move to SENT, or not at all
		}})
	if err != nil {
		log.Fatal(err)
	}
	g, err := gate.New(pool, gate.Config{})
	if err != nil {
		log.Fatal(err)
	}
	sched, err := cron.ParseStandard("CRON_TZ=Asia/Seoul 0 9 * * *") // a spec without CRON_TZ needs robfig.Config.Location
	if err != nil {
		log.Fatal(err)
	}
	job, err := robfig.NewJob(g, "push-resume", sched, func(ctx context.Context, run gate.Run) error {
		_, err := worker.Drain(ctx) // once per 09:00 tick, across all instances
		return err
	}, robfig.Config{})
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New()
	c.Schedule(sched, job)
	c.Run()
}
