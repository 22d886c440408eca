package schedule

import (
	"context"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// An instance stopped mid-run (a deploy) hands its attempt back: the
// other instance runs the instant as attempt 2 at once. A schedule
// registered while Run runs is picked up.
func TestShutdownHandsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	started := make(chan Run, 1)
	job := func(ctx context.Context, r Run) error {
		if r.Attempt == 1 {
			started <- r
			<-ctx.Done() // until its instance stops
			return ctx.Err()
		}
		return nil
	}
	def := Definition{Name: "deploy", Spec: "*/2 * * * * *", Version: 1}
	byHolder := map[string]*instance{}
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{}, nil)
		if err := in.s.Register(ctx, def, job); err != nil {
			t.Fatal(err)
		}
		in.start(t)
		byHolder[h] = in
	}
	var first Run
	select {
	case first = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no run started")
	}
	stopped := time.Now()
	byHolder[first.Holder].stop()
	waitFor(t, 10*time.Second, "attempt 2 on the other instance", func() bool {
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Instant.Equal(first.Instant) && r.State == stateSucceeded {
				if r.Attempt != 2 || *r.Holder == first.Holder {
					t.Fatalf("completed as attempt %d by %s", r.Attempt, *r.Holder)
				}
				return true
			}
		}
		return false
	})
	t.Logf("handed back and completed %s after its instance stopped", time.Since(stopped).Round(time.Millisecond))

	other := byHolder["a"]
	if first.Holder == "a" {
		other = byHolder["b"]
	}
	late := Definition{Name: "late", Spec: "* * * * * *", Version: 1}
	if err := other.s.Register(ctx, late, nop); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the schedule registered while running to run", func() bool {
		for _, r := range runsOf(t, db.Pool, late.Name) {
			if r.State == stateSucceeded {
				return true
			}
		}
		return false
	})
}
