package schedule

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

// Two backfills of overlapping ranges at the same time, with a scheduler
// running: each instant of the union gets one row, of kind backfill, and
// runs once, the oldest first.
func TestBackfillOverlapRunsEachOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	in := newInstance(t, db, "a", Config{}, nil)
	var mu sync.Mutex
	var order []time.Time
	job := effect(db.Pool)
	def := Definition{Name: "hourly", Spec: "0 * * * *", Version: 1, CatchUp: CatchUpNone}
	if err := in.s.Register(ctx, def, func(ctx context.Context, r Run) error {
		mu.Lock()
		order = append(order, r.Instant)
		mu.Unlock()
		return job(ctx, r)
	}); err != nil {
		t.Fatal(err)
	}
	in.start(t)
	now := dbNow(t, db.Pool).Truncate(time.Hour)
	// (now-30h, now-10h] and (now-20h, now-2h]: 28 instants, 10 in both.
	ranges := [][2]time.Time{{now.Add(-30 * time.Hour), now.Add(-10 * time.Hour)}, {now.Add(-20 * time.Hour), now.Add(-2 * time.Hour)}}
	results := make([]BackfillResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, r := range ranges {
		op := newInstance(t, db, "operator", Config{}, nil) // its own pool, no jobs
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = op.s.Backfill(ctx, def.Name, BackfillOptions{From: r[0], To: r[1], Max: 100})
		}()
	}
	close(start)
	wg.Wait()
	recorded := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("backfill %d: %v", i, err)
		}
		res := results[i]
		recorded += len(res.Instants)
		if res.Clamped || res.LeftOut != 0 || len(res.Instants)+res.Taken+res.Present != []int{20, 18}[i] {
			t.Errorf("backfill %d: %+v", i, res)
		}
		if !slices.IsSortedFunc(res.Instants, func(a, b time.Time) int { return a.Compare(b) }) {
			t.Errorf("backfill %d: instants not oldest first: %v", i, res.Instants)
		}
	}
	if recorded != 28 {
		t.Errorf("the two backfills recorded %d instants, want 28", recorded)
	}
	waitFor(t, 30*time.Second, "28 backfilled runs succeeded", func() bool {
		n := 0
		for _, r := range runsOf(t, db.Pool, def.Name) {
			if r.Kind == kindBackfill && r.State == stateSucceeded {
				n++
			}
		}
		return n == 28
	})
	var backfilled []time.Time
	for _, r := range runsOf(t, db.Pool, def.Name) {
		if r.Kind != kindBackfill {
			continue
		}
		backfilled = append(backfilled, r.Instant)
		if r.Attempt != 1 {
			t.Errorf("run %v: attempt %d", r.Instant, r.Attempt)
		}
	}
	if len(backfilled) != 28 || !backfilled[0].Equal(now.Add(-29*time.Hour)) || !backfilled[27].Equal(now.Add(-2*time.Hour)) {
		t.Fatalf("backfilled rows %v, want each hour in (now-30h, now-2h]", backfilled)
	}
	var effects, distinct int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT instant) FROM effects WHERE instant < $1`, now.Add(-time.Hour)).Scan(&effects, &distinct); err != nil {
		t.Fatal(err)
	}
	if effects != 28 || distinct != 28 {
		t.Errorf("effects: %d (%d instants), want each of the 28 instants once", effects, distinct)
	}
	mu.Lock()
	defer mu.Unlock()
	var ran []time.Time
	for _, t := range order {
		if t.Before(now.Add(-time.Hour)) {
			ran = append(ran, t)
		}
	}
	// Each backfill's instants run oldest first. Across the two there is no
	// order: a run may start before a concurrent backfill commits older
	// instants.
	for i, res := range results {
		var mine []time.Time
		for _, at := range ran {
			if slices.ContainsFunc(res.Instants, at.Equal) {
				mine = append(mine, at)
			}
		}
		if len(mine) != len(res.Instants) || !slices.IsSortedFunc(mine, func(a, b time.Time) int { return a.Compare(b) }) {
			t.Errorf("backfill %d's runs did not run oldest first: %v", i, mine)
		}
	}
}

// A dry run writes nothing; Max takes the oldest instants and counts the
// rest; a second backfill skips what the first recorded; the range is cut
// back to the schedule's frontier, and the result counts what was cut.
func TestBackfillDryRunCapAndFrontier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "operator", Config{}, nil)
	def := Definition{Name: "daily", Spec: "0 9 * * *", TimeZone: "Europe/Berlin", Version: 1}
	if err := in.s.Register(ctx, def, nop); err != nil {
		t.Fatal(err)
	}
	day := func(d int) time.Time { return time.Date(2026, 3, d, 8, 0, 0, 0, time.UTC) } // 09:00 Berlin (CET)
	from, to := day(1).Add(-time.Minute), day(20)                                       // (…, 20 Mar 08:00]: 20 instants

	dry, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: from, To: to, Max: 5, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Instants) != 5 || !dry.Instants[0].Equal(day(1)) || !dry.Instants[4].Equal(day(5)) || dry.LeftOut != 15 || dry.Present != 0 || dry.Clamped {
		t.Fatalf("dry run: %+v", dry)
	}
	if rows := runsOf(t, db.Pool, def.Name); len(rows) != 0 {
		t.Fatalf("the dry run wrote %d rows", len(rows))
	}

	res, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: from, To: to, Max: 5})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Instants, dry.Instants) || res.LeftOut != 15 || res.Taken != 0 {
		t.Fatalf("backfill: %+v, want the dry run's instants", res)
	}
	rows := runsOf(t, db.Pool, def.Name)
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 5", len(rows))
	}
	for _, r := range rows {
		if r.Kind != kindBackfill || r.State != statePending || r.Attempt != 0 || r.Missed {
			t.Errorf("row %+v", r)
		}
	}

	next, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: from, To: to, Max: 100, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if next.Present != 5 || len(next.Instants) != 15 || !next.Instants[0].Equal(day(6)) || next.LeftOut != 0 {
		t.Fatalf("after the first: %+v", next)
	}

	// Past the frontier (no instant recorded yet: the definition's start).
	var startsAt time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT starts_at FROM pgclaim_schedules`).Scan(&startsAt); err != nil {
		t.Fatal(err)
	}
	late, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: startsAt.Add(-48 * time.Hour), To: startsAt.Add(72 * time.Hour), Max: 10, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !late.Clamped || !late.Until.Equal(startsAt.UTC()) || len(late.Instants) != 2 || late.Cut != 3 || late.CutMore {
		t.Errorf("a range past the frontier: %+v, want cut back to %v with 2 instants, 3 cut", late, startsAt)
	}
	// A range wholly past the frontier records nothing, and says what it cut.
	future, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: startsAt.Add(24 * time.Hour), To: startsAt.Add(72 * time.Hour), Max: 10})
	if err != nil || len(future.Instants) != 0 || !future.Clamped || future.Cut != 2 {
		t.Errorf("a future range: %+v, %v; want nothing recorded, 2 cut", future, err)
	}
	// The count of what was cut stops at maxLeftOut.
	every := Definition{Name: "every-second", Spec: "* * * * * *", TimeZone: "UTC", Version: 1}
	if err := in.s.Register(ctx, every, nop); err != nil {
		t.Fatal(err)
	}
	many, err := in.s.Backfill(ctx, every.Name, BackfillOptions{From: startsAt.Add(-time.Minute), To: startsAt.Add(48 * time.Hour), Max: 10, DryRun: true})
	if err != nil || many.Cut != maxLeftOut || !many.CutMore {
		t.Errorf("a long future range: cut %d (more %v), %v; want %d and more", many.Cut, many.CutMore, err, maxLeftOut)
	}
}

