package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/internal/budget"
	"github.com/pgclaim/pgclaim/internal/grants"
	"github.com/pgclaim/pgclaim/internal/pgerr"
)

func init() {
	register(command{name: "doctor", summary: "check a database and this DSN for pgclaim: version, fence, pooling, privileges, migrations, connections", run: runDoctor})
}

const doctorAbout = `
Checks what pgclaim needs from the database and from this connection string,
as the role in it, and prints one line per check with a verdict: ok, warn
(works, with a limit to know) or blocker (pgclaim will fail). The exit
status is 1 when any check is a blocker.

  server       the server's version, and whether pgclaim supports it (13-18)
  migrations   pgclaim's migrations applied, or pending
  fence        the fencing token in force (timeline or sequence), its
               guarantee (not across a crash with fsync or
               synchronous_commit off, as this DSN's session has them), and
               whether this role can take one
  sessions     whether session advisory locks and LISTEN work through this
               DSN, or a pooler in transaction mode is in between (then use
               lease locks; claim workers poll only)
  privileges   what this role lacks of the grants 'pgclaim grants' prints
  connections  max_connections against --instances instances of
               --pool-max-conns pool connections and the dedicated sessions
               each holds besides`

// Verdicts of a check.
const (
	verdictOK      = "ok"
	verdictWarn    = "warn"
	verdictBlocker = "blocker"
)

// Supported PostgreSQL majors.
const (
	minMajor = 13
	maxMajor = 18
)

type doctorCheck struct {
	Check   string `json:"check"`
	Verdict string `json:"verdict"`
	Detail  string `json:"detail"`
	Hint    string `json:"hint,omitempty"`
}

type doctorJSON struct {
	Database string        `json:"database"`
	Role     string        `json:"role"`
	Checks   []doctorCheck `json:"checks"`
	Blockers int           `json:"blockers"`
}

func runDoctor(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "doctor", "doctor [--instances N] [--pool-max-conns N] [--database-url URL] [--json]", doctorAbout)
	instances := f.Int("instances", 2, "the number of instances planned to run against the database (`N`)")
	poolMax := f.Int("pool-max-conns", 4, "each instance's pool MaxConns (`N`; pgxpool's default is max(4, CPUs))")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *instances < 1 {
		return usagef("--instances must be at least 1")
	}
	if *poolMax < 1 {
		return usagef("--pool-max-conns must be at least 1")
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	out := doctorJSON{}
	if err := pool.QueryRow(ctx, "SELECT current_database()::text, current_user::text").Scan(&out.Database, &out.Role); err != nil {
		return dbFail("reading the database's name", err)
	}
	sess, pooled := checkSessions(ctx, pool)
	out.Checks = []doctorCheck{
		checkServer(ctx, pool),
		checkMigrations(ctx, pool),
		checkFence(ctx, pool),
		sess,
		checkPrivileges(ctx, pool, out.Role),
		checkConnections(ctx, pool, *instances, *poolMax, pooled),
	}
	for _, c := range out.Checks {
		if c.Verdict == verdictBlocker {
			out.Blockers++
		}
	}
	if f.json {
		if err := writeJSON(e.stdout, out); err != nil {
			return err
		}
	} else {
		t := newTable(e.stdout, "CHECK", "VERDICT", "DETAIL")
		for _, c := range out.Checks {
			t.row(c.Check, c.Verdict, c.Detail)
		}
		if err := t.flush(); err != nil {
			return err
		}
		for _, c := range out.Checks {
			if c.Hint != "" {
				fmt.Fprintf(e.stdout, "\n%s: %s\n", c.Check, c.Hint)
			}
		}
	}
	if out.Blockers > 0 {
		return &failure{msg: fmt.Sprintf("%d blocker(s) in database %q as role %q", out.Blockers, out.Database, out.Role)}
	}
	return nil
}

// failed is a check that could not run: a blocker saying why.
func failed(name, what string, err error) doctorCheck {
	return doctorCheck{Check: name, Verdict: verdictBlocker, Detail: what + ": " + pgerr.Explain(err).Error()}
}

func checkServer(ctx context.Context, db dbtx) doctorCheck {
	c := doctorCheck{Check: "server"}
	var num int
	var version string
	if err := db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&num, &version); err != nil {
		return failed(c.Check, "reading the version", err)
	}
	major := num / 10000
	switch {
	case major < minMajor:
		c.Verdict = verdictBlocker
		c.Detail = fmt.Sprintf("PostgreSQL %s: not supported (pgclaim supports %d-%d)", version, minMajor, maxMajor)
		c.Hint = fmt.Sprintf("upgrade the server to PostgreSQL %d or later", minMajor)
	case major > maxMajor:
		c.Verdict = verdictWarn
		c.Detail = fmt.Sprintf("PostgreSQL %s: newer than pgclaim is tested with (%d-%d)", version, minMajor, maxMajor)
	default:
		c.Verdict = verdictOK
		c.Detail = fmt.Sprintf("PostgreSQL %s: supported (%d-%d)", version, minMajor, maxMajor)
	}
	return c
}

