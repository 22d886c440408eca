package schedule

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Retention deletes each schedule's finished runs older than its retention
// (the definition's, else the scheduler's), in batches, never an open run,
// and moves pruned_until so that catch-up never records a deleted instant
// again; KeepRuns and a catch-up window as long as the retention keep
// every run.
func TestRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	logs := &recLog{}
	in := newInstance(t, db, "a", Config{Retention: 24 * time.Hour, Logger: slog.New(logs)}, nil)
	defs := []Definition{
		{Name: "short", Spec: "0 * * * *", Version: 1, Retention: 2 * time.Hour},
		{Name: "default", Spec: "0 * * * *", Version: 1},
		{Name: "kept", Spec: "0 * * * *", Version: 1, Retention: KeepRuns},
		{Name: "wide", Spec: "0 * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: 48 * time.Hour},
	}
	hour := dbNow(t, db.Pool).Truncate(time.Hour)
	for _, d := range defs {
		if err := in.s.Register(ctx, d, nop); err != nil {
			t.Fatal(err)
		}
		// Five finished runs, the past five hours.
		for h := 5; h >= 1; h-- {
			if _, err := in.s.RunAt(ctx, d.Name, hour.Add(-time.Duration(h)*time.Hour)); err != nil {
				t.Fatalf("%s: RunAt: %v", d.Name, err)
			}
		}
	}
	if len(logs.lines(slog.LevelWarn, "schedule: finished runs are kept")) != 1 {
		t.Errorf("no warning (or more than one) that the wide schedule's runs are kept: %v", logs.lines(slog.LevelWarn, "schedule:"))
	}
	// All finished 3 hours ago; the two oldest 30 hours ago.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedule_runs SET finished_at = now() - CASE WHEN instant < $1 THEN interval '30 hours' ELSE interval '3 hours' END`,
		hour.Add(-3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// An open run is never deleted.
	open, _, err := in.s.Trigger(ctx, "short")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := in.s.Status(ctx, "short"); err != nil || st.Retention != 0 {
		t.Errorf("short: Status.Retention %v (%v) before any pass, want 0", st.Retention, err)
	}
	in.s.retainBatch = 2 // several batches per schedule
	if err := in.s.retainOnce(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"short": 1, "default": 3, "kept": 5, "wide": 5}
	for name, n := range want {
		rows := runsOf(t, db.Pool, name)
		if len(rows) != n {
			t.Errorf("%s: %d runs left, want %d", name, len(rows), n)
		}
		if name == "short" && (len(rows) != 1 || !rows[0].Instant.Equal(open)) {
			t.Errorf("short: the open triggered run is not what is left: %+v", rows)
		}
	}
	var until time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT pruned_until FROM pgclaim_schedules WHERE name = 'short'`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if !until.Equal(hour.Add(-time.Hour)) {
		t.Errorf("short: pruned_until %v, want the newest instant deleted, %v", until, hour.Add(-time.Hour))
	}
	for name, want := range map[string]time.Time{"short": until, "kept": {}} {
		st, err := in.s.Status(ctx, name)
		if err != nil || !st.PrunedUntil.Equal(want) {
			t.Errorf("%s: Status.PrunedUntil %v (%v), want %v", name, st.PrunedUntil, err, want)
		}
	}
	// The pass says what it applied: the wide schedule's catch-up window
	// reaches past the age, so its runs are kept.
	for name, want := range map[string]time.Duration{"short": 2 * time.Hour, "default": 24 * time.Hour, "kept": KeepRuns, "wide": KeepRuns} {
		st, err := in.s.Status(ctx, name)
		if err != nil || st.Retention != want {
			t.Errorf("%s: Status.Retention %v (%v), want %v", name, st.Retention, err, want)
		}
	}
	if got := logs.lines(slog.LevelInfo, "schedule: old runs deleted (retention)"); len(got) != 2 {
		t.Errorf("%d info lines for two schedules with runs deleted: %v", len(got), got)
	}
	// A deleted instant is not run again.
	if _, err := in.s.RunAt(ctx, "short", hour.Add(-2*time.Hour)); !errors.Is(err, ErrRecorded) {
		t.Errorf("RunAt of a deleted instant: %v, want ErrRecorded", err)
	}
}

// Bad retention settings are refused, naming the field and the fix.
func TestRetentionInvalid(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	for _, r := range []time.Duration{-time.Second, 30 * time.Minute} {
		if _, err := New(db.Pool, Config{Retention: r}); !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: Config.Retention: ") {
			t.Errorf("Config.Retention %s: %v", r, err)
		}
	}
	in := newInstance(t, db, "a", Config{}, nil)
	d := Definition{Name: "x", Spec: "0 * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: 48 * time.Hour, Retention: 24 * time.Hour}
	err := in.s.Register(context.Background(), d, nop)
	if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: Definition.Retention: ") || !strings.Contains(err.Error(), "CatchUpWindow") {
		t.Errorf("Definition.Retention within CatchUpWindow: %v", err)
	}
}

// Each retention statement is bounded by its statement timeout: a pass
// blocked by a lock on the runs table ends with the timeout's error
// (57014) instead of waiting; failing passes are reported once per
// episode, and the pass that works again once.
func TestRetentionBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	logs := &recLog{}
	in := newInstance(t, db, "a", Config{Retention: time.Hour, Logger: slog.New(logs)}, nil)
	if err := in.s.Register(ctx, Definition{Name: "hourly", Spec: "0 * * * *", Version: 1}, nop); err != nil {
		t.Fatal(err)
	}
	hour := dbNow(t, db.Pool).Truncate(time.Hour)
	if _, err := in.s.RunAt(ctx, "hourly", hour.Add(-3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedule_runs SET finished_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE pgclaim_schedule_runs IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	failing := false
	for range 2 {
		began := time.Now()
		err := in.s.retainOnce(ctx)
		took := time.Since(began)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57014" {
			t.Fatalf("a blocked pass: %v, want the statement timeout (57014)", err)
		}
		if took < retainStatement-time.Second || took > retainStatement+5*time.Second {
			t.Fatalf("a blocked pass ended after %s, want about %s", took, retainStatement)
		}
		failing = in.s.retainReport(ctx, err, failing)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err = in.s.retainOnce(ctx)
	if failing = in.s.retainReport(ctx, err, failing); err != nil || failing {
		t.Fatalf("the pass after the lock: %v", err)
	}
	if n := len(runsOf(t, db.Pool, "hourly")); n != 0 {
		t.Errorf("%d runs left after the lock, want 0", n)
	}
	if got := logs.lines(slog.LevelWarn, "schedule: delete old runs"); len(got) != 1 {
		t.Errorf("%d warnings for one episode of two failing passes, want 1: %v", len(got), got)
	}
	if got := logs.lines(slog.LevelInfo, "schedule: deleting old runs (retention) works again"); len(got) != 1 {
		t.Errorf("%d lines for the pass that worked again, want 1", len(got))
	}
}
