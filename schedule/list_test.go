package schedule

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// List and Status read every stored schedule from the database, whether
// or not the Scheduler runs it: next due, latest outcome, open runs,
// missed (recorded and unrecorded) and the pause.
func TestListStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	svc := newInstance(t, db, "svc", Config{}, nil)
	for _, d := range []Definition{
		{Name: "daily", Spec: "0 9 * * *", TimeZone: "Europe/Berlin", Version: 2},
		{Name: "each-second", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpNone},
	} {
		if err := svc.s.Register(ctx, d, nop); err != nil {
			t.Fatal(err)
		}
	}
	op := newInstance(t, db, "operator", Config{Grace: time.Second}, nil) // registers nothing

	// daily: a succeeded run, then a failed one, then one pending.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, attempt, fence, missed, created_at, started_at, finished_at, reason) VALUES
 ('daily', '2026-03-01 08:00Z', 'backfill', 'succeeded', 1, 11, false, now(), '2026-03-01 08:00:01Z', '2026-03-01 08:00:02Z', NULL),
 ('daily', '2026-03-02 08:00Z', 'scheduled', 'failed', 3, 14, true, now(), '2026-03-02 08:10:00Z', '2026-03-02 08:10:05Z', 'attempt 3 of 3: boom'),
 ('daily', '2026-03-03 08:00Z', 'backfill', 'pending', 0, NULL, false, now(), NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := op.s.Pause(ctx, "daily", "provider outage", "alice"); err != nil {
		t.Fatal(err)
	}
	// each-second: its life began 5.5 s ago and nothing ran it: 4-5 missed.
	t0 := dbNow(t, db.Pool)
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET starts_at = $1 WHERE name = 'each-second'`, t0.Add(-5500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}

	all, err := op.s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Name != "daily" || all[1].Name != "each-second" {
		t.Fatalf("List = %+v", all)
	}
	d := all[0]
	if d.Spec != "0 9 * * *" || d.TimeZone != "Europe/Berlin" || d.Version != 2 || d.OpenRuns != 1 ||
		d.Missed != 1 || d.MissedUnrecorded != 0 || !d.Paused || d.PausedNote != "provider outage" || d.PausedBy != "alice" || d.PausedAt.IsZero() {
		t.Errorf("daily = %+v", d)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	if nd := d.NextDue.In(berlin); !d.NextDue.After(d.DBNow) || nd.Hour() != 9 || nd.Minute() != 0 || d.NextDue.Sub(d.DBNow) > 25*time.Hour {
		t.Errorf("daily next due %v (db now %v)", d.NextDue, d.DBNow)
	}
	want := LastRun{Instant: time.Date(2026, 3, 2, 8, 0, 0, 0, time.UTC), Kind: "scheduled", State: "failed", Attempt: 3, Reason: "attempt 3 of 3: boom",
		StartedAt: time.Date(2026, 3, 2, 8, 10, 0, 0, time.UTC), FinishedAt: time.Date(2026, 3, 2, 8, 10, 5, 0, time.UTC)}
	if d.Last == nil || *d.Last != want {
		t.Errorf("daily last = %+v, want %+v", d.Last, want)
	}
	e := all[1]
	if e.Last != nil || e.OpenRuns != 0 || e.Paused || e.MissedUnrecorded < 4 || e.MissedUnrecorded > 5 || e.Missed != e.MissedUnrecorded || e.MissedMore ||
		!e.NextDue.After(e.DBNow) || e.NextDue.Sub(e.DBNow) > time.Second {
		t.Errorf("each-second = %+v", e)
	}

	one, err := op.s.Status(ctx, "each-second")
	if err != nil || one.Name != "each-second" || one.Spec != e.Spec {
		t.Errorf("Status = %+v, %v", one, err)
	}
	if _, err := op.s.Status(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Status of an unknown schedule: %v", err)
	}
	if _, err := op.s.Status(ctx, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("Status of no name: %v", err)
	}
	if err := op.s.Resume(ctx, "daily"); err != nil {
		t.Fatal(err)
	}
	if d, err := op.s.Status(ctx, "daily"); err != nil || d.Paused || !d.PausedAt.IsZero() || d.PausedNote != "" {
		t.Errorf("after Resume: %+v, %v", d, err)
	}
}

// Runs lists a schedule's newest runs by instant, of every kind and state,
// with their attempts, fences and flags; an unknown name is ErrNotFound.
func TestRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	op := newInstance(t, db, "operator", Config{}, nil)
	if err := op.s.Register(ctx, Definition{Name: "daily", Spec: "0 9 * * *", Version: 1}, nop); err != nil {
		t.Fatal(err)
	}
	if runs, err := op.s.Runs(ctx, "daily", 10); err != nil || len(runs) != 0 {
		t.Fatalf("Runs before any run = %+v, %v", runs, err)
	}
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, attempt, fence, holder, missed, late, created_at, started_at, finished_at, reason) VALUES
 ('daily', '2026-03-01 09:00Z', 'scheduled', 'succeeded', 1, 11, 'a', false, true, now(), '2026-03-01 09:00:20Z', '2026-03-01 09:00:22Z', NULL),
 ('daily', '2026-03-02 09:00Z', 'scheduled', 'failed', 3, 14, 'b', true, false, now(), '2026-03-02 09:10:00Z', '2026-03-02 09:10:05Z', 'attempt 3 of 3: boom'),
 ('daily', '2026-03-03 09:00Z', 'backfill', 'pending', 0, NULL, NULL, false, false, now(), NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	runs, err := op.s.Runs(ctx, "daily", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 {
		t.Fatalf("Runs(limit 2) = %d runs, want 2", len(runs))
	}
	p, f := runs[0], runs[1]
	if p.Kind != "backfill" || p.State != "pending" || p.Attempt != 0 || p.Fence != 0 || p.Holder != "" || !p.StartedAt.IsZero() {
		t.Errorf("newest = %+v", p)
	}
	if !f.Instant.Equal(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)) || f.State != "failed" || f.Attempt != 3 || f.Fence != 14 ||
		f.Holder != "b" || !f.Missed || f.Late || f.Reason != "attempt 3 of 3: boom" || f.FinishedAt.IsZero() {
		t.Errorf("second = %+v", f)
	}
	if all, _ := op.s.Runs(ctx, "daily", 0); len(all) != 1 {
		t.Errorf("Runs(limit 0) = %d runs, want 1 (at least 1)", len(all))
	}
	if _, err := op.s.Runs(ctx, "nope", 5); !errors.Is(err, ErrNotFound) {
		t.Errorf("Runs(unknown) = %v, want ErrNotFound", err)
	}
}

// A future instant run early by RunAt is not the latest outcome: Status.Last
// is the newest run whose instant has come, and nil while there is none.
func TestStatusLastNotFuture(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	in := newInstance(t, db, "test", Config{}, nil)
	def := Definition{Name: "report", Spec: "0 6 * * *", Version: 1}
	if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, db.Pool)
	tomorrow := time.Date(now.Year(), now.Month(), now.Day()+2, 6, 0, 0, 0, time.UTC)
	if _, err := in.s.RunAt(ctx, def.Name, tomorrow); err != nil {
		t.Fatal(err)
	}
	st, err := in.s.Status(ctx, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Last != nil {
		t.Fatalf("Last = %+v with only a future instant run early, want nil", st.Last)
	}
	yesterday := tomorrow.AddDate(0, 0, -3)
	if _, err := in.s.RunAt(ctx, def.Name, yesterday); err != nil {
		t.Fatal(err)
	}
	if st, err = in.s.Status(ctx, def.Name); err != nil {
		t.Fatal(err)
	}
	if st.Last == nil || !st.Last.Instant.Equal(yesterday) {
		t.Fatalf("Last = %+v, want the run of %v, not the future %v run early", st.Last, yesterday, tomorrow)
	}
}