func checkMigrations(ctx context.Context, pool *pgxpool.Pool) doctorCheck {
	c := doctorCheck{Check: "migrations"}
	ms, _, err := migrationState(ctx, pool, "")
	if err != nil {
		return failed(c.Check, "reading pgclaim's migrations", err)
	}
	pending, applied := 0, 0
	for _, m := range ms {
		if m.Applied {
			applied++
		} else {
			pending++
		}
	}
	switch {
	case applied == 0:
		c.Verdict, c.Detail = verdictBlocker, "not migrated: pgclaim's tables do not exist"
		c.Hint = "run 'pgclaim migrate up' as the role that is to own pgclaim's objects (see docs/MANAGED.md)"
	case pending > 0:
		c.Verdict, c.Detail = verdictBlocker, fmt.Sprintf("%d applied, %d pending: this pgclaim needs them", applied, pending)
		c.Hint = "run 'pgclaim migrate up' as the owner of pgclaim's objects (pgclaim.Migrate at start-up does it when the role may)"
	default:
		c.Verdict, c.Detail = verdictOK, fmt.Sprintf("all %d applied (version %d)", applied, ms[len(ms)-1].Version)
	}
	return c
}

func checkFence(ctx context.Context, pool *pgxpool.Pool) doctorCheck {
	c := doctorCheck{Check: "fence"}
	var fence, reason *string
	var base *int64
	err := pool.QueryRow(ctx, "SELECT fence, base, reason FROM pgclaim_fence_mode").Scan(&fence, &base, &reason)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "42P01": // undefined_table
		return doctorCheck{Check: c.Check, Verdict: verdictBlocker, Detail: "no record of the fence in force (pgclaim_fence_mode): migration 00010 is not applied",
			Hint: "run 'pgclaim migrate up'"}
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return failed(c.Check, "reading pgclaim_fence_mode", err)
	}
	// Take a token (the sequence only moves on; gaps are harmless), as
	// every grant does, to see that this role may.
	probe := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pgclaim_fence()")
		return err
	})
	if fence == nil {
		c.Verdict, c.Detail = verdictBlocker, "pgclaim_fence_mode is empty: no fence was chosen"
		c.Hint = "run 'pgclaim migrate up' (it runs pgclaim_fence_check())"
		return c
	}
	lossy, fix, err := fenceDurability(ctx, pool)
	if err != nil {
		return failed(c.Check, "reading fsync and synchronous_commit", err)
	}
	crash := ""
	if lossy != "" {
		crash = fmt.Sprintf("not unique across a crash: %s: tokens granted in the last moments before a crash can be granted again", lossy)
	}
	switch {
	case *fence == pgclaim.FenceTimeline && crash == "":
		c.Verdict = verdictOK
		c.Detail = fmt.Sprintf("timeline (timeline %d): tokens unique and increasing across restarts and every primary promotion", *base)
	case *fence == pgclaim.FenceTimeline:
		c.Verdict = verdictWarn
		c.Detail = fmt.Sprintf("timeline (timeline %d): tokens increasing across every primary promotion, but %s", *base, crash)
	default:
		c.Verdict = verdictWarn
		c.Detail = fmt.Sprintf("sequence (base %d; %s): tokens unique and increasing on this server and across failovers on shared storage (Aurora), "+
			"not across the promotion of an asynchronous streaming replica", *base, *reason)
		if crash != "" {
			c.Detail += ", and " + crash
		}
		c.Hint = "if a streaming replica of this server may be promoted, GRANT EXECUTE ON FUNCTION pg_current_wal_insert_lsn(), pg_walfile_name(pg_lsn) TO PUBLIC " +
			"and run 'pgclaim migrate up' for the timeline fence (see docs/MANAGED.md)"
	}
	if fix != "" && c.Hint != "" {
		c.Hint += ";\n  and " + fix
	} else if fix != "" {
		c.Hint = fix
	}
	if probe != nil {
		c.Verdict = verdictBlocker
		c.Detail += "; but this role cannot take a token: " + pgerr.Explain(probe).Error()
		c.Hint = ""
	}
	return c
}

