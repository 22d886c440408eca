package schedule

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/pgtest"
)

// TestFailedBatchStatementDelaysNoOther: of 100 schedules due at one
// instant, whose statements go in shared batches, one has its statement
// refused for good (a trigger raising for its rows, as a user's trigger or
// constraint would): recording its instant, claiming its run (on the
// common path, its run is recorded running: the insert is refused), or
// recording its outcome. The 99 others start on time regardless, each runs once, and
// each ends succeeded at its first attempt; only the one refused fails.
func TestFailedBatchStatementDelaysNoOther(t *testing.T) {
	const schedules, bad = 100, "onebad-000"
	for _, tc := range []struct {
		name string
		when []string
	}{
		{"record", []string{`BEFORE INSERT ON pgclaim_schedule_runs FOR EACH ROW WHEN (NEW.schedule = '` + bad + `')`}},
		{"claim", []string{`BEFORE UPDATE ON pgclaim_schedule_runs FOR EACH ROW
			WHEN (NEW.schedule = '` + bad + `' AND OLD.state = 'pending' AND NEW.state = 'running')`,
			`BEFORE INSERT ON pgclaim_schedule_runs FOR EACH ROW WHEN (NEW.schedule = '` + bad + `' AND NEW.state = 'running')`}},
		{"finish", []string{`BEFORE UPDATE ON pgclaim_schedule_runs FOR EACH ROW
			WHEN (NEW.schedule = '` + bad + `' AND OLD.state = 'running' AND NEW.state <> 'running')`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := pgtest.NewDatabase(t)
			if _, err := db.Pool.Exec(ctx, `
				CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN RAISE EXCEPTION 'refused by the test'; END $$`); err != nil {
				t.Fatal(err)
			}
			for i, when := range tc.when {
				if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TRIGGER refuse_bad_%d %s EXECUTE FUNCTION refuse_bad()`, i, when)); err != nil {
					t.Fatal(err)
				}
			}
			in := newInstance(t, db, "one", Config{Logger: discard}, nil)
			type key struct {
				name    string
				instant time.Time
			}
			var mu sync.Mutex
			ran := map[key]int{}
			started := map[key]time.Duration{}
			for i := range schedules {
				def := Definition{Name: fmt.Sprintf("onebad-%03d", i), Spec: "*/2 * * * * *", Version: 1}
				if err := in.s.Register(ctx, def, func(_ context.Context, r Run) error {
					lag := time.Since(r.Instant)
					mu.Lock()
					k := key{r.Schedule, r.Instant.UTC()}
					ran[k]++
					started[k] = lag
					mu.Unlock()
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			in.start(t)
			// An instant well after the start: every runner is past its
			// first pass.
			instant := time.Now().Add(1500 * time.Millisecond).Truncate(2 * time.Second).Add(2 * time.Second).UTC()
			good := func(yield func(string) bool) {
				for i := 1; i < schedules; i++ {
					if !yield(fmt.Sprintf("onebad-%03d", i)) {
						return
					}
				}
			}
			deadline := instant.Add(10 * time.Second)
			succeeded := func() (n int) {
				for name := range good {
					for _, r := range runsOf(t, db.Pool, name) {
						if r.Instant.Equal(instant) && r.State == stateSucceeded {
							n++
						}
					}
				}
				return n
			}
			for time.Now().Before(deadline) && succeeded() < schedules-1 {
				time.Sleep(200 * time.Millisecond)
			}
			time.Sleep(500 * time.Millisecond) // time for a second run, were there one
			in.stop()

			mu.Lock()
			defer mu.Unlock()
			var lags []time.Duration
			for name := range good {
				k := key{name, instant}
				if n := ran[k]; n != 1 {
					t.Errorf("%s at %s ran %d times; want once", name, instant.Format(time.TimeOnly), n)
					continue
				}
				lags = append(lags, started[k])
			}
			slices.Sort(lags)
			if len(lags) > 0 {
				t.Logf("%d of %d schedules started for %s; start lag p50 %s, max %s", len(lags), schedules-1, instant.Format(time.TimeOnly),
					lags[len(lags)/2].Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond))
			} else {
				t.Logf("none of %d schedules started for %s", schedules-1, instant.Format(time.TimeOnly))
			}
			var wrong int
			for name := range good {
				for _, r := range runsOf(t, db.Pool, name) {
					if r.Instant.Equal(instant) && (r.State != stateSucceeded || r.Attempt != 1) {
						wrong++
						if wrong <= 5 {
							t.Errorf("%s at %s: %s at attempt %d; want succeeded at attempt 1", name, instant.Format(time.TimeOnly), r.State, r.Attempt)
						}
					}
				}
			}
			if n := succeeded(); n != schedules-1 {
				t.Errorf("%d of %d schedules succeeded for %s (%d recorded otherwise)", n, schedules-1, instant.Format(time.TimeOnly), wrong)
			}
			for _, r := range runsOf(t, db.Pool, bad) {
				if r.State == stateSucceeded {
					t.Errorf("%s at %s succeeded; its statements are refused", bad, r.Instant.Format(time.TimeOnly))
				}
			}
		})
	}
}

// TestBatchSplitsOnlyForAnInput: a batch the server refuses for one
// input's sake is sent again in halves until that input stands alone, and
// only its call fails; a failure of the statement itself (here a missing
// privilege) fails the batch once, never sent again in parts.
func TestBatchSplitsOnlyForAnInput(t *testing.T) {
	for _, tc := range []struct {
		code  string
		split bool
	}{
		{"P0001", true},  // RAISE EXCEPTION in a trigger
		{"23514", true},  // a CHECK constraint
		{"42501", false}, // a missing privilege: every input's
	} {
		t.Run(tc.code, func(t *testing.T) {
			const calls, bad = 100, 37
			var mu sync.Mutex
			sent := 0
			release := make(chan struct{})
			b := batcher[int, int]{send: func(_ context.Context, ins []int) ([]int, error) {
				<-release
				mu.Lock()
				sent++
				mu.Unlock()
				if slices.Contains(ins, bad) || tc.code == "42501" {
					return nil, &pgconn.PgError{Code: tc.code, Message: "refused"}
				}
				out := make([]int, len(ins))
				for i, in := range ins {
					out[i] = in * 2
				}
				return out, nil
			}}
			// A first call goes alone; the others gather meanwhile and go
			// in one batch once it is answered.
			first := make(chan error, 1)
			go func() { _, err := b.do(context.Background(), -1); first <- err }()
			waitBatched := func(n int) {
				for {
					b.mu.Lock()
					k, sending := len(b.calls), b.sending
					b.mu.Unlock()
					if sending && k == n {
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
			waitBatched(0)
			var wg sync.WaitGroup
			errs := make([]error, calls)
			outs := make([]int, calls)
			for i := range calls {
				wg.Add(1)
				go func() { defer wg.Done(); outs[i], errs[i] = b.do(context.Background(), i) }()
			}
			waitBatched(calls)
			close(release)
			wg.Wait()
			if err := <-first; err != nil && !(tc.code == "42501") {
				t.Errorf("the first call: %v", err)
			}
			for i := range calls {
				var pe *pgconn.PgError
				switch {
				case !tc.split || i == bad:
					if !errors.As(errs[i], &pe) || pe.Code != tc.code {
						t.Errorf("call %d: %v, %v; want the refusal", i, outs[i], errs[i])
					}
				case errs[i] != nil || outs[i] != 2*i:
					t.Errorf("call %d: %v, %v; want %d", i, outs[i], errs[i], 2*i)
				}
			}
			t.Logf("SQLSTATE %s, one input of %d at fault: %d statements", tc.code, calls, sent)
			if !tc.split && sent != 2 {
				t.Errorf("SQLSTATE %s: %d statements; want 2 (the first call's and the batch's), never the batch in parts", tc.code, sent)
			}
			if tc.split && sent > 2+2*8 {
				t.Errorf("SQLSTATE %s: %d statements; want at most %d (the batch halved down to the input at fault)", tc.code, sent, 2+2*8)
			}
		})
	}
}
