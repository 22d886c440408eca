package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

// An operator's tool builds a Scheduler that registers nothing, looks at
// a schedule, and backfills a week of its instants: a dry run first, then
// for real; a second backfill of the same range records nothing again.
func ExampleScheduler_Backfill() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx := context.Background()

	// The service registered the schedule.
	svc, _ := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	def := schedule.Definition{Name: "report", Spec: "0 6 * * *", TimeZone: "UTC", Version: 1}
	if err := svc.Register(ctx, def, func(context.Context, schedule.Run) error { return nil }); err != nil {
		panic(err)
	}

	op, _ := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	st, _ := op.Status(ctx, "report")
	fmt.Println(st.Name, st.Spec, st.TimeZone, "version", st.Version, "last run:", st.Last)

	week := schedule.BackfillOptions{
		From: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
		To:   time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC),
		Max:  5,
	}
	dry := week
	dry.DryRun = true
	res, _ := op.Backfill(ctx, "report", dry)
	fmt.Println("would record", len(res.Instants), "from", res.Instants[0].Format(time.DateTime), "; left out", res.LeftOut)
	res, _ = op.Backfill(ctx, "report", week)
	fmt.Println("recorded", len(res.Instants), "; left out", res.LeftOut)
	res, _ = op.Backfill(ctx, "report", week)
	fmt.Println("recorded", len(res.Instants), "from", res.Instants[0].Format(time.DateTime), "; present", res.Present)
	// Output:
	// report 0 6 * * * UTC version 1 last run: <nil>
	// would record 5 from 2026-03-01 06:00:00 ; left out 2
	// recorded 5 ; left out 2
	// recorded 2 from 2026-03-06 06:00:00 ; present 5
}
