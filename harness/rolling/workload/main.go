package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/schedule"
)

// Summary is what an instance prints when it stops.
type Summary struct {
	Holder  string `json:"holder"`
	Runs    int64  `json:"runs"`    // schedule runs it made
	Claimed int64  `json:"claimed"` // rows it claimed and finished
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return errors.New("usage: workload HOLDER")
	}
	holder := os.Args[1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgclaim.Migrate(ctx, pool); err != nil {
		return err
	}
	sum := Summary{Holder: holder}
	var runs, claimed atomic.Int64

	s, err := schedule.New(pool, schedule.Config{Holder: holder, Logger: log, PollInterval: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	def := schedule.Definition{
		Name: "rolling-tick", Spec: "* * * * * *", TimeZone: "UTC", Version: 1,
		CatchUp: schedule.CatchUpAll, CatchUpWindow: time.Hour, CatchUpCap: 3600,
	}
	err = s.Register(ctx, def, func(ctx context.Context, r schedule.Run) error {
		_, err := pool.Exec(ctx, `INSERT INTO rolling_runs (instant, holder, fence, attempt) VALUES ($1, $2, $3, $4)`,
			r.Instant, holder, r.Fence, r.Attempt)
		if err == nil {
			runs.Add(1)
		}
		return err
	})
	if err != nil {
		return err
	}
	c, err := claim.New[int64](pool, claim.Table{
		Name: "rolling_items", Key: "id", State: "status", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by",
		Fence: "fence", LeaseUntil: "lease_until", Attempts: "attempts", Reason: "reason",
	}, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: holder, Lease: 30 * time.Second, Logger: log})
	if err != nil {
		return err
	}

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := s.Run(ctx); err != nil && ctx.Err() == nil {
			errs <- fmt.Errorf("scheduler: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		// A stopping instance finishes the rows it has claimed: a batch is
		// claimed and finished with a context the stop does not cancel (a
		// claim cut short by the stop could commit on the server unseen,
		// leaving rows claimed until their lease ends), and the stop is
		// looked at between batches.
		work := context.WithoutCancel(ctx)
		for ctx.Err() == nil {
			n, err := claimSome(work, pool, c, holder)
			if err != nil {
				errs <- fmt.Errorf("claims: %w", err)
				return
			}
			claimed.Add(int64(n))
			if n == 0 {
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	}()
	fmt.Println("started")
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	sum.Runs, sum.Claimed = runs.Load(), claimed.Load()
	return json.NewEncoder(os.Stdout).Encode(sum)
}

// claimSome claims a few rows and finishes each as DONE in the transaction
// that records its effect.
func claimSome(ctx context.Context, pool *pgxpool.Pool, c *claim.Claimer[int64], holder string) (int, error) {
	cls, err := c.ClaimBatch(ctx, 5)
	if err != nil {
		return 0, err
	}
	for _, cl := range cls {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO rolling_effects (id, holder, fence) VALUES ($1, $2, $3)`,
				cl.Key, holder, cl.Fence); err != nil {
				return err
			}
			return c.WithTx(tx).Finish(ctx, cl, "DONE")
		})
		if err != nil {
			return 0, err
		}
	}
	return len(cls), nil
}
