package schedule

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/internal/grants"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestFullServerBackedOff runs a scheduler as an application role whose
// connection limit leaves it no room (the server answers 53300, as a full
// server does), then lifts the limit: while refused, the scheduler backs
// off and reports the episode once, not a warning per schedule and
// poll; every instant due meanwhile has a row; once connections free up,
// every instant runs, each once.
func TestFullServerBackedOff(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	app := roletest.New(t, db, "GRANT SELECT, INSERT ON effects TO ROLE")
	if err := app.Grant(ctx, grants.Statements(app.Name, "public")...); err != nil {
		t.Fatal(err)
	}
	admin, err := db.Server.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	limit := func(n int) {
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER ROLE %s CONNECTION LIMIT %d", app.Ident(), n)); err != nil {
			t.Fatal(err)
		}
	}
	sep := "?"
	if strings.Contains(app.URL, "?") {
		sep = "&"
	}
	pool, err := pgxpool.New(ctx, app.URL+sep+"pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ev := &events{}
	s, err := New(pool, Config{Holder: "full", Logger: testLogger(t), Hooks: ev, PollInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const schedules = 5
	for j := range schedules {
		if err := s.Register(ctx, Definition{Name: fmt.Sprintf("full-%d", j), Spec: "*/2 * * * * *", Version: 1, CatchUp: CatchUpAll, CatchUpWindow: time.Minute}, effect(pool)); err != nil {
			t.Fatal(err)
		}
	}
	pool.Reset()
	app.Pool.Reset()
	limit(0)
	in := &instance{s: s, pool: pool}
	from := dbNow(t, db.Pool).Add(2 * time.Second).Truncate(2 * time.Second)
	in.start(t)
	time.Sleep(5 * time.Second)
	refused := len(ev.of(EventRefused))
	limit(-1)
	lifted := dbNow(t, db.Pool)
	to := lifted.Add(6 * time.Second).Truncate(2 * time.Second)
	var due, recorded, after, succeededAfter, doubled int
	count := func() {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `
		WITH due AS (
			SELECT s.name, i AS instant FROM pgclaim_schedules s,
				generate_series($1::timestamptz, $2::timestamptz, interval '2 seconds') i)
		SELECT count(*), count(r.state),
			count(*) FILTER (WHERE due.instant > $3),
			count(*) FILTER (WHERE due.instant > $3 AND (r.state = 'succeeded' OR r.state = 'skipped' AND r.reason LIKE 'overlap:%')),
			count(*) FILTER (WHERE (SELECT count(*) FROM effects e WHERE e.schedule = due.name AND e.instant = due.instant) > 1)
		FROM due LEFT JOIN pgclaim_schedule_runs r ON r.schedule = due.name AND r.instant = due.instant`,
			from, to, lifted).Scan(&due, &recorded, &after, &succeededAfter, &doubled); err != nil {
			t.Fatal(err)
		}
	}
	// Once connections free up, everything due runs (or, on a loaded
	// machine, is skipped by the overlap policy while the backlog's runs
	// finish: decided and reported, never left open): within the back-off
	// (up to 30 s) and however slow the machine is.
	deadline := time.Now().Add(90 * time.Second)
	for count(); (recorded != due || succeededAfter != after || dbNow(t, db.Pool).Before(to.Add(time.Second))) && time.Now().Before(deadline); count() {
		time.Sleep(200 * time.Millisecond)
	}
	in.stop()

	t.Logf("while refused: %d EventRefused", refused)
	if refused == 0 || refused > 2 {
		t.Errorf("%d EventRefused in 5 s of refusals, want one for the episode (two at most)", refused)
	}
	t.Logf("%d instants due, %d recorded; %d due after the limit was lifted, %d succeeded or skipped by the overlap policy", due, recorded, after, succeededAfter)
	if recorded != due || after == 0 || succeededAfter != after || doubled != 0 {
		t.Errorf("%d instants due, %d recorded; after the limit was lifted %d due, %d succeeded or skipped by the overlap policy; %d with more than one effect", due, recorded, after, succeededAfter, doubled)
		rows, err := db.Pool.Query(ctx, `SELECT format('%s %s %s attempt %s holder %s reason %s', schedule, instant, state, attempt, holder, reason)
			FROM pgclaim_schedule_runs WHERE instant BETWEEN $1 AND $2 AND state <> 'succeeded' ORDER BY instant, schedule`, from, to)
		if err == nil {
			for rows.Next() {
				var line string
				_ = rows.Scan(&line)
				t.Log(line)
			}
			rows.Close()
		}
	}
}
