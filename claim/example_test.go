package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/pgtest"
)

// schema is the field scenario's table, with the claim columns and the
// recommended partial indexes.
const schema = `
CREATE TABLE push_requests (
    id          bigint PRIMARY KEY,
    status      text NOT NULL,
    claimed_at  timestamptz,
    claimed_by  text,
    fence       bigint,
    lease_until timestamptz,
    attempts    int NOT NULL DEFAULT 0,
    reason      text
);
-- batch claims pick PAUSED rows in key order
CREATE INDEX push_requests_paused_idx ON push_requests (id) WHERE status = 'PAUSED';
-- the sweeper looks for old PROCESSING rows
CREATE INDEX push_requests_processing_idx ON push_requests (claimed_at) WHERE status = 'PROCESSING';
CREATE TABLE sent (push_id bigint NOT NULL, fence bigint NOT NULL);
INSERT INTO push_requests (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 5) g;
`

var pushes = claim.Table{
	Name:       "push_requests",
	Key:        "id",
	State:      "status",
	ClaimedAt:  "claimed_at",
	ClaimedBy:  "claimed_by",
	Fence:      "fence",
	LeaseUntil: "lease_until",
	Attempts:   "attempts",
	Reason:     "reason",
}

var (
	srvOnce sync.Once
	srv     *pgtest.Server
)

// exampleDB returns a pool on a throwaway database holding the schema above;
// in an application this is your own pool on a database migrated with
// pgclaim.Migrate.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	srvOnce.Do(func() {
		var err error
		if srv, err = pgtest.Start(ctx); err != nil {
			log.Fatal(err)
		}
	})
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, schema); err != nil {
		log.Fatal(err)
	}
	return db.Pool, func() { _ = db.Drop(ctx) }
}

// Two instances run the 09:00 job at once and both try to resume push 1;
// the compare-and-swap lets exactly one of them have it.
func ExampleClaimer_Claim() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	newInstance := func(holder string) *claim.Claimer[int64] {
		c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: holder})
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	active, standby := newInstance("app-1:8101"), newInstance("app-2:8103")

	c, err := active.Claim(ctx, 1)
	fmt.Println("active claims push 1:", err == nil, "fenced:", c.Fence > 0)
	_, err = standby.Claim(ctx, 1)
	fmt.Println("standby skips push 1:", errors.Is(err, claim.ErrNotClaimed))

	// ... send the push, then finish, fenced by the claim's token.
	fmt.Println("finish:", active.Finish(ctx, c, "DONE"))
	fmt.Println("finish again:", active.Finish(ctx, c, "DONE"))
	// Output:
	// active claims push 1: true fenced: true
	// standby skips push 1: true
	// finish: <nil>
	// finish again: claim: claim lost: row is no longer held with this token
}

