package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/examples/pushresume/db"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// childEnv makes the test binary run as an instance of the service: the
// tests start real OS processes of it, as the demo does with its own binary.
const childEnv = "PUSHRESUME_TEST_INSTANCE"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(mainArgs(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// newDB returns a fresh database with pgclaim's schema and the service's.
func newDB(t *testing.T) *pgtest.Database {
	t.Helper()
	return pgtest.NewDatabaseFrom(t, pgtest.Template{
		Name: "pushresume",
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := migrate(ctx, pool)
			return err
		},
	})
}

// logWriter sends each line written to it to t.Log.
type logWriter struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    bytes.Buffer
	all    bytes.Buffer
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			break
		}
		w.t.Log(w.prefix + strings.TrimRight(line, "\n"))
	}
	return len(p), nil
}

func (w *logWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// testInstance is a small, fast configuration of an instance.
func testInstance() instanceConfig {
	return instanceConfig{
		SendDelay: 5 * time.Millisecond,
		Batch:     5,
		// Generous against a loaded machine: a live claim
		// must not run out because a test process was not scheduled.
		Lease:       2 * time.Second,
		StaleAfter:  24 * time.Hour,
		MaxAttempts: 3,
		SweepEvery:  100 * time.Millisecond,
		Poll:        500 * time.Millisecond,
		// The workers would find READY rows by their poll only after an
		// hour: every test that sends its pushes shows that the table's
		// trigger announced them (the resume, the sweeps giving a dead
		// instance's claims back) and that the workers claimed on it.
		WorkerPoll: time.Hour,
		CatchUp:    time.Hour,
	}
}

// childEnvs is the environment added for instance processes. Under the race
// detector, a process sleeps a second at exit unless told otherwise.
func childEnvs() []string {
	return []string{childEnv + "=1", "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")}
}

func childExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// newHarness returns an orchestrator on d for driving instances by hand.
func newHarness(t *testing.T, d *pgtest.Database, ic instanceConfig) *orchestrator {
	t.Helper()
	out := &logWriter{t: t}
	o := &orchestrator{
		cfg: demoConfig{
			Instance: ic, Exe: childExe(t), Env: childEnvs(),
			Out: out, Stderr: &logWriter{t: t, prefix: "stderr: "},
		},
		start: time.Now(), out: out, events: make(chan procEvent, 256),
		pool: d.Pool, q: db.New(d.Pool), url: d.URL,
	}
	t.Cleanup(o.shutdown)
	return o
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// checkSentOnce asserts, from the database, that every push is SENT and was
// sent exactly once, under the fencing token of its final claim.
func checkSentOnce(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pushes, failed int) {
	t.Helper()
	// FAILED rows (the stuck ones the 24-hour rule fails) are counted apart.
	var total, sent, processing, paused, sends, distinct, dups, staleFence int
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM push_requests WHERE status <> 'FAILED'),
		(SELECT count(*) FROM push_requests WHERE status = 'SENT'),
		(SELECT count(*) FROM push_requests WHERE status = 'PROCESSING'),
		(SELECT count(*) FROM push_requests WHERE status IN ('PAUSED', 'READY')),
		(SELECT count(*) FROM sent_pushes),
		(SELECT count(DISTINCT push_id) FROM sent_pushes),
		(SELECT count(*) FROM (SELECT push_id FROM sent_pushes GROUP BY push_id HAVING count(*) > 1) d),
		(SELECT count(*) FROM sent_pushes s JOIN push_requests p ON p.id = s.push_id WHERE s.fence <> p.fence)`).
		Scan(&total, &sent, &processing, &paused, &sends, &distinct, &dups, &staleFence)
	if err != nil {
		t.Fatal(err)
	}
	if total != pushes || sent != pushes {
		t.Errorf("push_requests: %d rows not FAILED, %d SENT; want %d SENT", total, sent, pushes)
	}
	var nFailed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM push_requests WHERE status = 'FAILED'`).Scan(&nFailed); err != nil {
		t.Fatal(err)
	}
	if nFailed != failed {
		t.Errorf("%d rows FAILED, want %d", nFailed, failed)
	}
	if processing != 0 || paused != 0 {
		t.Errorf("left PROCESSING %d, PAUSED or READY %d; want 0 and 0", processing, paused)
	}
	if sends != pushes || distinct != pushes || dups != 0 {
		t.Errorf("sent_pushes: %d sends of %d distinct pushes, %d sent more than once; want %d, %d, 0", sends, distinct, dups, pushes, pushes)
	}
	if staleFence != 0 {
		t.Errorf("%d sends carry a fencing token other than their row's final claim", staleFence)
	}
}

