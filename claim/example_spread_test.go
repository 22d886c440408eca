package claim_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/pgclaim/pgclaim/claim"
)

// Many instances drain one backlog of 10,000 pushes. With Spread each
// batch starts at a random claimable row, so the instances do not all
// start at the same first rows; every push is still claimed exactly once.
func ExampleConfig_spread() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `INSERT INTO push_requests (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 10000) g ON CONFLICT (id) DO UPDATE SET status = 'PAUSED'`); err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	for i := range 4 {
		c, err := claim.New[int64](pool, pushes, claim.Config{From: "PAUSED", To: "PROCESSING", Holder: fmt.Sprintf("instance-%d", i), Spread: true})
		if err != nil {
			log.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				batch, err := c.ClaimBatch(ctx, 100)
				if err != nil {
					log.Fatal(err)
				}
				if len(batch) == 0 {
					return
				}
				if _, _, err := c.FinishBatch(ctx, batch, "SENT"); err != nil {
					log.Fatal(err)
				}
				mu.Lock()
				for _, cl := range batch {
					seen[cl.Key]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	twice := 0
	for _, n := range seen {
		if n > 1 {
			twice++
		}
	}
	fmt.Printf("claimed %d pushes, %d of them twice\n", len(seen), twice)
	// Output: claimed 10000 pushes, 0 of them twice
}