// Claim a batch, then finish it and write the effects in one transaction:
// the effects commit exactly when the rows move to DONE, and a claim lost
// meanwhile (swept, claimed again) gets no effect.
func ExampleClaimer_FinishBatch() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		log.Fatal(err)
	}
	batch, err := c.ClaimBatch(ctx, 3)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("claimed:", len(batch))

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		finished, lost, err := c.WithTx(tx).FinishBatch(ctx, batch, "DONE")
		if err != nil {
			return err
		}
		fmt.Println("finished:", len(finished), "lost:", len(lost))
		for _, f := range finished {
			if _, err := tx.Exec(ctx, `INSERT INTO sent (push_id, fence) VALUES ($1, $2)`, f.Key, f.Fence); err != nil {
				return err // rolls back the finish too
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	var sent int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM sent`).Scan(&sent)
	fmt.Println("sent:", sent)
	// Output:
	// claimed: 3
	// finished: 3 lost: 0
	// sent: 3
}

// A worker drains the paused pushes: each one is sent in the transaction that
// marks it DONE; a failure is retried while attempts remain.
func ExampleWorker_Drain() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	c, err := claim.New[int64](pool, pushes, claim.Config{
		From: "PAUSED", To: "PROCESSING",
		Lease: time.Minute, // the worker extends it while work runs
	})
	if err != nil {
		log.Fatal(err)
	}
	w, err := claim.NewWorker(c, claim.WorkerConfig[int64]{
		Work: func(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error {
			if c.Key == 4 && c.Attempts == 1 {
				return errors.New("push gateway timeout") // retried
			}
			_, err := tx.Exec(ctx, `INSERT INTO sent (push_id, fence) VALUES ($1, $2)`, c.Key, c.Fence)
			return err
		},
		Done:        "DONE",
		Failed:      "FAILED",
		Retry:       claim.RetryPolicy{State: "PAUSED", MaxAttempts: 3},
		BatchSize:   100,
		Concurrency: 2,
	})
	if err != nil {
		log.Fatal(err)
	}
	st, err := w.Drain(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("claimed %d, succeeded %d, retried %d, failed %d\n", st.Claimed, st.Succeeded, st.Retried, st.Failed)
	// Output:
	// claimed 6, succeeded 5, retried 1, failed 0
}

// At start-up every instance sweeps rows left in PROCESSING by an instance
// that died: back to PAUSED while attempts remain, else to FAILED.
func ExampleSweeper_Sweep() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	// An instance that died yesterday holding pushes 1 and 2; push 2 had
	// already been tried three times.
	_, err := pool.Exec(ctx, `UPDATE push_requests
		SET status = 'PROCESSING', claimed_by = 'app-1:8101', claimed_at = '2026-11-28 09:00:00Z',
		    fence = 40 + id, attempts = id + 1
		WHERE id IN (1, 2)`)
	if err != nil {
		log.Fatal(err)
	}

	c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING"})
	if err != nil {
		log.Fatal(err)
	}
	s, err := claim.NewSweeper(c, claim.SweeperConfig[int64]{
		StaleAfter: 12 * time.Hour,
		Failed:     "FAILED",
		Retry:      claim.RetryPolicy{State: "PAUSED", MaxAttempts: 3},
		BatchSize:  1000,
	})
	if err != nil {
		log.Fatal(err)
	}
	// One sweep, at start-up. Run sweeps at once and then periodically,
	// so a service that need not wait for this sweep runs only:
	//   go s.Run(ctx, time.Minute)
	swept, err := s.Sweep(ctx)
	if err != nil {
		log.Fatal(err)
	}
	sort.Slice(swept, func(i, j int) bool { return swept[i].Key < swept[j].Key })
	for _, r := range swept {
		fmt.Printf("push %d of %s (attempts %d) -> %s\n", r.Key, r.ClaimedBy, r.Attempts, r.State)
	}
	// With Table.Reason, the row says why it failed.
	var reason string
	if err := pool.QueryRow(ctx, `SELECT reason FROM push_requests WHERE id = 2`).Scan(&reason); err != nil {
		log.Fatal(err)
	}
	fmt.Println(reason)
	// Output:
	// push 1 of app-1:8101 (attempts 2) -> PAUSED
	// push 2 of app-1:8101 (attempts 3) -> FAILED
	// claim: swept: claimed at 2026-11-28T09:00:00.000000Z, more than 12h0m0s ago (claim by app-1:8101, fence 42, attempt 3)
}

// The field article's loop, with an sqlc-generated compare-and-swap: claim
// each candidate, skip the ones another instance won.
func ExampleEach() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	// What sqlc generates for:
	//   -- name: ResumeFromPaused :execrows
	//   UPDATE push_requests SET status = 'PROCESSING', claimed_at = now()
	//   WHERE id = $1 AND status = 'PAUSED';
	resumeFromPaused := func(ctx context.Context, id int64) (int64, error) {
		tag, err := pool.Exec(ctx, `UPDATE push_requests SET status = 'PROCESSING', claimed_at = now()
			WHERE id = $1 AND status = 'PAUSED'`, id)
		return tag.RowsAffected(), err
	}
	// Another instance got push 2 first.
	if _, err := resumeFromPaused(ctx, 2); err != nil {
		log.Fatal(err)
	}

	st, err := claim.Each(ctx, []int64{1, 2, 3}, resumeFromPaused, func(ctx context.Context, id int64) error {
		_, err := pool.Exec(ctx, `UPDATE push_requests SET status = 'DONE' WHERE id = $1 AND status = 'PROCESSING'`, id)
		return err
	})
	fmt.Printf("claimed %d, skipped %d, succeeded %d, err %v\n", st.Claimed, st.Skipped, st.Succeeded, err)
	// Output:
	// claimed 2, skipped 1, succeeded 2, err <nil>
}

// Hooks feed metrics: here a map of rows by what happened to them; in a
// service, a counter vector of your metrics library, with a histogram of
// Event.Duration.
func ExampleHooks() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	var mu sync.Mutex
	rows := map[string]int{}
	hooks := claim.HooksFunc(func(_ context.Context, e claim.Event) {
		mu.Lock()
		defer mu.Unlock()
		rows[e.Kind.String()+" "+e.State] += e.Rows
	})
	c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING", Hooks: hooks})
	if err != nil {
		log.Fatal(err)
	}
	cls, err := c.ClaimBatch(ctx, 3)
	if err != nil {
		log.Fatal(err)
	}
	if _, _, err := c.FinishBatch(ctx, cls[:2], "DONE"); err != nil {
		log.Fatal(err)
	}
	if err := c.Release(ctx, cls[2]); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for k, n := range rows {
		lines = append(lines, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// claimed PROCESSING: 3
	// finished DONE: 2
	// released PAUSED: 1
}
