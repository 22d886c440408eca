package inspect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
)

// Lease is a lease lock: a row of pgclaim_locks. Expired and
// RemainingSeconds are by the database's clock.
type Lease struct {
	Name             string    `json:"name"`
	Holder           string    `json:"holder"`
	Fence            int64     `json:"fence"`
	LockedAt         time.Time `json:"locked_at"`
	LockUntil        time.Time `json:"lock_until"`
	Expired          bool      `json:"expired"`
	RemainingSeconds float64   `json:"remaining_seconds"`
}

// Advisory is an advisory lock held or awaited in the database, with its
// session and, when it can be resolved, the name it guards.
type Advisory struct {
	// Name and Kind are empty when the key could not be resolved.
	Name  string `json:"name"`
	Kind  string `json:"kind"`  // job, lease, election, schedule, given, migrations
	Owner string `json:"owner"` // pgclaim, or other for locks pgclaim does not take
	// Class and Key are set for two-int4 locks, BigintKey for bigint ones.
	Class           *int32     `json:"class,omitempty"`
	Key             *int32     `json:"key,omitempty"`
	BigintKey       *int64     `json:"bigint_key,omitempty"`
	Granted         bool       `json:"granted"`
	Mode            string     `json:"mode"`
	PID             *int32     `json:"pid"`
	ApplicationName *string    `json:"application_name"`
	ClientAddr      *string    `json:"client_addr"`
	BackendStart    *time.Time `json:"backend_start"`
	WaitStart       *time.Time `json:"wait_start"`
	Holder          *string    `json:"holder"`
	HeldSince       *time.Time `json:"held_since"`
}

// Term is an open election term (pgclaim_terms): the election's leader.
type Term struct {
	Election   string     `json:"election"`
	Fence      int64      `json:"fence"`
	Holder     string     `json:"holder"`
	Method     string     `json:"method"`
	StartedAt  time.Time  `json:"started_at"`
	LeaseUntil *time.Time `json:"lease_until"`
	Expired    bool       `json:"expired"`
}

// Locks is what is locked in the database.
type Locks struct {
	Leases    []Lease    `json:"leases"`
	Advisory  []Advisory `json:"advisory"`
	Elections []Term     `json:"elections"`
}

// knownName is a name whose advisory key may be held.
type knownName struct {
	name, kind string
	holder     *string
	since      *time.Time
}

// ReadLocks reads the lease locks, the advisory locks of this database (the
// names they guard resolved from the tick ledger, the lease table, the
// election terms and names: a job's, an election's or a schedule's, which
// may be given as its lease row's name "pgclaim.schedule:NAME") and the
// open election terms. schema is the
// installation's (pgclaim.WithSchema; "": found through search_path): it
// picks the advisory keys names resolve to, as gate and schedule derive
// them. The caller has checked that pgclaim's tables exist, and qualifies
// them (db) for a schema of their own.
func ReadLocks(ctx context.Context, db DB, schema string, names []string) (Locks, error) {
	return readLocks(ctx, db, schema, names, false)
}

// ReadAllLocks is ReadLocks that also resolves the advisory locks of the
// stored schedules (pgclaim_schedules), with the holder and start of a
// schedule's running run.
func ReadAllLocks(ctx context.Context, db DB, schema string, names []string) (Locks, error) {
	return readLocks(ctx, db, schema, names, true)
}

// The advisory keys of a name in an installation in schema, as gate
// (Config.Schema: its jobs, leases and elections) and schedule
// (Config.Schema: its schedules) derive them: the default installation's
// keys hash the name alone, another schema's hash it prefixed with the
// schema. TestLocksInSchema (package status) holds them to the keys the
// packages take.
func jobKey(schema, name string) (class, key int32) {
	if schema == "" {
		return gate.AdvisoryKey(name)
	}
	return gate.AdvisoryKey(schema + ":" + name)
}

func electionKey(schema, name string) (class, key int32) {
	if schema == "" {
		return gate.ElectionKey(name)
	}
	return gate.ElectionKey(schema + ":" + name)
}

func scheduleKey(schema, name string) (class, key int32) {
	if schema == "" {
		return schedule.LockKey(name)
	}
	return gate.AdvisoryKey("pgclaim.schedule:" + schema + ":" + name)
}

