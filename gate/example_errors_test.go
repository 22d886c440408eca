package gate_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgclaim/pgclaim/gate"
)

// A run of the 12:00 tick is still going at 12:01: the 12:01 tick is
// skipped, and the error says which run holds the job's lock.
func ExampleHeldError() {
	ctx := context.Background()
	pool := examplePool()
	newInstance := func(holder string) *gate.Gate {
		g, err := gate.New(pool, gate.Config{SkewTolerance: 5 * time.Minute, Holder: holder})
		if err != nil {
			log.Fatal(err)
		}
		return g
	}
	a, b := newInstance("app-1:8101"), newInstance("app-2:8103")
	defer a.Close()
	defer b.Close()

	noon := time.Now().Truncate(time.Minute)
	err := a.Once(ctx, "report", noon, func(ctx context.Context, run gate.Run) error {
		err := b.Once(ctx, "report", noon.Add(time.Minute), func(context.Context, gate.Run) error { return nil })
		var held *gate.HeldError
		if errors.As(err, &held) {
			fmt.Println("skipped:", held.Name, held.FireAt.Equal(noon.Add(time.Minute)))
			fmt.Println("held by:", held.Holder, "running the tick of", held.HolderFireAt.Equal(noon))
			fmt.Println("ErrHeld:", errors.Is(err, gate.ErrHeld), "ErrSkipped:", errors.Is(err, gate.ErrSkipped))
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// skipped: report true
	// held by: app-1:8101 running the tick of true
	// ErrHeld: true ErrSkipped: true
}

// An instant an hour away from database time is refused, and the error
// carries the database time and the tolerance it was measured with.
func ExampleSkewError() {
	pool := examplePool()
	g, err := gate.New(pool, gate.Config{SkewTolerance: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()

	err = g.Once(context.Background(), "report", time.Now().Add(time.Hour), func(context.Context, gate.Run) error { return nil })
	var skew *gate.SkewError
	if errors.As(err, &skew) {
		fmt.Println("refused:", skew.Name, "tolerance", skew.Tolerance)
		fmt.Println("ahead of database time by about an hour:", skew.Skew().Round(time.Hour) == time.Hour)
		fmt.Println("ErrClockSkew:", errors.Is(err, gate.ErrClockSkew))
	}
	// Output:
	// refused: report tolerance 1m0s
	// ahead of database time by about an hour: true
	// ErrClockSkew: true
}