func settled(ctx context.Context, o *orchestrator) func() (bool, error) {
	return func() (bool, error) {
		st, err := o.states(ctx)
		return err == nil && st["PAUSED"] == 0 && st["READY"] == 0 && st["PROCESSING"] == 0, err
	}
}

func stopAll(t *testing.T, ctx context.Context, o *orchestrator) {
	t.Helper()
	if err := o.stopAll(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range o.procs {
		if !p.killed && p.err != nil {
			t.Errorf("%s exited with %v", p.label, p.err)
		}
	}
}

// The demo command, end to end with small sizes: two instance processes whose
// workers both send the resumed pushes, the runner of the 09:00 run killed
// mid-run, the other instance taking over; exit status 0.
func TestDemo(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	out := &logWriter{t: t}
	ic := testInstance()
	res, err := runDemo(testCtx(t, 2*time.Minute), demoConfig{
		DatabaseURL: d.URL,
		Pushes:      60,
		Stuck:       2,
		Instance:    ic,
		Timeout:     time.Minute,
		Exe:         childExe(t),
		Env:         childEnvs(),
		Out:         out,
		Stderr:      &logWriter{t: t, prefix: "stderr: "},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Fatalf("invariants failed: %v", res.Failures)
	}
	if res.Killed == nil || res.Killed.attempt != 1 {
		t.Fatalf("killed %v, want the runner of attempt 1 killed mid-run", res.Killed)
	}
	if res.KilledMid == 0 {
		t.Error("the Active left no row PROCESSING when killed; the kill was not mid-run")
	}
	if res.States["SENT"] != 60 || res.States["FAILED"] != 2 || res.Duplicates != 0 || res.Early != 0 {
		t.Errorf("states %v, duplicates %d, sent before 09:00 %d; want 60 SENT, 2 FAILED, 0, 0", res.States, res.Duplicates, res.Early)
	}
	if r := res.Run; r == nil || r.State != "succeeded" || r.Attempt != 2 || deref(r.Holder) == res.Killed.holder {
		t.Errorf("the 09:00 row %+v; want succeeded at attempt 2 by the instance not killed", r)
	}
	var tookOver bool
	for _, r := range procRows(res) {
		switch {
		case r.label == res.Killed.label:
			// It resumed every push, and its worker sent some before
			// it died.
			if r.resumed != 60 || r.sent == 0 {
				t.Errorf("%s resumed %d and sent %d; want 60 resumed, some sent", r.label, r.resumed, r.sent)
			}
		case r.role == "completed the run as attempt 2" && r.resumed == 0 && r.sent > 0:
			// Nothing left to resume: it sent the rest, the dead
			// worker's claims among them.
			tookOver = true
		}
	}
	if !tookOver {
		t.Error("the other instance did not complete the run as attempt 2 and send the rest")
	}
	// Both workers started pushes after the resume: how soon is printed,
	// not asserted.
	if len(res.PickupBy) != 2 {
		t.Errorf("pickups measured %v; want one per instance that was running at 09:00", res.PickupBy)
	}
	t.Logf("pickup: %v (%v)", res.Pickup, res.PickupBy)
	checkSentOnce(t, context.Background(), d.Pool, 60, 2)
	for _, want := range []string{
		"worker: claims when the table's trigger announces rows",
		"resumed 60 pushes in one statement",
		"first push started",
		"took the run over", "attempt 2 is mine", "(killed)", "→ READY",
		"duplicate sends                0", "pushes sent before 09:00       0", "rows left PROCESSING           0",
		"rows left READY                0", "pickup", "OK:",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// Two instance processes start together on an empty database (both migrate
// at once) and register the same schedule: at its instant one of them runs
// it, the ledger holds one row (succeeded at attempt 1), the resume moves
// every push once, both workers hear of it from the table's trigger and
// send, and every push is sent once.
func TestTwoInstancesOneRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	d := pgtest.NewDatabaseFrom(t, pgtest.Template{Name: "pushresume_empty", Unmigrated: true})
	const pushes = 40
	o := newHarness(t, d, testInstance())
	var applied []string
	modes := map[*proc]string{}
	o.onEvent = func(p *proc, e event) {
		if e.Ev == evReady && e.Msg != "" {
			applied = append(applied, e.Msg)
		}
		if e.Ev == evWorker {
			modes[p] = e.Msg
		}
	}
	a, err := o.startInstance("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := o.startInstance("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.wait(ctx, "both to be ready", func() bool { return a.ready && b.ready }, nil); err != nil {
		t.Fatal(err)
	}
	// Each migration is recorded once, and the service's own was applied
	// by exactly one of the two.
	var dupVersions int
	if err := d.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) - count(DISTINCT version_id) FROM pgclaim_schema_version) +
		(SELECT count(*) - count(DISTINCT version_id) FROM pushresume_schema_version)`).Scan(&dupVersions); err != nil {
		t.Fatal(err)
	}
	if dupVersions != 0 {
		t.Errorf("%d migrations recorded twice", dupVersions)
	}
	for _, m := range []string{"00001_push_requests.sql", "00002_push_requests_ready.sql"} {
		if own := strings.Count(strings.Join(applied, ","), m); own != 1 {
			t.Errorf("the service's migration %s reported applied %d times (%q); want once", m, own, applied)
		}
	}
	if _, err := o.q.SeedPaused(ctx, pushes); err != nil {
		t.Fatal(err)
	}
	now, err := o.q.DatabaseNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o.fireAt = now.Add(2 * time.Second).Truncate(time.Second)
	for _, p := range []*proc{a, b} {
		if err := p.setClock(o.fireAt); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.wait(ctx, "the run to end", func() bool { return a.finished != "" || b.finished != "" }, nil); err != nil {
		t.Fatal(err)
	}
	if err := o.wait(ctx, "every push to settle", never, settled(ctx, o)); err != nil {
		t.Fatal(err)
	}
	stopAll(t, ctx, o)

	runs, err := o.q.ScheduleRuns(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || !runs[0].Instant.Equal(o.fireAt) || runs[0].State != "succeeded" || runs[0].Attempt != 1 {
		t.Fatalf("ledger %+v; want one row for %v, succeeded at attempt 1", runs, o.fireAt)
	}
	runner, other := a, b
	if b.holder == deref(runs[0].Holder) {
		runner, other = b, a
	}
	if runner.holder != deref(runs[0].Holder) {
		t.Fatalf("ledger holder %q is neither instance (%q, %q)", deref(runs[0].Holder), a.holder, b.holder)
	}
	r, w := runner.stopped, other.stopped
	if r == nil || w == nil {
		t.Fatalf("counts: runner %+v, other %+v; want both stopped cleanly", r, w)
	}
	if r.Attempts != 1 || r.Completed != 1 || w.Attempts != 0 {
		t.Errorf("counts: runner %+v, other %+v; want one attempt, by the runner", r, w)
	}
	if r.Resumed != pushes || w.Resumed != 0 {
		t.Errorf("resumed: runner %d, other %d; want %d by the runner's one statement", r.Resumed, w.Resumed, pushes)
	}
	// The instances are alike: each worker claims what it can, whichever
	// instance ran the resume.
	if r.Claimed+w.Claimed != pushes || r.Sent+w.Sent != pushes || r.Sent == 0 || w.Sent == 0 {
		t.Errorf("workers: runner claimed %d and sent %d, other claimed %d and sent %d; want %d in all, some by each",
			r.Claimed, r.Sent, w.Claimed, w.Sent, pushes)
	}
	for _, p := range []*proc{a, b} {
		if !strings.HasPrefix(modes[p], "claims when the table's trigger announces rows") {
			t.Errorf("%s's worker: %q; want it to claim on the trigger's announcements", p.label, modes[p])
		}
	}
	checkSentOnce(t, ctx, d.Pool, pushes, 0)
	if early, err := o.q.CountSentBefore(ctx, o.fireAt); err != nil || early != 0 {
		t.Errorf("%d pushes sent before the instant (%v); want 0", early, err)
	}
}

// The runner of the instant is killed mid-run: the other instance takes the
// run over as attempt 2 and is killed mid-run too, both workers holding
// claims. A server starting afterwards sweeps the stuck rows back to READY
// at start-up (its worker claims them at once) and completes the instant as
// attempt 3, the last the schedule allows. Nothing is left PROCESSING,
// nothing is sent twice, and the ledger holds the instant once.
func TestKillMidRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	d := newDB(t)
	const pushes = 80
	if _, err := db.New(d.Pool).SeedPaused(ctx, pushes); err != nil {
		t.Fatal(err)
	}
	ic := testInstance()
	// Slow sends: the worker of attempt 2's instance, alone once the first
	// is killed, must still be sending when the takeover comes.
	ic.SendDelay = 50 * time.Millisecond
	o := newHarness(t, d, ic)
	processingBy := func(holder string) int {
		var n int
		if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM push_requests WHERE status = 'PROCESSING' AND claimed_by = $1`, holder).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	a, err := o.startInstance("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := o.startInstance("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.wait(ctx, "both to be ready", func() bool { return a.ready && b.ready }, nil); err != nil {
		t.Fatal(err)
	}
	now, err := o.q.DatabaseNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o.fireAt = now.Add(2 * time.Second).Truncate(time.Second)
	for _, p := range []*proc{a, b} {
		if err := p.setClock(o.fireAt); err != nil {
			t.Fatal(err)
		}
	}

	// 1. Kill the runner of attempt 1 in the middle of its run.
	var first, second *proc
	if err := o.wait(ctx, "attempt 1 to be mid-run", func() bool {
		for _, p := range []*proc{a, b} {
			if p.attempt == 1 && (p.sending >= 8 || p.finished != "") {
				first = p
				return true
			}
		}
		return false
	}, nil); err != nil {
		t.Fatal(err)
	}
	second = a
	if first == a {
		second = b
	}
	if first.finished != "" {
		t.Fatalf("%s finished attempt 1 (%s); want it mid-run", first.label, first.finished)
	}
	if err := first.kill(); err != nil {
		t.Fatal(err)
	}
	if second.attempt != 0 {
		t.Fatalf("%s ran attempt %d while attempt 1 ran", second.label, second.attempt)
	}
	if n := processingBy(first.holder); n == 0 {
		t.Fatal("attempt 1 left nothing PROCESSING; the kill was not mid-run")
	}

	// 2. The other instance takes the run over as attempt 2 (its worker
	// has been sending all along). Kill it too, in the middle of a send.
	if err := o.wait(ctx, "attempt 2 to start", func() bool { return second.attempt == 2 }, nil); err != nil {
		t.Fatal(err)
	}
	n := second.sending
	if err := o.wait(ctx, "attempt 2 to be mid-run", func() bool { return second.sending >= n+2 }, nil); err != nil {
		t.Fatal(err)
	}
	if second.fence <= first.fence {
		t.Errorf("attempt 2's fence %d is not above attempt 1's %d", second.fence, first.fence)
	}
	if err := second.kill(); err != nil {
		t.Fatal(err)
	}
	if n := processingBy(second.holder); n == 0 {
		t.Fatal("attempt 2 left nothing PROCESSING; the kill was not mid-run")
	}

	// 3. Once the dead instances' leases have run out, a server starts: its
	// start-up sweep must move every stuck row, whoever held it.
	var stuck int
	if err := o.wait(ctx, "the dead instances' leases to run out", never, func() (bool, error) {
		var live int
		err := d.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE lease_until >= now()), count(*)
			FROM push_requests WHERE status = 'PROCESSING'`).Scan(&live, &stuck)
		return live == 0, err
	}); err != nil {
		t.Fatal(err)
	}
	if stuck == 0 {
		t.Fatal("nothing stuck before the restart")
	}
	var startup *event
	c, err := o.startInstance("c")
	if err != nil {
		t.Fatal(err)
	}
	// Record c's start-up sweep as it goes by.
	for startup == nil {
		select {
		case pe := <-o.events:
			if err := o.handle(pe); err != nil {
				t.Fatal(err)
			}
			if pe.p == c && pe.e.Ev == evSwept && pe.e.Rule == ruleStartup {
				e := pe.e
				startup = &e
			}
		case <-ctx.Done():
			t.Fatal("no start-up sweep from c")
		}
	}
	if startup.N != stuck || startup.To["READY"] != stuck {
		t.Errorf("c's start-up sweep moved %d rows (%v); want all %d stuck rows back to READY", startup.N, startup.To, stuck)
	}
	if startup.By[second.holder] == 0 {
		t.Errorf("c's start-up sweep moved no row of %s (%v)", second.label, startup.By)
	}

	// 4. c takes the run over from the dead attempt 2 and completes it.
	if err := o.wait(ctx, "c to complete the run", func() bool { return c.finished == "succeeded" }, nil); err != nil {
		t.Fatal(err)
	}
	if err := o.wait(ctx, "every push to settle", never, settled(ctx, o)); err != nil {
		t.Fatal(err)
	}
	stopAll(t, ctx, o)

	checkSentOnce(t, ctx, d.Pool, pushes, 0)
	runs, err := o.q.ScheduleRuns(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].State != "succeeded" || runs[0].Attempt != 3 || deref(runs[0].Holder) != c.holder ||
		runs[0].Fence == nil || *runs[0].Fence <= second.fence {
		t.Errorf("ledger %+v; want one row, succeeded at attempt 3 by %s with a fence above %d", runs, c.holder, second.fence)
	}
	if c.stopped == nil || c.stopped.Attempts != 1 || c.stopped.Completed != 1 || c.attempt != 3 {
		t.Errorf("c's counts %+v, attempt %d; want one attempt, the third, completed", c.stopped, c.attempt)
	}
}

// The service's migration 00002 attaches pgclaim's trigger to rows entering
// READY, and only READY: pausing a push announces nothing (no worker may
// send it before 09:00); the resume announces its rows, once for the
// statement, at its commit.
func TestResumeAnnounced(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	d := newDB(t)
	q := db.New(d.Pool)
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The trigger's channel, as migration 00014 of pgclaim names it.
	var channel string
	if err := d.Pool.QueryRow(ctx, `SELECT 'pgclaim_claim_' || 'push_requests'::regclass::oid`).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}

	// Notifications arrive in commit order: had pausing announced
	// anything, it would come before the marker.
	if _, err := q.SeedPaused(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "marker" {
		t.Fatalf("after pausing pushes, heard %q first; want nothing before the marker", got)
	}
	now, err := q.DatabaseNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.ResumePaused(ctx, now); err != nil || n != 3 {
		t.Fatalf("resume moved %d rows (%v); want 3", n, err)
	}
	if _, err := d.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "READY" {
		t.Errorf("after the resume, heard %q; want READY", got)
	}
	if got := next(); got != "marker" {
		t.Errorf("after the resume's announcement, heard %q; want one announcement for the statement", got)
	}
}

// The demo's clock moves the daily 09:00 in Seoul to an instant's time of
// day there, to the second; the production spec stays otherwise.
func TestDemoSpec(t *testing.T) {
	at := time.Date(2026, 12, 1, 13, 20, 5, 0, time.UTC) // 22:20:05 in Seoul
	if got, err := demoSpec(at); got != "5 20 22 * * *" || err != nil {
		t.Errorf("demoSpec(%v) = %q, %v; want %q", at, got, err, "5 20 22 * * *")
	}
	if d, err := definition(time.Time{}, time.Hour); err != nil || d.Spec != "0 9 * * *" || d.TimeZone != "Asia/Seoul" {
		t.Errorf("definition: spec %q in %q (%v); want \"0 9 * * *\" in Asia/Seoul", d.Spec, d.TimeZone, err)
	}
}

// The service's own definition (the field's spec and zone, its policies)
// is accepted and stored as declared.
func TestDefinitionRegisters(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	d := newDB(t)
	def, err := definition(time.Time{}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s, err := schedule.New(d.Pool, schedule.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, def, func(context.Context, schedule.Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var spec, tz, catchUp, overlap string
	var attempts int
	if err := d.Pool.QueryRow(ctx, `SELECT spec, time_zone, catch_up, overlap, max_attempts
		FROM pgclaim_schedules WHERE name = $1`, job).Scan(&spec, &tz, &catchUp, &overlap, &attempts); err != nil {
		t.Fatal(err)
	}
	if spec != "0 9 * * *" || tz != "Asia/Seoul" || catchUp != "latest" || overlap != "skip" || attempts != 3 {
		t.Errorf("stored %q in %q, catch-up %s, overlap %s, %d attempts; want the definition as declared", spec, tz, catchUp, overlap, attempts)
	}
}

// The demo refuses a database whose push_requests it did not create, and
// bad flags, with an error naming the problem.
func TestDemoRefuses(t *testing.T) {
	t.Parallel()
	d := pgtest.NewDatabase(t)
	ctx := testCtx(t, time.Minute)
	if _, err := d.Pool.Exec(ctx, `CREATE TABLE push_requests (id int)`); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := mainArgs([]string{"--database-url", d.URL}, nil, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "push_requests table this demo did not create") {
		t.Errorf("foreign push_requests: exit %d, stderr %q", code, stderr.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pushes", "0"}, "--pushes"},
		{[]string{"--kill-after", "500"}, "--kill-after"},
		{[]string{"--send-delay", "3s"}, "--send-delay"},
		{[]string{"--poll", "0s"}, "--poll"},
		{[]string{"--worker-poll", "0s"}, "--worker-poll"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		stderr.Reset()
		if code := mainArgs(c.args, nil, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error naming %s", c.args, code, stderr.String(), c.want)
		}
	}
	stderr.Reset()
	if code := mainArgs([]string{"--help"}, nil, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "Active and Standby") {
		t.Errorf("--help: exit %d, output %q", code, stderr.String())
	}
}
