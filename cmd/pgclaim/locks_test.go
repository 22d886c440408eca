package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/store"
)

// appPool opens a pool on db whose sessions carry application_name app.
func appPool(t *testing.T, db *pgtest.Database, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// appConn opens a connection on db with application_name app.
func appConn(t *testing.T, db *pgtest.Database, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func findAdvisory(list []advisoryJSON, name string, granted bool) *advisoryJSON {
	for i := range list {
		if list[i].Name == name && list[i].Granted == granted {
			return &list[i]
		}
	}
	return nil
}

func TestLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)

	r := cli(t, "", "locks", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := "LEASE LOCKS (pgclaim_locks)\n  none\n\nADVISORY LOCKS\n  none\n\nELECTIONS (open terms in pgclaim_terms)\n  none\n"; r.stdout != want {
		t.Errorf("empty database:\n%s\nwant:\n%s", r.stdout, want)
	}

	// A running tick of push-resume, its advisory lock held by the gate.
	active := appPool(t, db, "svc-active")
	g, err := gate.New(active, gate.Config{Holder: "host-a:101"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	started, finish := make(chan gate.Run), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Once(ctx, "push-resume", time.Now().Truncate(time.Second), func(ctx context.Context, run gate.Run) error {
			started <- run
			<-finish
			return nil
		})
	}()
	run := <-started
	defer func() {
		close(finish)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	jobClass, jobKey := gate.AdvisoryKey("push-resume")
	jobPID, err := store.New(db.Pool).AdvisoryHolder(ctx, store.AdvisoryHolderParams{LockClass: jobClass, LockKey: jobKey})
	if err != nil {
		t.Fatalf("advisory holder of push-resume: %v", err)
	}

	// The leader of an election, and a standby waiting for it.
	el, err := gate.NewElector(appPool(t, db, "svc-active"), "notifier", gate.ElectorConfig{Holder: "host-a:101"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := el.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	defer el.Resign(ctx)
	standby, err := gate.NewElector(appPool(t, db, "svc-standby"), "notifier", gate.ElectorConfig{Holder: "host-b:202"})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopStandby := context.WithCancel(ctx)
	standbyDone := make(chan struct{})
	go func() {
		defer close(standbyDone)
		if _, err := standby.Campaign(sctx); err == nil {
			standby.Resign(ctx)
		}
	}()
	defer func() { stopStandby(); <-standbyDone }()

	// A held lease, and one that expired.
	lease, err := gate.NewLease(db.Pool, "report-lease", gate.LeaseConfig{
		Holder: "host-b:202", AtMost: time.Hour, NoKeepAlive: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := lease.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx)
	exec1(t, db, `INSERT INTO pgclaim_locks (name, holder, locked_at, lock_until, fence)
VALUES ('old-lease', 'host-c:303', now() - interval '2 hours', now() - interval '90 minutes', 1)`)

	// pgclaim locks nobody can name without --name, and a lock that is not
	// pgclaim's.
	other := appConn(t, db, "psql")
	adhocClass, adhocKey := gate.AdvisoryKey("adhoc-cleanup")
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4), pg_advisory_lock(42::bigint)`, adhocClass, adhocKey); err != nil {
		t.Fatal(err)
	}

	// Wait until the standby is queued on the election's lock.
	waitFor(t, "the standby waiting on the election lock", func() bool {
		n, err := pgprobe.CountAdvisory(ctx, db.Pool, pgprobe.Waiting)
		return err == nil && n == 1
	})

	r = cli(t, "", "locks", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[locksJSON](t, r.stdout)

	if len(out.Leases) != 2 {
		t.Fatalf("leases = %+v", out.Leases)
	}
	held, old := out.Leases[1], out.Leases[0] // ordered by name
	if held.Name != "report-lease" || held.Holder != "host-b:202" || held.Fence != h.Fence() || held.Expired ||
		held.RemainingSeconds < 3500 || held.RemainingSeconds > 3600 {
		t.Errorf("held lease = %+v", held)
	}
	if old.Name != "old-lease" || old.Holder != "host-c:303" || !old.Expired || old.RemainingSeconds > -5390 {
		t.Errorf("expired lease = %+v", old)
	}

	job := findAdvisory(out.Advisory, "push-resume", true)
	if job == nil {
		t.Fatalf("push-resume's lock not listed: %+v", out.Advisory)
	}
	if job.Kind != "job" || job.Owner != "pgclaim" || *job.Class != jobClass || *job.Key != jobKey || job.PID == nil ||
		*job.PID != jobPID || job.ApplicationName == nil || *job.ApplicationName != "svc-active" ||
		job.Holder == nil || *job.Holder != "host-a:101" || job.HeldSince == nil || job.ClientAddr == nil || job.BackendStart == nil {
		t.Errorf("push-resume's lock = %+v", *job)
	}
	var ledgerStart time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT started_at FROM pgclaim_ticks WHERE fence = $1`, run.Fence).Scan(&ledgerStart); err != nil {
		t.Fatal(err)
	}
	if job.HeldSince != nil && !job.HeldSince.Equal(ledgerStart) {
		t.Errorf("held since %v, the tick started at %v", job.HeldSince, ledgerStart)
	}

	leader := findAdvisory(out.Advisory, "notifier", true)
	waiter := findAdvisory(out.Advisory, "notifier", false)
	elClass, elKey := gate.ElectionKey("notifier")
	if leader == nil || waiter == nil {
		t.Fatalf("election locks not listed as held and waiting: %+v", out.Advisory)
	}
	if leader.Kind != "election" || *leader.Class != elClass || *leader.Key != elKey || *leader.ApplicationName != "svc-active" ||
		leader.Holder == nil || *leader.Holder != "host-a:101" {
		t.Errorf("election leader's lock = %+v", *leader)
	}
	// pg_locks.waitstart is PostgreSQL 14+: on 13 the wait's start is unknown.
	var serverVersion int
	if err := db.Pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&serverVersion); err != nil {
		t.Fatal(err)
	}
	if *waiter.ApplicationName != "svc-standby" || (waiter.WaitStart != nil) != (serverVersion >= 140000) || waiter.Holder != nil {
		t.Errorf("standby's waiting lock = %+v (server %d)", *waiter, serverVersion)
	}

	unknown := findAdvisory(out.Advisory, "", true)
	if unknown == nil || unknown.Owner != "pgclaim" || *unknown.Key != adhocKey || *unknown.ApplicationName != "psql" {
		t.Errorf("unresolved pgclaim lock = %+v", unknown)
	}
	var foreign *advisoryJSON
	for i, a := range out.Advisory {
		if a.BigintKey != nil && *a.BigintKey == 42 {
			foreign = &out.Advisory[i]
		}
	}
	if foreign == nil || foreign.Owner != "other" || foreign.Name != "" || foreign.Class != nil {
		t.Errorf("bigint lock = %+v", foreign)
	}
	if len(out.Advisory) != 5 {
		t.Errorf("want 5 advisory locks (job, leader, standby, adhoc, 42), got %d: %+v", len(out.Advisory), out.Advisory)
	}

	if len(out.Elections) != 1 || out.Elections[0].Election != "notifier" || out.Elections[0].Holder != "host-a:101" ||
		out.Elections[0].Method != "advisory" || out.Elections[0].Fence != el.Fence() || out.Elections[0].LeaseUntil != nil {
		t.Errorf("elections = %+v", out.Elections)
	}

	// --name resolves the ad-hoc lock.
	r = cli(t, "", "locks", "--json", "--name", "adhoc-cleanup", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out = decodeJSON[locksJSON](t, r.stdout)
	if a := findAdvisory(out.Advisory, "adhoc-cleanup", true); a == nil || a.Kind != "given" {
		t.Errorf("--name did not resolve the lock: %+v", out.Advisory)
	}

	// The table view. Without waitstart (13) a waiter's SINCE is its session's start.
	waitSince := ""
	if serverVersion < 140000 {
		waitSince = "session "
	}
	r = cli(t, "", "locks", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	lines := strings.Split(r.stdout, "\n")
	for _, re := range []string{
		`^LEASE LOCKS \(pgclaim_locks\)$`,
		`^NAME +HOLDER +FENCE +LOCKED AT +LOCK UNTIL +STATE$`,
		`^old-lease +host-c:303 +1 +\S+ \S+ +\S+ \S+ +expired 1h3\dm ago$`,
		fmt.Sprintf(`^report-lease +host-b:202 +%d +\S+ \S+ +\S+ \S+ +held, (59m\d+s|1h) left$`, h.Fence()),
		`^ADVISORY LOCKS$`,
		`^NAME +KEY +STATE +PID +APPLICATION +CLIENT +HOLDER +SINCE$`,
		fmt.Sprintf(`^push-resume \(job\) +%d/%d +held +%d +svc-active +\S+ +host-a:101 +%s$`, jobClass, jobKey, jobPID, regexp.QuoteMeta(fmtTime(ledgerStart))),
		fmt.Sprintf(`^notifier \(election\) +%d/%d +held +\d+ +svc-active +\S+ +host-a:101 +\S+ \S+$`, elClass, elKey),
		fmt.Sprintf(`^notifier \(election\) +%d/%d +waiting +\d+ +svc-standby +\S+ +- +%s\S+ \S+$`, elClass, elKey, waitSince),
		fmt.Sprintf(`^\? \(pgclaim; unknown name, try --name\) +%d/%d +held +\d+ +psql +`, adhocClass, adhocKey),
		`^- \(not pgclaim's\) +42 +held +\d+ +psql +\S+ +- +session `,
		`^ELECTIONS \(open terms in pgclaim_terms\)$`,
		`^ELECTION +FENCE +HOLDER +METHOD +SINCE +LEASE UNTIL$`,
		fmt.Sprintf(`^notifier +%d +host-a:101 +advisory +\S+ \S+ +-$`, el.Fence()),
	} {
		found := false
		for _, l := range lines {
			if regexp.MustCompile(re).MatchString(l) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no line matches %s in:\n%s", re, r.stdout)
		}
	}
}

func TestLocksErrors(t *testing.T) {
	t.Parallel()
	empty := unmigrated(t)
	r := cli(t, "", "locks", "--database-url", empty.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		fmt.Sprintf("pgclaim locks: database %q is not migrated: pgclaim's table pgclaim_locks does not exist\n", empty.Name),
		"hint: run 'pgclaim migrate up'")

	db := pgtest.NewDatabase(t)
	exec1(t, db, `ALTER TABLE pgclaim_locks DROP COLUMN lock_until`)
	r = cli(t, "", "locks", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr,
		fmt.Sprintf("pgclaim locks: table pgclaim_locks in database %q has no column \"lock_until\"\n", db.Name),
		"hint: pgclaim's schema in this database does not match")

	// The migration lock is named.
	conn := appConn(t, db, "migrator")
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1::bigint)`, pgclaim.MigrationLockID); err != nil {
		t.Fatal(err)
	}
	exec1(t, db, `ALTER TABLE pgclaim_locks ADD COLUMN lock_until timestamptz NOT NULL`)
	r = cli(t, "", "locks", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[locksJSON](t, r.stdout)
	if a := findAdvisory(out.Advisory, "pgclaim migrations", true); a == nil || a.Kind != "migrations" || *a.ApplicationName != "migrator" {
		t.Errorf("migration lock not named: %+v", out.Advisory)
	}
}

// waitFor polls cond for up to ten seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLocksSchedules: a stored schedule's advisory lock is listed under
// the schedule's name, and --name NAME resolves a schedule's lock that no
// stored definition names.
func TestLocksSchedules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "push-resume", Spec: "0 9 * * *", Version: 1})
	conn := appConn(t, db, "svc-active")
	class, key := schedule.LockKey("push-resume")
	gclass, gkey := schedule.LockKey("gone-report")
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4), pg_advisory_lock($3::int4, $4::int4)`, class, key, gclass, gkey); err != nil {
		t.Fatal(err)
	}

	r := cli(t, "", "locks", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[locksJSON](t, r.stdout)
	if a := findAdvisory(out.Advisory, "push-resume", true); a == nil || a.Kind != "schedule" || *a.Class != class || *a.Key != key {
		t.Errorf("push-resume's lock not resolved to the schedule: %+v", out.Advisory)
	}
	r = cli(t, "", "locks", "--database-url", db.URL)
	wantContains(t, "locks", r.stdout, "push-resume (schedule)")

	for _, name := range []string{"gone-report", "pgclaim.schedule:gone-report"} {
		r = cli(t, "", "locks", "--json", "--name", name, "--database-url", db.URL)
		wantCode(t, r, exitOK)
		out = decodeJSON[locksJSON](t, r.stdout)
		if a := findAdvisory(out.Advisory, "gone-report", true); a == nil || a.Kind != "given" || *a.Key != gkey {
			t.Errorf("--name %s did not resolve the schedule's lock: %+v", name, out.Advisory)
		}
	}
}
