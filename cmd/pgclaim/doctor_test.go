package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// verdicts returns each check's verdict from doctor's table.
func verdicts(t *testing.T, r result) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && regexp.MustCompile(`^(ok|warn|blocker)$`).MatchString(f[1]) {
			out[f[0]] = f[1]
		}
	}
	if len(out) != 6 {
		t.Fatalf("doctor printed %d checks, want 6:\n%s", len(out), r)
	}
	return out
}

func wantVerdicts(t *testing.T, r result, want map[string]string) {
	t.Helper()
	got := verdicts(t, r)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("check %s: %s, want %s:\n%s", k, got[k], v, r)
		}
	}
}

// fenceWant is the fence verdict and detail doctor gives on db's server
// with synchronous_commit on: the test clusters may run with fsync=off.
func fenceWant(t *testing.T, db *pgtest.Database) (verdict, detail string) {
	t.Helper()
	var fsync string
	if err := db.Pool.QueryRow(context.Background(), "SELECT current_setting('fsync')").Scan(&fsync); err != nil {
		t.Fatal(err)
	}
	if fsync == "on" {
		return "ok", "timeline (timeline 1): tokens unique and increasing across restarts and every primary promotion"
	}
	return "warn", "timeline (timeline 1): tokens increasing across every primary promotion, but not unique across a crash: fsync=off"
}