// Bad input names the field and writes nothing.
func TestBackfillBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "operator", Config{}, nil)
	if err := in.s.Register(ctx, Definition{Name: "daily", Spec: "@daily", Version: 1}, nop); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		opts BackfillOptions
		want string
	}{
		{"daily", BackfillOptions{From: t0, To: t0, Max: 1}, "schedule: BackfillOptions.From: must be before To"},
		{"daily", BackfillOptions{From: t0.Add(time.Hour), To: t0, Max: 1}, "schedule: BackfillOptions.From: must be before To"},
		{"daily", BackfillOptions{To: t0, Max: 1}, "schedule: BackfillOptions.From: must be set"},
		{"daily", BackfillOptions{From: t0, Max: 1}, "schedule: BackfillOptions.To: must be set"},
		{"daily", BackfillOptions{From: t0, To: t0.AddDate(0, 0, 5), Max: 0}, "schedule: BackfillOptions.Max: must be at least 1, got 0"},
		{"daily", BackfillOptions{From: t0, To: t0.AddDate(0, 0, 5), Max: -3}, "schedule: BackfillOptions.Max: must be at least 1, got -3"},
		{"", BackfillOptions{From: t0, To: t0.AddDate(0, 0, 5), Max: 1}, "schedule: name: must not be empty"},
	} {
		_, err := in.s.Backfill(ctx, c.name, c.opts)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("Backfill(%q, %+v) = %v, want %q (ErrInvalid)", c.name, c.opts, err, c.want)
		}
	}
	_, err := in.s.Backfill(ctx, "nope", BackfillOptions{From: t0, To: t0.AddDate(0, 0, 5), Max: 1})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown schedule: %v", err)
	}
	if rows := runsOf(t, db.Pool, "daily"); len(rows) != 0 {
		t.Errorf("bad input wrote %d rows", len(rows))
	}
}

// Concurrent overlapping backfills when the database defaults to
// REPEATABLE READ or SERIALIZABLE: no serialization failure, each instant
// one row.
func TestBackfillAnyIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDatabase(t)
			if _, err := db.Pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET default_transaction_isolation = '"+level+"'"); err != nil {
				t.Fatal(err)
			}
			ops := []*instance{newInstance(t, db, "op-1", Config{}, nil), newInstance(t, db, "op-2", Config{}, nil)}
			if err := ops[0].s.Register(ctx, Definition{Name: "minutely", Spec: "* * * * *", Version: 1}, nop); err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for round := range 5 {
				base := t0.Add(time.Duration(round) * time.Hour)
				var wg sync.WaitGroup
				errs := make([]error, 2)
				recorded := make([]int, 2)
				for i, op := range ops {
					wg.Add(1)
					go func() {
						defer wg.Done()
						from := base.Add(time.Duration(i) * 10 * time.Minute) // (base, base+30m] and (base+10m, base+40m]
						res, err := op.s.Backfill(ctx, "minutely", BackfillOptions{From: from, To: from.Add(30 * time.Minute), Max: 100})
						errs[i], recorded[i] = err, len(res.Instants)
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
				}
				if recorded[0]+recorded[1] != 40 {
					t.Errorf("round %d: recorded %v, want 40 in all", round, recorded)
				}
			}
			var rows, distinct int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT instant) FROM pgclaim_schedule_runs WHERE kind = 'backfill'`).Scan(&rows, &distinct); err != nil {
				t.Fatal(err)
			}
			if rows != 200 || distinct != 200 {
				t.Errorf("%d rows (%d instants), want 200", rows, distinct)
			}
		})
	}
}
