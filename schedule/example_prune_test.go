package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

// Prune keeps the ledger small: it deletes finished runs older than an
// age, and refuses one that catch-up could still reach.
func ExampleScheduler_Prune() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx := context.Background()
	pool, err := db.OpenPool(ctx)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	s, err := schedule.New(pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	def := schedule.Definition{Name: "report", Spec: "0 6 * * *", Version: 1, CatchUp: schedule.CatchUpAll, CatchUpWindow: 24 * time.Hour}
	if err := s.Register(ctx, def, func(context.Context, schedule.Run) error { return nil }); err != nil {
		panic(err)
	}

	_, err = s.Prune(ctx, 12*time.Hour)
	fmt.Println(errors.Is(err, schedule.ErrInvalid), err)
	deleted, err := s.Prune(ctx, 30*24*time.Hour)
	fmt.Println(deleted, err)
	// Output:
	// true schedule: olderThan: 12h0m0s is within the catch-up window (24h0m0s) of schedule "report": catch-up could run a pruned instant again
	// 0 <nil>
}

// A running scheduler deletes finished runs older than its Retention (7
// days by default) by itself; a schedule may keep its runs longer, or all
// of them.
func ExampleConfig_retention() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx := context.Background()
	pool, err := db.OpenPool(ctx)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	s, err := schedule.New(pool, schedule.Config{Retention: 30 * 24 * time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	audit := schedule.Definition{Name: "audit-export", Spec: "0 2 * * *", Version: 1, Retention: schedule.KeepRuns}
	if err := s.Register(ctx, audit, func(context.Context, schedule.Run) error { return nil }); err != nil {
		panic(err)
	}
	_, err = schedule.New(pool, schedule.Config{Retention: 10 * time.Minute})
	fmt.Println(err)
	// Output:
	// schedule: Config.Retention: 10m0s is shorter than an hour: keep runs long enough to look at them (or schedule.KeepRuns)
}
