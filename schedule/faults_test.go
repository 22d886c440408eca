package schedule

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// Four instances run three one-second schedules while a killer terminates
// a random schedule's lock session about twice a second, mostly mid-run. After the
// faults stop: every due instant has a row that ended succeeded (or
// skipped, with its reason), at most one attempt per instant succeeded,
// and the succeeded attempt's effect is there, exactly once with its
// fence.
func TestEveryInstantOnceUnderKills(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	names := []string{"a", "b", "c"}
	work := func(pool *pgxpool.Pool) Job {
		record := effect(pool)
		return func(ctx context.Context, r Run) error {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			return record(ctx, r)
		}
	}
	var ins []*instance
	for i := range 4 {
		in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{}, nil)
		in.s.log = discard
		for _, n := range names {
			def := Definition{Name: n, Spec: "* * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: time.Minute, CatchUpCap: 100,
				Overlap: OverlapBufferOne, Retry: RetryPolicy{MaxAttempts: 10, Backoff: 50 * time.Millisecond}}
			if err := in.s.Register(ctx, def, work(in.pool)); err != nil {
				t.Fatal(err)
			}
		}
		in.start(t)
		ins = append(ins, in)
	}
	kills := 0
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		// Terminate the session of a random schedule's lock as soon as
		// one holds it (most often mid-run), then pause half a second.
		class, key := LockKey(names[rand.IntN(len(names))])
		var n int
		n, err := pgprobe.TerminateHolder(ctx, db.Pool, pgprobe.Pair(class, key))
		if err != nil {
			t.Fatal(err)
		}
		kills += n
		if n > 0 {
			time.Sleep(500 * time.Millisecond)
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	settled := dbNow(t, db.Pool)
	time.Sleep(4 * time.Second) // the last runs are taken over and finish
	for _, in := range ins {
		in.stop()
	}
	var attempts2, runs int
	for _, n := range names {
		st, err := loadSchedule(ctx, ins[0].s.q, n)
		if err != nil {
			t.Fatal(err)
		}
		due, _ := st.spec.between(st.startsAt, settled, 1000)
		rows := map[time.Time]runRow{}
		for _, r := range runsOf(t, db.Pool, n) {
			rows[r.Instant] = r
		}
		for _, at := range due {
			r, ok := rows[at]
			switch {
			case !ok:
				t.Errorf("%s %v: no row", n, at)
				continue
			case r.State == stateSkipped:
				t.Logf("%s %v: skipped: %s", n, at, deref(r.Reason))
				continue
			case r.State != stateSucceeded:
				t.Errorf("%s %v: %s at attempt %d (%s)", n, at, r.State, r.Attempt, deref(r.Reason))
				continue
			}
			runs++
			if r.Attempt > 1 {
				attempts2++
			}
			var count int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE schedule = $1 AND instant = $2 AND fence = $3`, n, at, *r.Fence).Scan(&count); err != nil {
				t.Fatal(err)
			}
			if count != 1 {
				t.Errorf("%s %v: %d effects with the succeeded fence %d, want 1", n, at, count, *r.Fence)
			}
		}
	}
	t.Logf("%d sessions terminated; %d instants succeeded, %d of them after more than one attempt", kills, runs, attempts2)
	if kills == 0 {
		t.Fatal("no session was terminated")
	}
}