// fenceDurability returns, when a crash can lose commits acknowledged on
// the DSN's session (fsync or synchronous_commit off, wherever set), which
// settings and where, and what a crash then does and the statements that
// fix it; "" when none is off.
func fenceDurability(ctx context.Context, pool *pgxpool.Pool) (lossy, fix string, err error) {
	var db, role string
	rows, err := pool.Query(ctx, `SELECT name, setting, source, current_database()::text, current_user::text
		FROM pg_catalog.pg_settings WHERE name IN ('fsync', 'synchronous_commit') ORDER BY name`)
	if err != nil {
		return "", "", err
	}
	var off, fixes, crashes []string
	var name, setting, source string
	_, err = pgx.ForEachRow(rows, []any{&name, &setting, &source, &db, &role}, func() error {
		if setting != "off" {
			return nil
		}
		d, r := pgx.Identifier{db}.Sanitize(), pgx.Identifier{role}.Sanitize()
		where, stmt := "server", fmt.Sprintf("ALTER SYSTEM SET %s = on; SELECT pg_reload_conf(); -- as a superuser, or in postgresql.conf or the service's parameters", name)
		switch source {
		case "database":
			where, stmt = "set for database "+d, fmt.Sprintf("ALTER DATABASE %s RESET %s;", d, name)
		case "user":
			where, stmt = "set for role "+r, fmt.Sprintf("ALTER ROLE %s RESET %s;", r, name)
		case "database user":
			where, stmt = fmt.Sprintf("set for role %s in database %s", r, d), fmt.Sprintf("ALTER ROLE %s IN DATABASE %s RESET %s;", r, d, name)
		case "client":
			where, stmt = "set by the DSN's options or PGOPTIONS", "remove "+name+"=off from the DSN's options and PGOPTIONS"
		}
		off, fixes = append(off, fmt.Sprintf("%s=off (%s)", name, where)), append(fixes, stmt)
		if name == "fsync" {
			crashes = append(crashes, "of the operating system or the machine (fsync=off)")
		} else {
			crashes = append(crashes, "of the server (synchronous_commit=off)")
		}
		return nil
	})
	if err != nil || len(off) == 0 {
		return "", "", err
	}
	fix = "a crash " + strings.Join(crashes, " or ") + " loses the last commits it acknowledged, and with them the grants of their tokens: " +
		"the same tokens are then granted again to other claims, and a stale writer holding one passes the fence. To keep them unique, run:\n    " +
		strings.Join(fixes, "\n    ")
	return strings.Join(off, ", "), fix, nil
}

// checkSessions tells a direct session from a pooler's: the backend pid the
// server announced at connect against pg_backend_pid() in two
// transactions; then takes and frees a session advisory lock and receives
// its own notification. It reports whether a pooler was found.
func checkSessions(ctx context.Context, pool *pgxpool.Pool) (doctorCheck, bool) {
	c := doctorCheck{Check: "sessions"}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return failed(c.Check, "acquiring a connection", err), false
	}
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	announced := conn.PgConn().PID()
	var pid1, pid2 uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
		return failed(c.Check, "reading the backend pid", err), false
	}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid2); err != nil {
		return failed(c.Check, "reading the backend pid", err), false
	}
	const pollOnly = "claim workers poll only (every WorkerConfig.PollInterval)"
	const lease = "use lease locks through it: gate.Config.LedgerOnly with gate.Lease, ElectorConfig.Mechanism LeaseRow, " +
		"schedule.Config.LeaseLocks; or give the instances a direct DSN (session pooling or none)"
	if announced != pid1 || pid1 != pid2 {
		c.Verdict = verdictWarn
		c.Detail = fmt.Sprintf("a connection pooler is in between (backend pid %d announced, %d and %d in two transactions): "+
			"session advisory locks and LISTEN do not work through this DSN; %s", announced, pid1, pid2, pollOnly)
		c.Hint = lease
		return c, true
	}
	key := rand.Int64()
	var locked, unlocked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&locked); err != nil {
		return failed(c.Check, "taking a session advisory lock", err), false
	}
	if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&unlocked); err != nil {
		return failed(c.Check, "freeing a session advisory lock", err), false
	}
	if !locked || !unlocked {
		c.Verdict, c.Detail, c.Hint = verdictWarn, "a session advisory lock taken in one statement was not held in the next; "+pollOnly, lease
		return c, true
	}
	channel := fmt.Sprintf("pgclaim_doctor_%d", uint32(key))
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		return failed(c.Check, "LISTEN", err), false
	}
	if _, err := conn.Exec(ctx, "SELECT pg_notify($1, 'doctor')", channel); err != nil {
		return failed(c.Check, "NOTIFY", err), false
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := conn.WaitForNotification(wctx); err != nil {
		c.Verdict, c.Detail, c.Hint = verdictWarn, "session advisory locks work, but a notification sent on this session did not arrive within 3 s; "+pollOnly, lease
		return c, false
	}
	c.Verdict = verdictOK
	c.Detail = fmt.Sprintf("a direct session (backend pid %d): session advisory locks and LISTEN work; claim workers wake on notification (LISTEN/NOTIFY)", pid1)
	return c, false
}

