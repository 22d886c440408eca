package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// registerSchedules stores defs as a service instance would (no Run).
func registerSchedules(t *testing.T, db *pgtest.Database, defs ...schedule.Definition) {
	t.Helper()
	s, err := schedule.New(db.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range defs {
		if err := s.Register(context.Background(), d, func(context.Context, schedule.Run) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

func countRuns(t *testing.T, db *pgtest.Database, name, kind string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgclaim_schedule_runs WHERE schedule = $1 AND kind = $2`, name, kind).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSchedulesList(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	r := cli(t, "", "schedules", "list", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "no schedules stored\n" {
		t.Errorf("no schedules: %q", r.stdout)
	}
	r = cli(t, "", "schedules", "list", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "[]\n" {
		t.Errorf("no schedules, JSON: %q", r.stdout)
	}

	registerSchedules(t, db,
		schedule.Definition{Name: "push-resume", Spec: "0 9 * * *", TimeZone: "Europe/Berlin", Version: 3},
		schedule.Definition{Name: "report", Spec: "*/5 * * * *", Version: 1})
	exec1(t, db, `
INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, attempt, fence, missed, created_at, started_at, finished_at, reason) VALUES
 ('push-resume', '2026-11-29 08:00Z', 'scheduled', 'succeeded', 1, 5, false, now(), '2026-11-29 08:00:00.01Z', '2026-11-29 08:00:02Z', NULL),
 ('push-resume', '2026-11-30 08:00Z', 'scheduled', 'failed', 3, 9, true, now(), '2026-11-30 08:03:00Z', '2026-11-30 08:03:01Z', E'attempt 3 of 3: smtp\nreset')`)
	r = cli(t, "", "schedules", "pause", "report", "--note", "provider outage", "--by", "alice", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "pause", r.stdout, "paused report since ", " by alice: provider outage\n")

	r = cli(t, "", "schedules", "list", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("list:\n%s", r.stdout)
	}
	for _, h := range []string{"NAME", "SPEC", "ZONE", "VERSION", "NEXT DUE", "LAST RUN", "STATE", "ATTEMPT", "MISSED", "LATE", "OVERDUE", "OPEN", "DELETED TO", "KEPT", "PAUSED"} {
		wantContains(t, "header", lines[0], h)
	}
	wantContains(t, "push-resume row", lines[1], "push-resume  0 9 * * *", "Europe/Berlin  3 ", "2026-11-30 08:00:00Z", "failed", "  3  ", "  1  ", "  0  ", "  -")
	wantContains(t, "report row", lines[2], "report ", "*/5 * * * *", "UTC", " by alice: provider outage")

	r = cli(t, "", "schedules", "list", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "JSON", r.stdout, `"name": "push-resume"`, `"time_zone": "Europe/Berlin"`, `"next_due": "`, `"last": {`,
		`"missed_unrecorded": 0`, `"paused_note": null`, `"paused_by": "alice"`, `"db_now": "`)
	all := decodeJSON[[]scheduleJSON](t, r.stdout)
	if len(all) != 2 {
		t.Fatalf("JSON: %+v", all)
	}
	p, rep := all[0], all[1]
	want := lastRunJSON{Instant: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), Kind: "scheduled", State: "failed", Attempt: 3}
	if p.Name != "push-resume" || p.Spec != "0 9 * * *" || p.Version != 3 || p.Last == nil || p.Last.Instant != want.Instant ||
		p.Last.State != want.State || p.Last.Attempt != 3 || p.Last.Reason == nil || *p.Last.Reason != "attempt 3 of 3: smtp\nreset" ||
		p.Last.StartedAt == nil || p.Last.FinishedAt == nil || p.Missed != 1 || p.MissedUnrecorded != 0 || p.OpenRuns != 0 || p.Paused ||
		p.PausedAt != nil || p.NextDue == nil || !p.NextDue.After(p.DBNow) {
		t.Errorf("push-resume = %+v (last %+v)", p, p.Last)
	}
	if berlin, _ := time.LoadLocation("Europe/Berlin"); p.NextDue != nil && p.NextDue.In(berlin).Hour() != 9 {
		t.Errorf("push-resume next due %v is not 09:00 in Berlin", p.NextDue)
	}
	// How far retention (or Prune) has deleted: DELETED TO, pruned_until.
	// And how long runs are kept, as a scheduler's retention pass reported
	// it: KEPT, retention.
	exec1(t, db, `UPDATE pgclaim_schedules SET pruned_until = '2026-11-28 08:00Z', retention_us = 604800000000 WHERE name = 'push-resume'`)
	exec1(t, db, `UPDATE pgclaim_schedules SET retention_us = -1 WHERE name = 'report'`)
	r = cli(t, "", "schedules", "list", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "push-resume row after retention", strings.Split(r.stdout, "\n")[1], "push-resume ", "2026-11-28 08:00:00Z", " 7d ")
	wantContains(t, "report row after retention", r.stdout, " keep all ")
	r = cli(t, "", "schedules", "list", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "JSON after retention", r.stdout, `"pruned_until": "2026-11-28T08:00:00Z"`, `"pruned_until": null`,
		`"retention": "168h0m0s"`, `"retention": "keep"`)
	exec1(t, db, `UPDATE pgclaim_schedules SET pruned_until = NULL, retention_us = NULL`)
	if rep.Name != "report" || rep.Last != nil || !rep.Paused || rep.PausedBy == nil || *rep.PausedBy != "alice" ||
		rep.PausedNote == nil || *rep.PausedNote != "provider outage" || rep.PausedAt == nil || rep.NextDue == nil ||
		rep.NextDue.Sub(rep.DBNow) > 5*time.Minute {
		t.Errorf("report = %+v", rep)
	}
}

func TestSchedulesPauseResumeTrigger(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "report", Spec: "@daily", Version: 1})

	r := cliEnv(t, strings.NewReader(""), map[string]string{"USER": "bob"}, "schedules", "pause", "report", "--note", "migration", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	st := decodeJSON[scheduleJSON](t, r.stdout)
	if !st.Paused || st.PausedBy == nil || *st.PausedBy != "bob" || st.PausedNote == nil || *st.PausedNote != "migration" || st.PausedAt == nil {
		t.Errorf("pause --json: %+v", st)
	}
	r = cli(t, "", "schedules", "resume", "report", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "resume", r.stdout, "resumed report (paused since ", "); next due ")
	r = cli(t, "", "schedules", "resume", "report", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "report was not paused: nothing changed\n" {
		t.Errorf("resume again: %q", r.stdout)
	}
	r = cli(t, "", "schedules", "resume", "report", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if st := decodeJSON[scheduleJSON](t, r.stdout); st.Paused || st.PausedAt != nil {
		t.Errorf("resume --json: %+v", st)
	}

	r = cli(t, "", "schedules", "trigger", "report", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	first := decodeJSON[triggerJSON](t, r.stdout)
	if first.Schedule != "report" || !first.Created || first.Instant.IsZero() {
		t.Errorf("trigger: %+v", first)
	}
	r = cli(t, "", "schedules", "trigger", "report", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := fmt.Sprintf("report: triggered run %s already open: not triggered again\n", fmtTime(first.Instant)); r.stdout != want {
		t.Errorf("trigger again: %q, want %q", r.stdout, want)
	}
	if n := countRuns(t, db, "report", "triggered"); n != 1 {
		t.Errorf("%d triggered runs, want 1", n)
	}
}

func TestSchedulesBackfill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "report", Spec: "0 6 * * *", Version: 1})
	args := []string{"schedules", "backfill", "report", "--from", "2026-03-01 06:00", "--to", "2026-03-04T06:00:00Z", "--database-url", db.URL}

	r := cli(t, "", args...)
	wantCode(t, r, exitOK)
	want := `dry run: would record 3 instants of report in (2026-03-01 06:00:00Z, 2026-03-04 06:00:00Z] as backfill runs
  2026-03-02 06:00:00Z
  2026-03-03 06:00:00Z
  2026-03-04 06:00:00Z
nothing recorded: pass --yes to record them
`
	if r.stdout != want {
		t.Errorf("dry run:\n%s\nwant:\n%s", r.stdout, want)
	}
	if n := countRuns(t, db, "report", "backfill"); n != 0 {
		t.Fatalf("the dry run recorded %d runs", n)
	}

	r = cli(t, "", append(args, "--yes", "--max", "2", "--json")...)
	wantCode(t, r, exitOK)
	res := decodeJSON[backfillJSON](t, r.stdout)
	if res.DryRun || len(res.Instants) != 2 || !res.Instants[0].Equal(time.Date(2026, 3, 2, 6, 0, 0, 0, time.UTC)) || res.LeftOut != 1 || res.Present != 0 ||
		res.Clamped || !res.Until.Equal(time.Date(2026, 3, 4, 6, 0, 0, 0, time.UTC)) || !res.From.Equal(time.Date(2026, 3, 1, 6, 0, 0, 0, time.UTC)) {
		t.Errorf("backfill --yes --max 2: %+v", res)
	}

	// Two operators backfill overlapping ranges at once: each instant once.
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, rng := range [][2]string{{"2026-03-01", "2026-03-10"}, {"2026-03-05", "2026-03-15"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = cli(t, "", "schedules", "backfill", "report", "--from", rng[0], "--to", rng[1], "--yes", "--json", "--database-url", db.URL)
		}()
	}
	wg.Wait()
	recorded := 0
	for _, r := range results {
		wantCode(t, r, exitOK)
		recorded += len(decodeJSON[backfillJSON](t, r.stdout).Instants)
	}
	// (1 Mar, 15 Mar]: 14 instants at 06:00, 2 recorded before.
	if n := countRuns(t, db, "report", "backfill"); recorded != 12 || n != 14 {
		t.Errorf("overlapping backfills recorded %d (want 12); %d backfill rows (want 14)", recorded, n)
	}

	r = cli(t, "", append(args, "--yes")...)
	wantCode(t, r, exitOK)
	if want := "recorded 0 instants of report in (2026-03-01 06:00:00Z, 2026-03-04 06:00:00Z] as backfill runs\n" +
		"3 instants already in the ledger: left as they are\n"; r.stdout != want {
		t.Errorf("again:\n%s\nwant:\n%s", r.stdout, want)
	}

	// A range reaching past the schedule's frontier is cut back to it.
	r = cli(t, "", "schedules", "backfill", "report", "--from", "now-72h", "--to", "now+48h", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if res := decodeJSON[backfillJSON](t, r.stdout); !res.Clamped || !res.Until.Before(res.To) || !res.DryRun || res.Cut != 2 || res.CutMore {
		t.Errorf("past the frontier: %+v; want 2 instants cut", res)
	}
	r = cli(t, "", "schedules", "backfill", "report", "--from", "now-72h", "--to", "now+48h", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "2 instants in (") || !strings.Contains(r.stdout, "are the scheduler's") {
		t.Errorf("past the frontier, the text does not say what was cut:\n%s", r.stdout)
	}
}

// A backfill's --max is bounded unless --above-limit; a recorded backfill
// is cancelled by cancel-backfill.
func TestSchedulesBackfillBoundedAndCancelled(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "report", Spec: "0 6 * * *", Version: 1})
	args := []string{"schedules", "backfill", "report", "--from", "2026-03-01 06:00", "--to", "2026-03-04T06:00:00Z", "--database-url", db.URL}
	r := cli(t, "", append(args, "--max", "200000")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "--max 200000 is above the limit of 10000", "--above-limit")
	r = cli(t, "", append(args, "--max", "200000", "--above-limit", "--yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "recorded 3 instants")

	r = cli(t, "", "schedules", "cancel-backfill", "report", "--by", "ops", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := "cancelled 3 backfilled runs of report (2026-03-02 06:00:00Z to 2026-03-04 06:00:00Z): recorded skipped\n"; r.stdout != want {
		t.Errorf("cancel-backfill: %q, want %q", r.stdout, want)
	}
	r = cli(t, "", "schedules", "cancel-backfill", "report", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if res := decodeJSON[cancelBackfillJSON](t, r.stdout); res.Cancelled != 0 || res.First != nil {
		t.Errorf("cancel-backfill again: %+v", res)
	}
	r = cli(t, "", "schedules", "cancel-backfill", "nope", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, `no schedule named "nope"`)
}

// Every instance is down past the grace: the CLI reports the missed
// instants from the database alone.
func TestSchedulesMissed(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "tick", Spec: "* * * * * *", Version: 1})
	var now time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	exec1(t, db, `UPDATE pgclaim_schedules SET starts_at = $1`, now.Add(-5500*time.Millisecond))

	r := cli(t, "", "schedules", "missed", "tick", "--grace", "1s", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	// The CLI read now() later than the test, by however long a loaded
	// machine took to start it.
	var after time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	extra := int(after.Sub(now) / time.Second)
	m := decodeJSON[missedJSON](t, r.stdout)
	if m.Schedule != "tick" || len(m.Instants) < 4 || len(m.Instants) > 5+extra || m.More || m.Since != nil || m.GraceSeconds != 1 {
		t.Fatalf("missed --json: %+v, want the 4-%d instants due more than 1 s ago", m, 5+extra)
	}
	for _, in := range m.Instants {
		if !in.After(now.Add(-5500*time.Millisecond)) || in.After(after.Add(-time.Second)) {
			t.Errorf("missed instant %v outside (starts_at, now-grace]", in)
		}
	}
	r = cli(t, "", "schedules", "missed", "tick", "--grace", "1s", "--limit", "2", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "missed", r.stdout, "2 missed instants of tick due past the grace of 1s and recorded by no instance:\n  "+fmtTime(m.Instants[0])+"\n", "… and more (raise --limit, or --since ")
	r = cli(t, "", "schedules", "missed", "tick", "--since", m.Instants[len(m.Instants)-1].Format(time.RFC3339Nano), "--grace", "1s", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if later := decodeJSON[missedJSON](t, r.stdout); later.Since == nil || len(later.Instants) > 2 {
		t.Errorf("missed --since the last: %+v", later)
	}
	r = cli(t, "", "schedules", "list", "--grace", "1s", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if l := decodeJSON[[]scheduleJSON](t, r.stdout); len(l) != 1 || l[0].MissedUnrecorded < len(m.Instants) || l[0].Missed != l[0].MissedUnrecorded {
		t.Errorf("list: %+v", l)
	}
	r = cli(t, "", "schedules", "missed", "tick", "--grace", "1h", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "no missed instants of tick\n" {
		t.Errorf("within a grace of 1h: %q", r.stdout)
	}
}

func TestSchedulesErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "report", Spec: "@daily", Version: 1})
	notFound := "pgclaim schedules: no schedule named \"nope\"\nhint: see 'pgclaim schedules list' for the stored schedules\n"
	for _, args := range [][]string{
		{"pause", "nope", "--note", "x"},
		{"resume", "nope"},
		{"trigger", "nope"},
		{"backfill", "nope", "--from", "2026-01-01", "--to", "2026-01-05"},
		{"missed", "nope"},
		{"runs", "nope"},
	} {
		r := cli(t, "", append(append([]string{"schedules"}, args...), "--database-url", db.URL)...)
		wantCode(t, r, exitError)
		if r.stderr != notFound || r.stdout != "" {
			t.Errorf("%v: %s", args, r)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "pgclaim schedules: a subcommand is required: list, pause, resume, trigger, backfill, cancel-backfill, missed or runs\n"},
		{[]string{"frob"}, "pgclaim schedules: unknown subcommand \"frob\": want list, pause, resume, trigger, backfill, cancel-backfill, missed or runs\n"},
		{[]string{"pause", "report"}, "pgclaim schedules: --note is required\n"},
		{[]string{"trigger"}, "pgclaim schedules: the schedule's NAME is required\n"},
		{[]string{"trigger", "report", "other"}, "pgclaim schedules: unexpected argument \"other\"\n"},
		{[]string{"backfill", "report", "--to", "2026-01-05"}, "pgclaim schedules: --from is required\n"},
		{[]string{"backfill", "report", "--from", "2026-01-05", "--to", "2026-01-05"}, "pgclaim schedules: --from must be before --to, got --from 2026-01-05 00:00:00Z --to 2026-01-05 00:00:00Z\n"},
		{[]string{"backfill", "report", "--from", "2026-01-06", "--to", "2026-01-05"}, "pgclaim schedules: --from must be before --to"},
		{[]string{"backfill", "report", "--from", "2026-01-01", "--to", "2026-01-05", "--max", "0"}, "pgclaim schedules: --max must be at least 1, got 0\n"},
		{[]string{"backfill", "report", "--from", "yesterday", "--to", "2026-01-05"}, "pgclaim schedules: --from: \"yesterday\" is not a time"},
		{[]string{"missed", "report", "--limit", "0"}, "pgclaim schedules: --limit must be at least 1, got 0\n"},
		{[]string{"missed", "report", "--grace", "-1s"}, "pgclaim schedules: --grace must be positive, got -1s\n"},
		{[]string{"list", "extra"}, "pgclaim schedules: unexpected argument \"extra\"\n"},
	} {
		r := cli(t, "", append(append([]string{"schedules"}, c.args...), "--database-url", db.URL)...)
		if c.args == nil {
			r = cli(t, "", "schedules")
		}
		wantCode(t, r, exitUsage)
		if !strings.HasPrefix(r.stderr, c.want) || !strings.Contains(r.stderr, "Run 'pgclaim schedules -h' for usage.") {
			t.Errorf("%v: stderr %q, want %q", c.args, r.stderr, c.want)
		}
	}
	if n := countRuns(t, db, "report", "backfill"); n != 0 {
		t.Errorf("bad input recorded %d runs", n)
	}

	r := cli(t, "", "schedules", "-h")
	wantCode(t, r, exitOK)
	wantContains(t, "help", r.stdout, "Usage: pgclaim schedules SUBCOMMAND", "backfill NAME --from T --to T")
	r = cli(t, "", "schedules", "backfill", "-h")
	wantCode(t, r, exitOK)
	wantContains(t, "backfill -h", r.stdout, "Usage: pgclaim schedules backfill NAME", "--yes", "--max N")

	empty := unmigrated(t)
	r = cli(t, "", "schedules", "list", "--database-url", empty.URL)
	wantCode(t, r, exitError)
	wantContains(t, "unmigrated", r.stderr, "pgclaim schedules: database", "is not migrated: pgclaim's table pgclaim_schedules does not exist")
}

// TestSchedulesRuns: 'schedules runs NAME' lists the schedule's newest runs
// (instant, kind, state, attempt, holder, reason), newest first, up to
// --limit; in JSON too.
func TestSchedulesRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "push-resume", Spec: "0 9 * * *", Version: 1},
		schedule.Definition{Name: "quiet", Spec: "@daily", Version: 1})
	exec1(t, db, `
INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, attempt, fence, holder, missed, created_at, started_at, finished_at, reason) VALUES
 ('push-resume', '2026-11-28 09:00Z', 'scheduled', 'succeeded', 1, 5, 'host-a:101', false, now(), '2026-11-28 09:00:00.01Z', '2026-11-28 09:00:02Z', NULL),
 ('push-resume', '2026-11-29 09:00Z', 'scheduled', 'failed', 3, 9, 'host-b:202', false, now(), '2026-11-29 09:03:00Z', '2026-11-29 09:03:01Z', E'attempt 3 of 3: smtp\nreset'),
 ('push-resume', '2026-11-29 12:00Z', 'triggered', 'succeeded', 2, 11, 'host-a:101', false, now(), '2026-11-29 12:00:01Z', '2026-11-29 12:00:02Z', NULL)`)

	r := cli(t, "", "schedules", "runs", "push-resume", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("runs:\n%s", r.stdout)
	}
	for _, h := range []string{"INSTANT", "KIND", "STATE", "ATTEMPT", "HOLDER", "STARTED", "FINISHED", "REASON"} {
		wantContains(t, "header", lines[0], h)
	}
	wantContains(t, "newest", lines[1], "2026-11-29 12:00:00Z", "triggered", "succeeded", " 2 ", "host-a:101")
	wantContains(t, "failed", lines[2], "2026-11-29 09:00:00Z", "scheduled", "failed", " 3 ", "host-b:202", "attempt 3 of 3: smtp reset")
	wantContains(t, "oldest", lines[3], "2026-11-28 09:00:00Z", "succeeded", " 1 ", "host-a:101")

	r = cli(t, "", "schedules", "runs", "push-resume", "--limit", "1", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	runs := decodeJSON[[]runJSON](t, r.stdout)
	if len(runs) != 1 || !runs[0].Instant.Equal(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)) || runs[0].Kind != "triggered" ||
		runs[0].State != "succeeded" || runs[0].Attempt != 2 || runs[0].Holder == nil || *runs[0].Holder != "host-a:101" || runs[0].Fence != 11 {
		t.Errorf("runs --limit 1 --json = %+v", runs)
	}

	r = cli(t, "", "schedules", "runs", "quiet", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if r.stdout != "no runs of quiet recorded\n" {
		t.Errorf("no runs: %q", r.stdout)
	}
	r = cli(t, "", "schedules", "runs", "nope", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "unknown", r.stderr, `no schedule named "nope"`)
	r = cli(t, "", "schedules", "runs", "quiet", "--limit", "0", "--database-url", db.URL)
	wantCode(t, r, exitUsage)
	wantContains(t, "limit", r.stderr, "--limit must be at least 1, got 0")
}