// TestDoctor: a migrated database reached directly as a superuser: every
// check ok (the fence's as the server's fsync says), exit 0; the same in
// JSON.
func TestDoctor(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	fence, fenceDetail := fenceWant(t, db)
	r := cli(t, "", "doctor", "--database-url", db.URL)
	t.Logf("pgclaim doctor:\n%s", r.stdout)
	wantCode(t, r, exitOK)
	wantVerdicts(t, r, map[string]string{"server": "ok", "migrations": "ok", "fence": fence, "sessions": "ok", "privileges": "ok", "connections": "ok"})
	wantContains(t, "doctor", r.stdout, "supported (13-18)", fenceDetail,
		"session advisory locks and LISTEN work; claim workers wake on notification (LISTEN/NOTIFY)", "2 instances x (4 pool + 2 dedicated) = 12 connections")

	r = cli(t, "", "doctor", "--json", "--instances", "3", "--pool-max-conns", "10", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[doctorJSON](t, r.stdout)
	if out.Database != db.Name || out.Blockers != 0 || len(out.Checks) != 6 {
		t.Errorf("doctor --json = %+v", out)
	}
	wantContains(t, "connections", out.Checks[5].Detail, "3 instances x (10 pool + 2 dedicated) = 36 connections")
}

// TestDoctorBlockers: a database never migrated, and more instances than
// max_connections holds: blockers, exit 1.
func TestDoctorBlockers(t *testing.T) {
	t.Parallel()
	db := unmigrated(t)
	r := cli(t, "", "doctor", "--instances", "10000", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantVerdicts(t, r, map[string]string{"server": "ok", "migrations": "blocker", "fence": "blocker", "sessions": "ok", "connections": "blocker"})
	wantContains(t, "doctor", r.stdout, "not migrated", "raise max_connections to at least")
	wantContains(t, "stderr", r.stderr, "pgclaim doctor: 3 blocker(s)")
}

// TestDoctorApplicationRole: as an application role with the documented
// grants where the WAL functions are refused: the sequence fence, with its
// guarantee; a revoked privilege is a blocker naming the grant.
func TestDoctorApplicationRole(t *testing.T) {
	t.Parallel()
	db, _, app := twoRoles(t)
	r := cli(t, "", "doctor", "--database-url", app.URL)
	wantCode(t, r, exitOK)
	wantVerdicts(t, r, map[string]string{"migrations": "ok", "fence": "warn", "sessions": "ok", "privileges": "ok"})
	wantContains(t, "doctor", r.stdout, "sequence (base 1; the server refuses the WAL functions: permission denied for function",
		"not across the promotion of an asynchronous streaming replica", "has every grant pgclaim needs in schema public")

	exec1(t, db, "REVOKE INSERT, DELETE ON pgclaim_ticks FROM "+app.Ident())
	exec1(t, db, "REVOKE USAGE ON SEQUENCE pgclaim_fence_seq FROM "+app.Ident())
	r = cli(t, "", "doctor", "--database-url", app.URL)
	wantCode(t, r, exitError)
	wantVerdicts(t, r, map[string]string{"fence": "blocker", "privileges": "blocker"})
	wantContains(t, "doctor", r.stdout,
		"lacks INSERT, DELETE on table pgclaim_ticks; USAGE on sequence pgclaim_fence_seq",
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."pgclaim_ticks" TO "%s";`, app.Name),
		"this role cannot take a token: ", "GRANT USAGE, SELECT ON SEQUENCE pgclaim_fence_seq")
}

// poolURL is a URL for cfg's server, database and user.
func poolURL(cfg *pgxpool.Config) string {
	cc := cfg.ConnConfig
	u := url.URL{Scheme: "postgres", User: url.UserPassword(cc.User, cc.Password), Host: fmt.Sprintf("%s:%d", cc.Host, cc.Port),
		Path: "/" + cc.Database, RawQuery: "sslmode=disable"}
	return u.String()
}

// TestDoctorPooler: through a proxy that announces another backend pid, as
// a pooler does, and through PgBouncer in transaction mode: session locks
// and LISTEN are reported not to work, with the advice to use lease locks.
func TestDoctorPooler(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	r := cli(t, "", "doctor", "--database-url", poolURL(pgprobe.ProxyConfig(t, db.Pool, true, nil)))
	wantCode(t, r, exitOK)
	fence, _ := fenceWant(t, db)
	wantVerdicts(t, r, map[string]string{"sessions": "warn", "fence": fence})
	wantContains(t, "doctor", r.stdout, "a connection pooler is in between", "session advisory locks and LISTEN do not work through this DSN",
		"claim workers poll only (every WorkerConfig.PollInterval)", "use lease locks")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := bouncer.Start(ctx, db.Server.URL(), db.Name)
	if errors.Is(err, bouncer.ErrNotFound) {
		t.Logf("PgBouncer not checked: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	r = cli(t, "", "doctor", "--database-url", b.URL(db.Name, "doctor"))
	wantCode(t, r, exitOK)
	wantVerdicts(t, r, map[string]string{"sessions": "warn", "migrations": "ok", "fence": fence, "privileges": "ok"})
	wantContains(t, "doctor", r.stdout, "a connection pooler is in between", "through a pooler, the server sees the pooler's connections")
}

// TestDoctorFenceDurability: synchronous_commit=off set for the database,
// then for the role in the DSN: the fence is not reported unique across
// restarts; doctor says what a crash does and the statement that fixes it.
func TestDoctorFenceDurability(t *testing.T) {
	t.Parallel()
	db, _, app := twoRoles(t)
	exec1(t, db, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET synchronous_commit = off")
	r := cli(t, "", "doctor", "--database-url", app.URL)
	wantCode(t, r, exitOK)
	wantVerdicts(t, r, map[string]string{"fence": "warn"})
	wantContains(t, "doctor", r.stdout, "not unique across a crash", "synchronous_commit=off (set for database",
		"tokens granted in the last moments before a crash can be granted again",
		"ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" RESET synchronous_commit")
	if strings.Contains(r.stdout, "across restarts") {
		t.Errorf("doctor reports the fence unique across restarts with synchronous_commit=off:\n%s", r)
	}

	exec1(t, db, "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" RESET synchronous_commit")
	exec1(t, db, "ALTER ROLE "+app.Ident()+" SET synchronous_commit = off")
	r = cli(t, "", "doctor", "--json", "--database-url", app.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[doctorJSON](t, r.stdout)
	c := out.Checks[2]
	if c.Check != "fence" || c.Verdict != "warn" {
		t.Fatalf("fence check: %+v", c)
	}
	wantContains(t, "fence", c.Detail+"\n"+c.Hint, "synchronous_commit=off (set for role", "can be granted again",
		"ALTER ROLE "+app.Ident()+" RESET synchronous_commit")
}