// checkPrivileges lists what role lacks of the grants pgclaim needs on the
// objects that exist.
func checkPrivileges(ctx context.Context, pool *pgxpool.Pool, role string) doctorCheck {
	c := doctorCheck{Check: "privileges"}
	var super bool
	var schema *string
	if err := pool.QueryRow(ctx, `SELECT rolsuper, (SELECT n.nspname::text FROM pg_catalog.pg_class k
		JOIN pg_catalog.pg_namespace n ON n.oid = k.relnamespace WHERE k.oid = to_regclass('pgclaim_schema_version'))
		FROM pg_catalog.pg_roles WHERE rolname = current_user`).Scan(&super, &schema); err != nil {
		return failed(c.Check, "reading the role", err)
	}
	if super {
		c.Verdict, c.Detail = verdictOK, fmt.Sprintf("role %q is a superuser (the application role needs only 'pgclaim grants')", role)
		return c
	}
	if schema == nil {
		c.Verdict, c.Detail = verdictWarn, "not checked: pgclaim's tables are not on this role's search path (not migrated?)"
		return c
	}
	stmts := grants.Statements(role, *schema)
	var missing, fix []string
	var has bool
	if err := pool.QueryRow(ctx, "SELECT has_schema_privilege($1, 'USAGE')", *schema).Scan(&has); err != nil {
		return failed(c.Check, "reading the schema's privileges", err)
	}
	if !has {
		missing, fix = append(missing, "USAGE on schema "+*schema), append(fix, stmts[0])
	}
	for i, o := range grants.Objects {
		name := pgx.Identifier{*schema}.Sanitize() + "."
		fn := "has_table_privilege"
		exists := "to_regclass($1)"
		switch o.Kind {
		case grants.Sequence:
			fn = "has_sequence_privilege"
		case grants.Function:
			fn, exists = "has_function_privilege", "to_regprocedure($1)"
		}
		base, args, _ := strings.Cut(o.Name, "(")
		name += pgx.Identifier{base}.Sanitize()
		if args != "" {
			name += "(" + args
		}
		var lacks []string
		for _, priv := range strings.Split(o.Privileges, ", ") {
			var ok *bool
			if err := pool.QueryRow(ctx, "SELECT CASE WHEN "+exists+" IS NOT NULL THEN "+fn+"($1, $2) END", name, priv).Scan(&ok); err != nil {
				return failed(c.Check, "reading the privileges on "+o.Name, err)
			}
			if ok != nil && !*ok {
				lacks = append(lacks, priv)
			}
		}
		if len(lacks) > 0 {
			missing = append(missing, strings.Join(lacks, ", ")+" on "+strings.ToLower(string(o.Kind))+" "+o.Name)
			fix = append(fix, stmts[i+1])
		}
	}
	if len(missing) == 0 {
		c.Verdict, c.Detail = verdictOK, fmt.Sprintf("role %q has every grant pgclaim needs in schema %s", role, *schema)
		return c
	}
	c.Verdict = verdictBlocker
	c.Detail = fmt.Sprintf("role %q lacks %s", role, strings.Join(missing, "; "))
	c.Hint = "as the owner of pgclaim's objects, run:\n  " + strings.Join(fix, "\n  ")
	return c
}

func checkConnections(ctx context.Context, db dbtx, instances, poolMax int, pooled bool) doctorCheck {
	c := doctorCheck{Check: "connections"}
	var maxConns, reserved, inUse int
	if err := db.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0),
		(SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&maxConns, &reserved, &inUse); err != nil {
		return failed(c.Check, "reading max_connections", err)
	}
	per := budget.PerInstance(poolMax)
	need := instances * per
	avail := maxConns - reserved
	c.Detail = fmt.Sprintf("%d instances x (%d pool + %d dedicated) = %d connections of max_connections %d (%d reserved); %d client connections now",
		instances, poolMax, budget.DedicatedSessions, need, maxConns, reserved, inUse)
	switch {
	case need > avail:
		c.Verdict = verdictBlocker
		c.Hint = fmt.Sprintf("raise max_connections to at least %d, or lower --pool-max-conns / the instances' pool MaxConns to %d", need+reserved, max(avail/instances-budget.DedicatedSessions, 0))
	case need+inUse > avail:
		c.Verdict = verdictWarn
		c.Hint = "with the connections open now, the instances would not all get theirs: raise max_connections or lower the pools' MaxConns"
	default:
		c.Verdict = verdictOK
	}
	if pooled {
		c.Detail += "; through a pooler, the server sees the pooler's connections, not the instances'"
	}
	return c
}
