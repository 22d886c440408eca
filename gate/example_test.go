package gate_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

var exampleServer struct {
	once sync.Once
	srv  *pgtest.Server
	err  error
}

// examplePool returns a pool on a fresh, migrated database of a throwaway
// server, for the examples. Applications pass their own *pgxpool.Pool, on a
// database migrated with pgclaim.Migrate.
func examplePool() *pgxpool.Pool {
	ctx := context.Background()
	exampleServer.once.Do(func() { exampleServer.srv, exampleServer.err = pgtest.Start(ctx) })
	if exampleServer.err != nil {
		log.Fatal(exampleServer.err)
	}
	db, err := exampleServer.srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		log.Fatal(err)
	}
	return db.Pool
}

// Active and Standby both fire the 09:00 job. Each computes the same
// instant from the schedule; the first to claim it runs the job, the other
// skips.
func ExampleGate_Once() {
	ctx := context.Background()
	pool := examplePool()

	newInstance := func(holder string) *gate.Gate {
		g, err := gate.New(pool, gate.Config{Holder: holder})
		if err != nil {
			log.Fatal(err)
		}
		return g
	}
	active, standby := newInstance("app-1:8101"), newInstance("app-2:8103")
	defer active.Close()
	defer standby.Close()

	fireAt := time.Now().Truncate(time.Second) // the instant the schedule gave both
	for _, g := range []*gate.Gate{active, standby} {
		err := g.Once(ctx, "push-resume", fireAt, func(ctx context.Context, run gate.Run) error {
			fmt.Println(run.Holder, "resumes paused pushes; fenced:", run.Fence > 0)
			return nil
		})
		switch {
		case errors.Is(err, gate.ErrSkipped):
			fmt.Println(g.Holder(), "skips: the tick has run")
		case err != nil:
			log.Fatal(err)
		}
	}
	// Output:
	// app-1:8101 resumes paused pushes; fenced: true
	// app-2:8103 skips: the tick has run
}

// everyHour is a Schedule; a robfig/cron v3 cron.Schedule works the same.
type everyHour struct{}

func (everyHour) Next(t time.Time) time.Time { return t.Truncate(time.Hour).Add(time.Hour) }

// At start-up each instance catches up the latest tick missed while all
// were down, within the last day. Only one runs it.
func ExampleGate_CatchUp() {
	ctx := context.Background()
	pool := examplePool()
	for _, holder := range []string{"app-1:8101", "app-2:8103"} {
		g, err := gate.New(pool, gate.Config{Holder: holder})
		if err != nil {
			log.Fatal(err)
		}
		err = g.CatchUp(ctx, "hourly-report", everyHour{}, 24*time.Hour, func(ctx context.Context, run gate.Run) error {
			fmt.Println(run.Holder, "catches up the latest hour; on the hour:", run.FireAt.Equal(run.FireAt.Truncate(time.Hour)))
			return nil
		})
		if errors.Is(err, gate.ErrSkipped) {
			fmt.Println(holder, "finds nothing to catch up")
		} else if err != nil {
			log.Fatal(err)
		}
		g.Close()
	}
	// Output:
	// app-1:8101 catches up the latest hour; on the hour: true
	// app-2:8103 finds nothing to catch up
}

// Exclusive keeps a job from running twice at once, whatever triggers it.
// The lock lives on a dedicated, watched connection: if that session is
// lost, the job's context is cancelled.
func ExampleGate_Exclusive() {
	ctx := context.Background()
	pool := examplePool()
	a, err := gate.New(pool, gate.Config{Holder: "app-1:8101"})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := gate.New(pool, gate.Config{Holder: "app-2:8103"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	err = a.Exclusive(ctx, "stale-sweep", func(ctx context.Context, run gate.Run) error {
		fmt.Println(run.Holder, "sweeps")
		err := b.Exclusive(ctx, "stale-sweep", func(context.Context, gate.Run) error { return nil })
		fmt.Println("app-2:8103 meanwhile:", errors.Is(err, gate.ErrHeld))
		return nil
	})
	fmt.Println("app-1:8101 done:", err)
	// Output:
	// app-1:8101 sweeps
	// app-2:8103 meanwhile: true
	// app-1:8101 done: <nil>
}

// The advisory lock key of a job is fixed by its name, in every version.
func ExampleAdvisoryKey() {
	class, key := gate.AdvisoryKey("push-resume")
	fmt.Println(class, key)
	// Output:
	// 1885823852 171899491
}

// Hooks feed metrics: count acquisitions, skips, losses and outcomes.
func ExampleHooksFunc() {
	ctx := context.Background()
	pool := examplePool()
	hooks := gate.HooksFunc(func(_ context.Context, e gate.Event) {
		switch e.Kind {
		case gate.EventFinished:
			fmt.Println(e.Kind, e.Name, e.Outcome)
		default:
			fmt.Println(e.Kind, e.Name)
		}
	})
	g, err := gate.New(pool, gate.Config{Hooks: hooks})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	at := time.Now().Truncate(time.Second)
	job := func(context.Context, gate.Run) error { return errors.New("upstream down") }
	_ = g.Once(ctx, "sync", at, job)
	_ = g.Once(ctx, "sync", at, job)
	// Output:
	// acquired sync
	// finished sync failed
	// skipped sync
}