func readLocks(ctx context.Context, db DB, schema string, names []string, schedules bool) (Locks, error) {
	out := Locks{Leases: []Lease{}, Advisory: []Advisory{}, Elections: []Term{}}

	// Lease rows, but the schedules' own ("pgclaim.schedule:NAME", the
	// schedules' view shows them as their runs and holders).
	rows, err := db.Query(ctx, `
SELECT name, holder, fence, locked_at, lock_until, lock_until <= now(),
       extract(epoch FROM lock_until - now())::float8
FROM pgclaim_locks WHERE name NOT LIKE 'pgclaim.schedule:%' ORDER BY name`)
	if err != nil {
		return Locks{}, fail("reading pgclaim_locks", err)
	}
	for rows.Next() {
		var l Lease
		if err := rows.Scan(&l.Name, &l.Holder, &l.Fence, &l.LockedAt, &l.LockUntil, &l.Expired, &l.RemainingSeconds); err != nil {
			rows.Close()
			return Locks{}, fail("reading pgclaim_locks", err)
		}
		out.Leases = append(out.Leases, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Locks{}, fail("reading pgclaim_locks", err)
	}

	// Open election terms.
	rows, err = db.Query(ctx, `
SELECT election, term, holder, method, started_at, lease_until, coalesce(lease_until <= now(), false)
FROM pgclaim_terms WHERE ended_at IS NULL ORDER BY election`)
	if err != nil {
		return Locks{}, fail("reading pgclaim_terms", err)
	}
	for rows.Next() {
		var t Term
		if err := rows.Scan(&t.Election, &t.Fence, &t.Holder, &t.Method, &t.StartedAt, &t.LeaseUntil, &t.Expired); err != nil {
			rows.Close()
			return Locks{}, fail("reading pgclaim_terms", err)
		}
		out.Elections = append(out.Elections, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Locks{}, fail("reading pgclaim_terms", err)
	}

	// Names whose advisory keys may be held: jobs in the ledger (with the
	// running tick's holder and start), elections, leases, and --name.
	// Jobs and leases lock jobKey, elections electionKey, schedules
	// scheduleKey; a --name may be a job's, an election's or a schedule's.
	known := map[[2]int32][]knownName{}
	seen := map[string]bool{}
	add := func(k knownName) {
		var keys [][2]int32
		if k.kind == "schedule" || k.kind == "given" {
			c, key := scheduleKey(schema, k.name)
			keys = append(keys, [2]int32{c, key})
		}
		if k.kind != "election" && k.kind != "schedule" {
			c, key := jobKey(schema, k.name)
			keys = append(keys, [2]int32{c, key})
		}
		if k.kind == "election" || k.kind == "given" {
			c, key := electionKey(schema, k.name)
			keys = append(keys, [2]int32{c, key})
		}
		for _, key := range keys {
			id := fmt.Sprint(key, k.name)
			if seen[id] {
				continue
			}
			seen[id] = true
			known[key] = append(known[key], k)
		}
	}
	for _, t := range out.Elections {
		k := knownName{name: t.Election, kind: "election"}
		if t.Method == "advisory" {
			k.holder, k.since = &t.Holder, &t.StartedAt
		}
		add(k)
	}
	rows, err = db.Query(ctx, `
SELECT j.job, r.holder, r.started_at
FROM (SELECT DISTINCT job FROM pgclaim_ticks) j
LEFT JOIN LATERAL (
    SELECT holder, started_at FROM pgclaim_ticks t
    WHERE t.job = j.job AND t.outcome = 'running'
    ORDER BY started_at DESC LIMIT 1
) r ON true`)
	if err != nil {
		return Locks{}, fail("reading pgclaim_ticks", err)
	}
	for rows.Next() {
		var k knownName
		if err := rows.Scan(&k.name, &k.holder, &k.since); err != nil {
			rows.Close()
			return Locks{}, fail("reading pgclaim_ticks", err)
		}
		k.kind = "job"
		add(k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Locks{}, fail("reading pgclaim_ticks", err)
	}
	for _, l := range out.Leases {
		add(knownName{name: l.Name, kind: "lease"})
	}
	if schedules {
		rows, err = db.Query(ctx, `
SELECT s.name, r.holder, r.started_at
FROM pgclaim_schedules s
LEFT JOIN LATERAL (
    SELECT holder, started_at FROM pgclaim_schedule_runs r
    WHERE r.schedule = s.name AND r.state = 'running'
    ORDER BY started_at DESC LIMIT 1
) r ON true`)
		if err != nil {
			return Locks{}, fail("reading pgclaim_schedules", err)
		}
		for rows.Next() {
			var k knownName
			if err := rows.Scan(&k.name, &k.holder, &k.since); err != nil {
				rows.Close()
				return Locks{}, fail("reading pgclaim_schedules", err)
			}
			k.kind = "schedule"
			add(k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return Locks{}, fail("reading pgclaim_schedules", err)
		}
	}
	// After the stored names: a --name that is one of them keeps its kind
	// and holder.
	for _, n := range names {
		// A schedule's lease row name, "pgclaim.schedule:NAME", names it too.
		add(knownName{name: strings.TrimPrefix(n, "pgclaim.schedule:"), kind: "given"})
	}

	// Advisory locks in this database, held or awaited. waitstart exists
	// from PostgreSQL 14 on; reading it through jsonb keeps older servers
	// working.
	rows, err = db.Query(ctx, `
SELECT l.classid::int8, l.objid::int8, l.objsubid::int4, l.pid, l.granted, l.mode,
       (to_jsonb(l) ->> 'waitstart')::timestamptz,
       a.application_name, coalesce(host(a.client_addr), CASE WHEN a.pid IS NOT NULL THEN 'local' END),
       a.backend_start
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
ORDER BY l.classid, l.objid, l.objsubid, l.granted DESC, l.pid`)
	if err != nil {
		return Locks{}, fail("reading pg_locks", err)
	}
	for rows.Next() {
		var classid, objid int64
		var subid int32
		var a Advisory
		if err := rows.Scan(&classid, &objid, &subid, &a.PID, &a.Granted, &a.Mode, &a.WaitStart,
			&a.ApplicationName, &a.ClientAddr, &a.BackendStart); err != nil {
			rows.Close()
			return Locks{}, fail("reading pg_locks", err)
		}
		a.Owner = "other"
		switch subid {
		case 2: // pg_advisory_lock(int4, int4)
			class, key := int32(uint32(classid)), int32(uint32(objid))
			a.Class, a.Key = &class, &key
			if class == gate.AdvisoryClass || class == gate.ElectionClass {
				a.Owner = "pgclaim"
				ks := known[[2]int32{class, key}]
				var ns, kinds []string
				for _, k := range ks {
					ns = append(ns, k.name)
					kinds = append(kinds, k.kind)
				}
				a.Name, a.Kind = strings.Join(ns, "|"), strings.Join(kinds, "|")
				if len(ks) == 1 && a.Granted {
					a.Holder, a.HeldSince = ks[0].holder, ks[0].since
				}
			}
		default: // pg_advisory_lock(int8)
			k := classid<<32 | objid
			a.BigintKey = &k
			if k == pgclaim.MigrationLockID {
				a.Owner, a.Name, a.Kind = "pgclaim", "pgclaim migrations", "migrations"
			}
		}
		out.Advisory = append(out.Advisory, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Locks{}, fail("reading pg_locks", err)
	}
	sort.SliceStable(out.Advisory, func(i, j int) bool {
		a, b := out.Advisory[i], out.Advisory[j]
		if ra, rb := advisoryRank(a), advisoryRank(b); ra != rb {
			return ra < rb
		}
		return a.Name < b.Name
	})

	return out, nil
}

// advisoryRank orders pgclaim's named locks first, then its unresolved ones,
// then locks pgclaim does not take.
func advisoryRank(a Advisory) int {
	switch {
	case a.Owner == "pgclaim" && a.Name != "":
		return 0
	case a.Owner == "pgclaim":
		return 1
	}
	return 2
}

// PastTerm is a term of an election, open or ended, as ReadTerms returns
// it.
type PastTerm struct {
	Election  string     `json:"election"`
	Fence     int64      `json:"fence"`
	Holder    string     `json:"holder"`
	Method    string     `json:"method"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
	EndReason *string    `json:"end_reason"`
}

// ReadTerms returns the newest limit terms of every election by start,
// newest first (served by pgclaim_terms_started_at_idx).
func ReadTerms(ctx context.Context, db DB, limit int) ([]PastTerm, error) {
	rows, err := db.Query(ctx, `
SELECT election, term, holder, method, started_at, ended_at, end_reason
FROM pgclaim_terms ORDER BY started_at DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fail("reading pgclaim_terms", err)
	}
	defer rows.Close()
	out := []PastTerm{}
	for rows.Next() {
		var t PastTerm
		if err := rows.Scan(&t.Election, &t.Fence, &t.Holder, &t.Method, &t.StartedAt, &t.EndedAt, &t.EndReason); err != nil {
			return nil, fail("reading pgclaim_terms", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fail("reading pgclaim_terms", err)
	}
	return out, nil
}
