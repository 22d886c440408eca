package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// seedTicks writes finished ticks with fixed times into the ledger.
func seedTicks(t *testing.T, db *pgtest.Database) {
	exec1(t, db, `
INSERT INTO pgclaim_ticks (job, fire_at, holder, fence, started_at, finished_at, outcome, error) VALUES
 ('push-resume', '2026-11-28 09:00:00Z', 'host-a:101', 3, '2026-11-28 09:00:00.004Z', '2026-11-28 09:00:01.204Z', 'succeeded', NULL),
 ('push-resume', '2026-11-29 09:00:00Z', 'host-b:202', 7, '2026-11-29 09:00:00.012Z', '2026-11-29 09:00:00.512Z', 'failed', E'smtp: connection reset\nby peer'),
 ('push-resume', '2026-11-30 09:00:00Z', 'host-a:101', 9, '2026-11-30 09:00:00.003Z', '2026-11-30 09:02:03.003Z', 'succeeded', NULL),
 ('report',      '2026-11-30 00:00:00Z', 'host-b:202', 8, '2026-11-30 00:00:00.5Z',   '2026-11-30 00:00:01.7Z',   'lost', 'gate: advisory lock lost')`)
}

func TestTicks(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)

	r := cli(t, "", "ticks", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "no ticks recorded\n" {
		t.Errorf("empty ledger: %q", r.stdout)
	}
	r = cli(t, "", "ticks", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "[]\n" {
		t.Errorf("empty ledger JSON: %q", r.stdout)
	}

	seedTicks(t, db)
	r = cli(t, "", "ticks", "--limit", "2", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	want := `JOB          FIRE AT               HOLDER      FENCE  STARTED                   DURATION  OUTCOME    ERROR
push-resume  2026-11-30 09:00:00Z  host-a:101  9      2026-11-30 09:00:00.003Z  2m3s      succeeded  -
push-resume  2026-11-29 09:00:00Z  host-b:202  7      2026-11-29 09:00:00.012Z  500ms     failed     smtp: connection reset by peer
report       2026-11-30 00:00:00Z  host-b:202  8      2026-11-30 00:00:00.5Z    1.2s      lost       gate: advisory lock lost
`
	if r.stdout != want {
		t.Errorf("ticks --limit 2:\n%s\nwant:\n%s", r.stdout, want)
	}

	r = cli(t, "", "ticks", "--job", "push-resume", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	ticks := decodeJSON[[]tickJSON](t, r.stdout)
	if len(ticks) != 3 {
		t.Fatalf("want 3 ticks of push-resume, got %+v", ticks)
	}
	var fires []string
	for _, tk := range ticks {
		if tk.Job != "push-resume" {
			t.Errorf("tick of another job: %+v", tk)
		}
		fires = append(fires, tk.FireAt.UTC().Format(time.RFC3339))
	}
	if got := strings.Join(fires, " "); got != "2026-11-30T09:00:00Z 2026-11-29T09:00:00Z 2026-11-28T09:00:00Z" {
		t.Errorf("fire times (newest first) = %s", got)
	}
	mid := ticks[1]
	if mid.Holder != "host-b:202" || mid.Fence != 7 || mid.Outcome != "failed" || mid.Error == nil ||
		*mid.Error != "smtp: connection reset\nby peer" || mid.DurationSeconds != 0.5 || mid.FinishedAt == nil ||
		!mid.StartedAt.Equal(time.Date(2026, 11, 29, 9, 0, 0, 12e6, time.UTC)) {
		t.Errorf("second tick = %+v", mid)
	}
	if ticks[0].Error != nil || ticks[0].DurationSeconds != 123 {
		t.Errorf("first tick = %+v", ticks[0])
	}

	r = cli(t, "", "ticks", "--job", "nightly", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "no ticks recorded for job \"nightly\"\n" {
		t.Errorf("unknown job: %q", r.stdout)
	}
}

// TestTicksRunning records a tick through the gate and looks at it while
// its job runs and after it failed.
func TestTicksRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	g, err := gate.New(db.Pool, gate.Config{Holder: "host-a:101"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fireAt := time.Now().Truncate(time.Second)
	started, finish := make(chan gate.Run), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Once(ctx, "push-resume", fireAt, func(ctx context.Context, run gate.Run) error {
			started <- run
			<-finish
			return errors.New("provider unavailable")
		})
	}()
	run := <-started

	r := cli(t, "", "ticks", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "ticks", r.stdout, fmt.Sprintf("push-resume  %s  host-a:101  %d ", fmtTime(fireAt), run.Fence), "  running ")

	close(finish)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "provider unavailable") {
		t.Fatalf("Once = %v", err)
	}
	r = cli(t, "", "ticks", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	ticks := decodeJSON[[]tickJSON](t, r.stdout)
	if len(ticks) != 1 || ticks[0].Outcome != "failed" || ticks[0].Error == nil || !strings.Contains(*ticks[0].Error, "provider unavailable") ||
		ticks[0].Fence != run.Fence || !ticks[0].FireAt.Equal(fireAt) || ticks[0].FinishedAt == nil || ticks[0].DurationSeconds <= 0 {
		t.Errorf("ticks = %+v", ticks)
	}
}

func TestTicksErrors(t *testing.T) {
	t.Parallel()
	empty := unmigrated(t)
	r := cli(t, "", "ticks", "--database-url", empty.URL)
	wantCode(t, r, exitError)
	if want := fmt.Sprintf("pgclaim ticks: database %q is not migrated: pgclaim's table pgclaim_ticks does not exist\n"+
		"hint: run 'pgclaim migrate up' (or call pgclaim.Migrate at start-up) to create pgclaim's tables\n", empty.Name); r.stderr != want {
		t.Errorf("unmigrated: stderr = %q, want %q", r.stderr, want)
	}

	db := pgtest.NewDatabase(t)
	exec1(t, db, `ALTER TABLE pgclaim_ticks DROP COLUMN error`)
	r = cli(t, "", "ticks", "--json", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		fmt.Sprintf("pgclaim ticks: table pgclaim_ticks in database %q has no column \"error\"\n", db.Name),
		"hint: pgclaim's schema in this database does not match this pgclaim")
	if r.stdout != "" {
		t.Errorf("stdout = %q", r.stdout)
	}
}
