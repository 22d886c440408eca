package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

// A test runs "the 09:00 Seoul job" for the 09:00 it chooses, now, instead
// of waiting for 09:00: a scheduled run, through the ledger and the
// schedule's lock as the scheduler's own. Asking again for the same
// instant runs nothing; an instant the spec does not have is refused.
func ExampleScheduler_RunAt() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx := context.Background()

	s, _ := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	def := schedule.Definition{Name: "push-resume", Spec: "0 9 * * *", TimeZone: "Asia/Seoul", Version: 1}
	err := s.Register(ctx, def, func(ctx context.Context, run schedule.Run) error {
		fmt.Println("job:", run.Instant.Format(time.RFC3339), run.Kind, "attempt", run.Attempt)
		return nil
	})
	if err != nil {
		panic(err)
	}

	seoul, _ := time.LoadLocation("Asia/Seoul")
	nine := time.Date(2027, 1, 4, 9, 0, 0, 0, seoul)
	rec, err := s.RunAt(ctx, "push-resume", nine)
	fmt.Println("recorded:", rec.Kind, rec.State, "attempt", rec.Attempt, "error", err)

	_, err = s.RunAt(ctx, "push-resume", nine)
	fmt.Println("again:", errors.Is(err, schedule.ErrRecorded))

	_, err = s.RunAt(ctx, "push-resume", nine.Add(30*time.Minute))
	fmt.Println(err)
	// Output:
	// job: 2027-01-04T00:00:00Z scheduled attempt 1
	// recorded: scheduled succeeded attempt 1 error <nil>
	// again: true
	// schedule: instant: 2027-01-04T09:30:00+09:00 is not an instant of 0 9 * * * (Asia/Seoul): the nearest are 2027-01-04T09:00:00+09:00 (2027-01-04T00:00:00Z) before and 2027-01-05T09:00:00+09:00 (2027-01-05T00:00:00Z) after
}

// A test of a service whose scheduler runs waits for the run of the next
// instant, and for a triggered run, rather than sleep.
func ExampleScheduler_WaitRun() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The service: a scheduler running a schedule due every second.
	s, _ := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	// Every instant runs, however late a loaded machine wakes the runner.
	def := schedule.Definition{Name: "heartbeat", Spec: "* * * * * *", TimeZone: "UTC", Version: 1,
		CatchUp: schedule.CatchUpAll, Overlap: schedule.OverlapBufferAll}
	if err := s.Register(ctx, def, func(context.Context, schedule.Run) error { return nil }); err != nil {
		panic(err)
	}
	stopped := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	go func() { defer close(stopped); _ = s.Run(runCtx) }()
	defer func() { stop(); <-stopped }()

	// The test.
	st, _ := s.Status(ctx, "heartbeat")
	rec, err := s.WaitRun(ctx, "heartbeat", st.NextDue)
	fmt.Println("next instant:", rec.Kind, rec.State, err)

	instant, _, _ := s.Trigger(ctx, "heartbeat")
	rec, err = s.WaitRun(ctx, "heartbeat", instant)
	fmt.Println("triggered:", rec.Kind, rec.State, err)
	// Output:
	// next instant: scheduled succeeded <nil>
	// triggered: triggered succeeded <nil>
}
